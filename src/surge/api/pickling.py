"""Pickling a deployment by value for its replicas (its class or function, its
constructor's arguments): cloudpickle, with a few reducers of surge's own for what
cloudpickle refuses and Ray Serve deploys, kept to this pickler (never registered
process-wide through copyreg):
- a thread lock (`threading.Lock`, `RLock`) pickles as a fresh unlocked one. FastAPI's
  `include_router` keeps one per included router, and a pydantic model defined in a
  function keeps the function's locals (clients and their locks among them);
- starlette's `State` pickles by its contents (by value it recurses when unpickled);
- a class keeps its `__qualname__` (cloudpickle rebuilds it under its bare name): a
  FastAPI ingress class defined in a function (`f.<locals>.Ingress`) finds its route
  methods (`f.<locals>.Ingress.get`) by that prefix in the replica (replica/ingress.py).
"""

from __future__ import annotations

import io
import threading
from collections import ChainMap
from collections.abc import Callable
from typing import Any

import cloudpickle

__all__ = ["pickle_by_value"]


def _fresh_lock(lock: Any) -> tuple[Any, tuple[()]]:
    return threading.Lock, ()


def _fresh_rlock(lock: Any) -> tuple[Any, tuple[()]]:
    return threading.RLock, ()


def _reducers() -> dict[type, Any]:
    reducers: dict[type, Any] = {type(threading.Lock()): _fresh_lock,
                                 type(threading.RLock()): _fresh_rlock}
    try:
        from starlette.datastructures import State
    except ImportError:  # pragma: no cover - starlette comes with surge
        return reducers
    reducers[State] = lambda state: (State, (dict(state._state),))
    return reducers


class _DeploymentPickler(cloudpickle.Pickler):  # type: ignore[misc]  # untyped
    dispatch_table = ChainMap(_reducers(), cloudpickle.Pickler.dispatch_table)

    def __init__(self, file: Any, substitute: Callable[[Any], Any] | None) -> None:
        super().__init__(file)
        self.substitute = substitute

    def reducer_override(self, obj: Any) -> Any:
        if self.substitute is not None:
            replacement = self.substitute(obj)
            if replacement is not None:
                return replacement.__reduce__()
        reduced = super().reducer_override(obj)
        if isinstance(obj, type) and _has_class_state(reduced):
            state, slots = reduced[2]
            reduced = (*reduced[:2], ({**state, "__qualname__": obj.__qualname__}, slots),
                       *reduced[3:])
        return reduced


def _has_class_state(reduced: Any) -> bool:
    """A class cloudpickle rebuilds by value: (make, args, (dict, slots), ...). It
    rebuilds the class under its bare `__name__`; the state keeps the full qualname."""
    return (isinstance(reduced, tuple) and len(reduced) > 2
            and isinstance(reduced[2], tuple) and len(reduced[2]) == 2
            and isinstance(reduced[2][0], dict))


def pickle_by_value(value: Any, substitute: Callable[[Any], Any] | None = None) -> bytes:
    """cloudpickle with surge's reducers (see the module docstring); `substitute(obj)`,
    when given, returns what travels in an object's place (None: the object itself),
    wherever it is inside `value` (e.g. a bound deployment inside a user's object)."""
    with io.BytesIO() as file:
        _DeploymentPickler(file, substitute).dump(value)
        return file.getvalue()
