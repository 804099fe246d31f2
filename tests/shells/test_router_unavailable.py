"""A deployment that failed to start: its routers answer at once, never queue until a timeout.

Found by the chaos suite (tests/chaos, "__init__ raises"): requests to a DEPLOY_FAILED
application waited in the proxy's queue until the client gave up.
"""

from __future__ import annotations

import random

import pytest

from surge.errors import DeploymentUnavailableError
from surge.model import ReplicaSet
from surge.router.router import Router
from tests.shells.test_router import (
    DEP,
    FakeReplica,
    answer,
    outcome,
    replica_set,
    request,
    run,
    sink,
)

REASON = "its replicas failed to start; serve.status() shows the error"


def failed_set() -> ReplicaSet:
    return ReplicaSet(DEP, (), max_ongoing_requests=5, queue_limit=100, unavailable=REASON)


def test_requests_waiting_for_a_deployment_that_fails_end_at_once() -> None:
    async def test() -> None:
        router = Router(DEP, rng=random.Random(1))
        router.update(replica_set([], max_ongoing=5, queue_limit=100))  # starting: queue
        waiting = request(b"early")
        router.submit(waiting)
        assert router.queued == 1 and not sink(waiting).done.done()
        router.update(failed_set())
        failure = await outcome(waiting)
        assert isinstance(failure, DeploymentUnavailableError)
        assert REASON in str(failure) and str(DEP) in str(failure)
        assert router.queued == 0
        with pytest.raises(DeploymentUnavailableError, match="failed to start"):
            router.submit(request(b"late"))
        assert router.queued == 0
        router.close()

    run(test)


def test_a_cancelled_request_is_not_failed_again() -> None:
    async def test() -> None:
        router = Router(DEP, rng=random.Random(1))
        router.update(replica_set([], max_ongoing=5, queue_limit=100))
        gone = request(b"gone")
        router.submit(gone)
        router.cancel(gone)
        router.update(failed_set())
        assert sink(gone).errors == []
        router.close()

    run(test)


def test_a_redeployed_deployment_serves_again() -> None:
    async def test() -> None:
        router = Router(DEP, rng=random.Random(1))
        router.update(failed_set())
        with pytest.raises(DeploymentUnavailableError):
            router.submit(request(b"while failed"))
        replica = FakeReplica("fixed")
        info = await replica.start()
        try:
            router.update(replica_set([info], max_ongoing=5, queue_limit=100))
            await router.ready.wait()
            served = request(b"after")
            router.submit(served)
            assert await answer(served) == b"fixed:after"
        finally:
            router.close()
            await replica.close()

    run(test)
