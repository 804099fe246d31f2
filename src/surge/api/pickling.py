"""Pickling a deployment by value for its replicas (its class or function, its
constructor's arguments): cloudpickle, with a few reducers of surge's own for what
cloudpickle refuses and Ray Serve deploys, kept to this pickler (never registered
process-wide through copyreg):
- a thread lock (`threading.Lock`, `RLock`) in a `serve.ingress` deployment (its class,
  its app, its arguments) pickles as a fresh unlocked one. FastAPI's `include_router`
  keeps one per included router, and a pydantic model defined in a function keeps the
  function's locals (clients and their locks among them). Anywhere else a lock is
  refused, as Ray 2.60 refuses it until a `serve.ingress(app)` ran in the process: a
  lock the user meant to share between replicas would silently be one per replica;
- starlette's `State` pickles by its contents (by value it recurses when unpickled);
- a class keeps its `__qualname__` (cloudpickle rebuilds it under its bare name): a
  FastAPI ingress class defined in a function (`f.<locals>.Ingress`) finds its route
  methods (`f.<locals>.Ingress.get`) by that prefix in the replica (replica/ingress.py).

What cannot travel raises `SerializationError` (a TypeError, as Ray's), naming the
variable inside the value that failed (`D.hello -> lock`), found by pickling the value's
parts one by one (`_parts`: a class's attributes, a function's globals and closure, a
container's items, an object's attributes).
"""

from __future__ import annotations

import inspect
import io
import pickle
import threading
import types
from collections import ChainMap
from collections.abc import Callable, Iterator
from typing import Any

import cloudpickle

__all__ = ["SerializationError", "pickle_by_value", "serialize"]

# How deep the search for the variable that failed goes (a class, its method, the
# method's global, that object's attribute, ...): deep enough to name the culprit.
_SEARCH_DEPTH = 6


class SerializationError(TypeError):
    """A deployment, or its constructor's arguments, cannot travel to its replicas."""


def _fresh_lock(lock: Any) -> tuple[Any, tuple[()]]:
    return threading.Lock, ()


def _fresh_rlock(lock: Any) -> tuple[Any, tuple[()]]:
    return threading.RLock, ()


def _reducers(fresh_locks: bool) -> dict[type, Any]:
    reducers: dict[type, Any] = {}
    if fresh_locks:
        reducers = {type(threading.Lock()): _fresh_lock, type(threading.RLock()): _fresh_rlock}
    try:
        from starlette.datastructures import State
    except ImportError:  # pragma: no cover - starlette comes with surge
        return reducers
    reducers[State] = lambda state: (State, (dict(state._state),))
    return reducers


class _DeploymentPickler(cloudpickle.Pickler):  # type: ignore[misc]  # untyped
    dispatch_table = ChainMap(_reducers(fresh_locks=False), cloudpickle.Pickler.dispatch_table)

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


class _IngressPickler(_DeploymentPickler):
    dispatch_table = ChainMap(_reducers(fresh_locks=True), cloudpickle.Pickler.dispatch_table)


def pickle_by_value(value: Any, substitute: Callable[[Any], Any] | None = None, *,
                    fresh_locks: bool = True) -> bytes:
    """cloudpickle with surge's reducers (see the module docstring); `substitute(obj)`,
    when given, returns what travels in an object's place (None: the object itself),
    wherever it is inside `value` (e.g. a bound deployment inside a user's object).
    `fresh_locks=False` refuses thread locks as plain cloudpickle does."""
    pickler = _IngressPickler if fresh_locks else _DeploymentPickler
    with io.BytesIO() as file:
        pickler(file, substitute).dump(value)
        return file.getvalue()


def serialize(value: Any, what: str, substitute: Callable[[Any], Any] | None = None, *,
              fresh_locks: bool) -> bytes:
    """`pickle_by_value`, or SerializationError("Could not serialize {what}: ...") naming
    the variable inside `value` that cannot travel (Ray's opening words)."""
    try:
        return pickle_by_value(value, substitute, fresh_locks=fresh_locks)
    except SerializationError:
        raise  # a deployment bound in the arguments failed: its own message says which
    except (TypeError, AttributeError, pickle.PicklingError) as exc:
        path, culprit = _find_culprit(value, fresh_locks)
        named = " -> ".join(path) or repr(value)
        raise SerializationError(
            f"Could not serialize {what}: {exc}.\nVariable {named} "
            f"({type(culprit).__module__}.{type(culprit).__qualname__}) was found to be "
            "non-serializable. A deployment and its arguments travel to each replica by "
            "value: create such an object inside the replica (in __init__), not around "
            "it.") from exc


def _fails(value: Any, fresh_locks: bool) -> bool:
    try:
        pickle_by_value(value, fresh_locks=fresh_locks)
    except Exception:
        return True
    return False


def _find_culprit(value: Any, fresh_locks: bool) -> tuple[tuple[str, ...], Any]:
    """The path to the innermost part of `value` that fails to pickle, and that part."""
    path: tuple[str, ...] = ()
    seen = {id(value)}
    for _ in range(_SEARCH_DEPTH):
        failing = next(((name, part) for name, part in _parts(value)
                        if id(part) not in seen and _fails(part, fresh_locks)), None)
        if failing is None:
            break
        path, value = (*path, failing[0]), failing[1]
        seen.add(id(value))
    return path, value


def _parts(value: Any) -> Iterator[tuple[str, Any]]:
    """The named pieces pickling `value` pickles in turn."""
    if isinstance(value, (staticmethod, classmethod, types.MethodType)):
        value = value.__func__
    if isinstance(value, type):
        yield from ((f"{value.__name__}.{k}", v) for k, v in vars(value).items()
                    if not (k.startswith("__") and k.endswith("__")))
    elif inspect.isfunction(value):
        yield from _function_parts(value)
    elif isinstance(value, (list, tuple, set, frozenset)):
        yield from ((f"[{index}]", item) for index, item in enumerate(value))
    elif isinstance(value, dict):
        yield from ((f"[{key!r}]", item) for key, item in value.items())
    elif hasattr(value, "__dict__"):
        yield from vars(value).items()


def _function_parts(func: types.FunctionType) -> Iterator[tuple[str, Any]]:
    names: set[str] = set()
    codes = [func.__code__]
    while codes:  # a nested function's or comprehension's globals count too
        code = codes.pop()
        names.update(code.co_names)
        codes.extend(c for c in code.co_consts if isinstance(c, types.CodeType))
    yield from ((name, func.__globals__[name]) for name in sorted(names)
                if name in func.__globals__)
    for name, cell in zip(func.__code__.co_freevars, func.__closure__ or (), strict=False):
        try:
            yield name, cell.cell_contents
        except ValueError:  # an empty cell (a name not yet assigned)
            continue
