"""`@serve.multiplexed` and `serve.get_multiplexed_model_id()`: many models per replica.

The decorated `async def` loader (a method taking `model_id`, or a function) becomes a
per-replica model cache, as in Ray Serve 2.60 (ray/serve/multiplex.py), without the
costs Ray's users hit:
- one load per model at a time (single flight): concurrent requests for a model await
  the same load, which runs in a task of its own, so a cancelled request does not abort
  it for the others; loads of *different* models run at once (Ray serialises them all
  behind one lock);
- at most `max_num_models_per_replica` models held or loading; to make room the least
  recently used loaded model is unloaded (its `__del__` runs, awaited when async); a
  load that has to wait for room (every slot loading) waits for a running load to
  finish, then takes that model's place;
- a failed load fails only the requests waiting for it, with the loader's error, and
  the next request for that model loads it again.
Each cache registers itself here, so the replica tells its routers which models it holds
or is loading whenever that changes (`watch`, `loaded_model_ids`; replica/server.py sends
them a `Models` frame) and unloads them all on a graceful stop (`shutdown_all`). Two
surge-only arguments tune the routers' affinity (policy/model_routing.py):
`max_replicas_per_model` (how many replicas one hot model may spread to; 0: half the
replicas, at least 2) and `matching_timeout_s` (how long a request waits for a replica
holding its model before any replica with room takes it).
Metrics carry Ray's names (`serve_multiplexed_*`, `serve_num_multiplexed_models`, ...).
"""

from __future__ import annotations

import asyncio
import collections
import functools
import inspect
import logging
import weakref
from collections.abc import Awaitable, Callable
from typing import Any, NamedTuple

from surge.clock import SYSTEM
from surge.replica.context import get_replica_context, request_context_var

__all__ = ["ModelCache", "RoutingSettings", "get_multiplexed_model_id", "has_caches",
           "loaded_model_ids", "multiplexed", "routing_settings", "shutdown_all", "watch"]

log = logging.getLogger("surge.replica")

WRAPPER_ATTRIBUTE = "__serve_multiplex_wrapper"
# Ray's MODEL_LOAD_LATENCY_BUCKETS_MS
LOAD_BUCKETS_MS = [10.0, 50.0, 100.0, 200.0, 500.0, 1000.0, 2000.0, 5000.0, 10000.0,
                   30000.0, 60000.0, 120000.0, 300000.0, 600000.0]

_caches: weakref.WeakSet[ModelCache] = weakref.WeakSet()
_watchers: list[Callable[[], None]] = []
MATCHING_TIMEOUT_S = 1.0


class RoutingSettings(NamedTuple):
    max_copies: int = 0  # 0: the router's default
    matching_timeout_s: float = MATCHING_TIMEOUT_S
    capacity: int = -1  # models held at most (-1: no limit)
    # An LLM server's model id: the proxy takes a request's model id from its JSON
    # body's `model` when that names one of its LoRA adapters (policy/llm_models.py).
    lora_base: str = ""


def watch(callback: Callable[[], None]) -> None:
    """Call `callback` (cheap, on the loop) whenever a model starts or stops loading or
    is unloaded."""
    _watchers.append(callback)


def _changed() -> None:
    for callback in _watchers:
        callback()


def get_multiplexed_model_id() -> str:
    """The model id of the current request ("" when none was given)."""
    return request_context_var.get().multiplexed_model_id


def multiplexed(func: Callable[..., Any] | None = None,
                max_num_models_per_replica: int = 3, *, max_replicas_per_model: int = 0,
                matching_timeout_s: float = MATCHING_TIMEOUT_S) -> Any:
    if func is not None:
        _check_loader(func)
    if not isinstance(max_num_models_per_replica, int) or \
            isinstance(max_num_models_per_replica, bool):
        raise TypeError("max_num_models_per_replica must be an integer.")
    if max_num_models_per_replica != -1 and max_num_models_per_replica <= 0:
        raise ValueError("max_num_models_per_replica must be positive.")
    if not isinstance(max_replicas_per_model, int) or max_replicas_per_model < 0:
        raise ValueError("max_replicas_per_model must be an integer >= 0 (0: half the "
                         "replicas, at least 2).")
    if not isinstance(matching_timeout_s, int | float) or not matching_timeout_s >= 0:
        raise ValueError("matching_timeout_s must be a number of seconds >= 0.")
    settings = RoutingSettings(max_replicas_per_model, float(matching_timeout_s),
                               max_num_models_per_replica)

    def decorator(loader: Callable[..., Any]) -> Callable[..., Awaitable[Any]]:
        _check_loader(loader)
        is_method = len(inspect.signature(loader).parameters) == 2

        @functools.wraps(loader)
        async def load(*args: Any) -> Any:
            expected = 2 if is_method else 1
            if len(args) != expected:
                raise TypeError("Functions decorated with `@serve.multiplexed` must take "
                                "exactly one argument, the multiplexed model ID (str), but "
                                f"got {len(args) - (expected - 1)}.")
            owner: Any = args[0] if is_method else load
            cache = getattr(owner, WRAPPER_ATTRIBUTE, None)
            if cache is None:
                _check_in_replica()
                bound = functools.partial(loader, owner) if is_method else loader
                cache = ModelCache(bound, max_num_models_per_replica, settings)
                setattr(owner, WRAPPER_ATTRIBUTE, cache)
            return await cache.get(args[-1])

        load.__serve_multiplexed__ = True  # type: ignore[attr-defined]
        return load

    return decorator(func) if callable(func) else decorator


def _check_in_replica() -> None:
    try:
        get_replica_context()
    except Exception:
        raise RuntimeError("`@serve.multiplexed` can only be used within a deployment "
                           "(failed to retrieve Serve replica context).") from None


def _check_loader(func: Any) -> None:
    if not callable(func):
        raise TypeError("The `multiplexed` decorator must be used with a function or method.")
    if not inspect.iscoroutinefunction(func):
        raise TypeError("@serve.multiplexed can only be used to decorate async functions or "
                        "methods.")
    parameters = inspect.signature(func).parameters
    if len(parameters) == 0 or len(parameters) > 2:
        raise TypeError("@serve.multiplexed can only be used to decorate functions or "
                        "methods with at least one 'model_id: str' argument.")


class ModelCache:
    """One replica's models for one loader: held (LRU order) and loading.

    `unload` (surge-internal; LLM adapters use it) replaces the model's `__del__` on
    eviction: it is awaited with the model's id and object."""

    def __init__(self, loader: Callable[[str], Awaitable[Any]], capacity: int,
                 settings: RoutingSettings | None = None,
                 unload: Callable[[str, Any], Awaitable[None]] | None = None) -> None:
        self.loader = loader
        self.unload = unload
        self.capacity = capacity  # -1: unlimited
        self.settings = settings or RoutingSettings()
        self.models: collections.OrderedDict[str, Any] = collections.OrderedDict()
        self.loading: dict[str, asyncio.Task[Any]] = {}  # waiting for room or loading
        self.active: set[str] = set()  # their loader running
        self._metrics = _Metrics()
        _caches.add(self)

    def __repr__(self) -> str:
        return (f"<ModelCache held={list(self.models)} loading={list(self.loading)} "
                f"capacity={self.capacity}>")

    def model_ids(self) -> list[str]:
        return [*self.models, *(m for m in self.loading if m not in self.models)]

    async def get(self, model_id: str) -> Any:
        if not isinstance(model_id, str):
            raise TypeError("The model ID must be a string.")
        if not model_id:
            raise ValueError("The model ID cannot be empty.")
        self._metrics.requests.inc()
        if model_id in self.models:
            self.models.move_to_end(model_id)
            return self.models[model_id]
        task = self.loading.get(model_id)
        if task is None:
            task = self.loading[model_id] = asyncio.get_running_loop().create_task(
                self._load(model_id))
            task.add_done_callback(_retrieved)  # its waiters may all have gone
            _changed()
        return await asyncio.shield(task)

    async def _load(self, model_id: str) -> Any:
        try:
            await self._make_room(model_id)
            self.active.add(model_id)
            self._metrics.loads.inc()
            started = SYSTEM.monotonic()
            model = await self.loader(model_id)
        except BaseException as exc:
            log.error("failed to load model %r: %r", model_id, exc)
            self.loading.pop(model_id, None)
            self.active.discard(model_id)
            _changed()
            raise
        self.loading.pop(model_id, None)
        self.active.discard(model_id)
        self._metrics.load_ms.observe((SYSTEM.monotonic() - started) * 1000.0)
        self.models[model_id] = model
        self._metrics.held(self.models)
        _changed()
        return model

    async def _make_room(self, model_id: str) -> None:
        """Until this load fits beside the held models and the loads running: unload the
        LRU model, or wait for a running load to finish (loads waiting for room never
        wait on each other)."""
        while self.capacity > 0 and len(self.models) + len(self.active) >= self.capacity:
            if self.models:
                await self.unload_lru()
                continue
            running = [self.loading[m] for m in self.active if m in self.loading]
            if not running:
                return
            await asyncio.wait(running, return_when=asyncio.FIRST_COMPLETED)

    async def unload_lru(self) -> None:
        model_id, model = self.models.popitem(last=False)
        _changed()
        self._metrics.unloads.inc()
        started = SYSTEM.monotonic()
        destructor = None if self.unload is not None else getattr(model, "__del__", None)
        try:
            if self.unload is not None:
                await self.unload(model_id, model)
            elif destructor is not None:
                if inspect.iscoroutinefunction(destructor):
                    await destructor()
                else:
                    await asyncio.get_running_loop().run_in_executor(None, destructor)
        except Exception:
            log.exception("unloading model %r raised", model_id)
        if destructor is not None:
            _disarm(model)
        self._metrics.unload_ms.observe((SYSTEM.monotonic() - started) * 1000.0)
        self._metrics.held(self.models, unloaded=model_id)

    async def shutdown(self) -> None:
        for task in list(self.loading.values()):
            task.cancel()
        while self.models:
            await self.unload_lru()


_DISARMED: dict[type, type] = {}


def _disarm(model: Any) -> None:
    """Its `__del__` ran on unload: the garbage collector must not run it again (a
    second release of a GPU buffer fails). Its class becomes a subclass whose `__del__`
    does nothing; objects whose class cannot change keep theirs."""
    cls = type(model)
    quiet = _DISARMED.get(cls)
    if quiet is None:
        try:
            quiet = _DISARMED[cls] = type(cls.__name__, (cls,),
                                          {"__slots__": (), "__del__": _no_op,
                                           "__module__": cls.__module__,
                                           "__qualname__": cls.__qualname__})
        except TypeError:
            return
    try:
        model.__class__ = quiet
    except TypeError:
        pass


def _no_op(self: Any) -> None:
    pass


def _retrieved(task: asyncio.Task[Any]) -> None:
    if not task.cancelled():
        task.exception()


def loaded_model_ids() -> list[str]:
    """Every model this replica holds or is loading, for routing affinity."""
    return sorted({m for cache in list(_caches) for m in cache.model_ids()})


def has_caches() -> bool:
    """Whether this replica has a multiplexed loader (it tells its routers even before
    the first model loads)."""
    return bool(list(_caches))


def routing_settings() -> RoutingSettings:
    """The affinity settings of this replica's loaders (the tightest, if several)."""
    caches = list(_caches)
    if not caches:
        return RoutingSettings()
    copies = [c.settings.max_copies for c in caches if c.settings.max_copies]
    capacities = [c.capacity for c in caches]
    return RoutingSettings(min(copies) if copies else 0,
                           min(c.settings.matching_timeout_s for c in caches),
                           -1 if -1 in capacities else sum(capacities),
                           next((c.settings.lora_base for c in caches
                                 if c.settings.lora_base), ""))


async def shutdown_all() -> None:
    """On a graceful stop: unload every model (their `__del__` runs)."""
    for cache in list(_caches):
        try:
            await cache.shutdown()
        except Exception:
            log.exception("unloading the multiplexed models raised")


class _Metrics:
    """Ray's multiplexing metrics, recorded as `serve.metrics` from the replica."""

    def __init__(self) -> None:
        from surge.replica.metrics import Counter, Gauge, Histogram

        self.load_ms = Histogram("serve_multiplexed_model_load_latency_ms",
                                 description="The time it takes to load a model.",
                                 boundaries=LOAD_BUCKETS_MS)
        self.unload_ms = Histogram("serve_multiplexed_model_unload_latency_ms",
                                   description="The time it takes to unload a model.",
                                   boundaries=LOAD_BUCKETS_MS)
        self.count = Gauge("serve_num_multiplexed_models",
                           description="The number of models loaded on the current replica.")
        self.registered = Gauge("serve_registered_multiplexed_model_id",
                                description="The model id registered on the current replica.",
                                tag_keys=("model_id",))
        self.requests = Counter("serve_multiplexed_get_model_requests_counter",
                                description="The counter for get model requests on the "
                                            "current replica.")
        self.unloads = Counter("serve_multiplexed_models_unload_counter",
                               description="The counter for unloaded models on the current "
                                           "replica.")
        self.loads = Counter("serve_multiplexed_models_load_counter",
                             description="The counter for loaded models on the current "
                                         "replica.")

    def held(self, models: collections.OrderedDict[str, Any], unloaded: str = "") -> None:
        self.count.set(len(models))
        for model_id in models:
            self.registered.set(1, tags={"model_id": model_id})
        if unloaded:
            self.registered.set(0, tags={"model_id": unloaded})
