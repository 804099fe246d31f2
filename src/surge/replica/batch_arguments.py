"""`@serve.batch`'s arguments: each call's bound by name, a batch's one list per argument.

Binding to the function's signature makes `f(x)` and `f(x=x)` the same call; a call's
shape (which arguments it passed, how many `*args`, which `**kwargs` keys) keeps apart
the calls that cannot share a batch. A batch calls the function once with a list per
argument, one entry per call, in arrival order (`*args` a list per position, `**kwargs`
a list per key), and must return (or yield) one result per call.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Hashable
from typing import Any

from surge.errors import RayServeException

__all__ = ["BatchSignature", "per_call_results"]

_VAR_POSITIONAL = inspect.Parameter.VAR_POSITIONAL
_VAR_KEYWORD = inspect.Parameter.VAR_KEYWORD


class BatchSignature:
    """A call's arguments bound by name, and a batch's: one list per argument."""

    def __init__(self, func: Callable[..., Any]) -> None:
        self.signature = inspect.signature(func)
        self.kinds = {name: p.kind for name, p in self.signature.parameters.items()}
        self.first = next(iter(self.kinds), "")

    def bind(self, args: tuple[Any, ...], kwargs: dict[str, Any],
             method: bool) -> tuple[dict[str, Any], Hashable]:
        """The call's arguments (without `self`) and its shape: which ones it passed."""
        try:
            arguments = dict(self.signature.bind(*args, **kwargs).arguments)
        except TypeError as exc:  # Ray's message, without bind's traceback
            raise TypeError(str(exc)) from None
        if method:
            del arguments[self.first]
        return arguments, tuple(self._shape(name, value) for name, value in arguments.items())

    def first_item(self, arguments: dict[str, Any]) -> Any:
        """What `batch_size_fn` measures: the call's first argument (Ray: its first
        positional one)."""
        for name, value in arguments.items():
            if self.kinds[name] is _VAR_POSITIONAL or self.kinds[name] is _VAR_KEYWORD:
                entries = list(value.values() if isinstance(value, dict) else value)
                if not entries:
                    continue
                return entries[0]
            return value
        return None

    def _shape(self, name: str, value: Any) -> Hashable:
        if self.kinds[name] is _VAR_POSITIONAL:
            return name, len(value)
        if self.kinds[name] is _VAR_KEYWORD:
            return name, tuple(sorted(value))
        return name

    def batched(self, owner: Any, calls: list[dict[str, Any]]) -> tuple[tuple[Any, ...],
                                                                          dict[str, Any]]:
        """Positional and keyword arguments for one call of the function with `calls`."""
        columns: dict[str, Any] = {} if owner is None else {self.first: owner}
        for name, value in calls[0].items():  # every call in a batch has the same shape
            if self.kinds[name] is _VAR_POSITIONAL:
                columns[name] = tuple([c[name][i] for c in calls] for i in range(len(value)))
            elif self.kinds[name] is _VAR_KEYWORD:
                columns[name] = {key: [c[name][key] for c in calls] for key in value}
            else:
                columns[name] = [c[name] for c in calls]
        bound = inspect.BoundArguments(self.signature, columns)
        return bound.args, bound.kwargs


def per_call_results(results: Any, expected: int) -> list[Any]:
    try:
        length = len(results)
    except TypeError:
        raise TypeError("a @serve.batch function must return (or yield) a list with one "
                        f"result per call, got {type(results).__name__}") from None
    if length != expected:
        raise RayServeException(
            "Batched function doesn't preserve batch size. The input list has length "
            f"{expected} but the returned list has length {length}.")
    return list(results)
