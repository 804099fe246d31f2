"""One surge instance for the whole fuzz package, with short limits and a steady client.

Applications: /echo (body length), /json (FastAPI with a pydantic model) and /locked
(the echo behind a bearer token). The surge processes' PIDs are taken once everything
runs; every test checks they are all still alive.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from surge import serve
from surge.serve.config import AuthConfig
from tests.e2e.conftest import running_instance
from tests.e2e.procs import surge_processes
from tests.fuzz.apps import Echo, JsonApi
from tests.fuzz.harness import LIMITS, TALLY, TOKEN, Steady


@dataclass
class Target:
    port: int
    control_address: str
    pids: dict[int, str]  # pid -> process title, taken after start
    steady: Steady


@pytest.fixture(scope="package")
def target() -> Iterator[Target]:
    with running_instance(**LIMITS) as running:
        serve.run(Echo.bind(), name="echo", route_prefix="/echo")
        serve.run(JsonApi.bind(), name="json", route_prefix="/json")
        serve.run(Echo.options(name="Locked").bind(), name="locked", route_prefix="/locked",
                  auth=AuthConfig(tokens=[TOKEN]))
        pids = surge_processes(os.getpid())
        steady = Steady(running.url).start()
        try:
            yield Target(running.http_port, running.control_address, pids, steady)
        finally:
            steady.stop()
            TALLY.write(steady, pids)
