"""The controller's end of a control connection, in memory."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = ["FakePeer"]


class FakePeer:
    """Records what the controller pushes and calls. `answers[method]` is what a call
    returns: a value, an exception (raised), or a callable taking the call's kwargs."""

    def __init__(self, role: str = "", **info: Any) -> None:
        self.info: dict[str, Any] = {"role": role, **info} if role else dict(info)
        self.pushes: list[tuple[str, Any]] = []
        self.calls: list[tuple[str, dict[str, Any]]] = []
        self.answers: dict[str, Any] = {}
        self._closed = False

    def __repr__(self) -> str:
        return (f"<FakePeer {self.info.get('role', '?')} pushes={len(self.pushes)} "
                f"calls={len(self.calls)} closed={self._closed}>")

    @property
    def is_closed(self) -> bool:
        return self._closed

    async def call(self, method: str, timeout: float | None = None, **kwargs: Any) -> Any:
        if self._closed:
            raise ConnectionError(f"connection closed before calling {method}")
        self.calls.append((method, kwargs))
        answer = self.answers.get(method, True)
        if isinstance(answer, BaseException):
            raise answer
        if isinstance(answer, type) and issubclass(answer, BaseException):
            raise answer()
        if callable(answer):
            call: Callable[..., Any] = answer
            return call(**kwargs)
        return answer

    def push(self, topic: str, value: Any) -> None:
        self.pushes.append((topic, value))

    def pushed(self, topic: str) -> list[Any]:
        return [value for t, value in self.pushes if t == topic]

    def called(self, method: str) -> list[dict[str, Any]]:
        return [kwargs for m, kwargs in self.calls if m == method]

    def close(self) -> None:
        self._closed = True
