"""Handle options as Ray 2.60 has them: `session_id` reaches the callee's request context
(and `x-session-id` an HTTP request's), `handle._method` calls a `_`-prefixed method
(Ray refuses neither; only dunder names are not methods to call), a method named like an
option (`stream`, `method_name`, ...) is called like any other, and `shutdown()` /
`shutdown_async()` leave the handle working."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from surge import serve
from surge.serve.context import _get_serve_request_context
from tests.e2e.conftest import Running, running_instance

pytestmark = pytest.mark.e2e


@serve.deployment
class Sessions:
    def __call__(self, request: Any) -> dict[str, str]:
        return {"session_id": _get_serve_request_context().session_id}

    def session(self) -> str:
        return _get_serve_request_context().session_id

    def _private(self) -> str:
        return "private"


@serve.deployment
class Clashes:
    """Methods named as the handle's options are: in Ray the deployment's method wins."""

    def stream(self, n: int) -> Iterator[int]:
        yield from range(n)

    def method_name(self) -> str:
        return "method_name"

    def multiplexed_model_id(self) -> str:
        return "multiplexed_model_id"

    def session_id(self) -> str:
        return "session_id"


@pytest.fixture(scope="module")
def instance() -> Iterator[Running]:
    with running_instance() as running:
        serve.run(Sessions.bind(), name="sessions", route_prefix="/sessions")
        serve.run(Clashes.bind(), name="clashes", route_prefix=None)
        yield running


def test_session_id_reaches_the_request_context(instance: Running) -> None:
    handle = serve.get_app_handle("sessions")
    assert handle.session.remote().result(timeout_s=15) == ""
    sticky = handle.options(session_id="user-42")
    assert sticky.session.remote().result(timeout_s=15) == "user-42"
    assert sticky.options(method_name="session").remote().result(timeout_s=15) == "user-42"
    answer = httpx.get(f"{instance.url}/sessions", headers={"x-session-id": "s-7"}, timeout=15)
    assert answer.json() == {"session_id": "s-7"}


def test_an_underscore_method_is_callable_as_in_ray(instance: Running) -> None:
    handle = serve.get_app_handle("sessions")
    assert handle._private.remote().result(timeout_s=15) == "private"
    with pytest.raises(AttributeError):
        handle.__private_dunder__  # noqa: B018 - Python's protocols are not methods


def test_a_method_named_like_an_option_is_called(instance: Running) -> None:
    handle = serve.get_app_handle("clashes")
    assert list(handle.options(stream=True).stream.remote(3)) == [0, 1, 2]
    for name in ("method_name", "multiplexed_model_id", "session_id"):
        assert getattr(handle, name).remote().result(timeout_s=15) == name
    # the options themselves are one record (Ray's name), kept off the method namespace
    assert handle.options(stream=True).handle_options.stream is True
    assert handle.handle_options.method_name == "__call__"


def test_shutdown_leaves_the_handle_and_others_working(instance: Running) -> None:
    handle = serve.get_app_handle("sessions")
    assert handle.session.remote().result(timeout_s=15) == ""
    handle.shutdown()
    assert handle.session.remote().result(timeout_s=15) == ""
    assert serve.get_app_handle("sessions")._private.remote().result(timeout_s=15) == "private"

    async def main() -> str:
        assert await handle.session.remote() == ""
        await handle.shutdown_async()
        return str(await handle.session.remote())

    assert asyncio.run(main()) == ""
