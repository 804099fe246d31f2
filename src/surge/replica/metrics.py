"""`serve.metrics`: Ray Serve's user metrics, Counter, Gauge and Histogram.

They take Ray's arguments and raise Ray's errors, in Ray's order (ray/util/metrics.py
`Metric`, ray/serve/metrics.py). Made inside a replica, a metric gets Ray's default
tags `deployment`, `replica` and `application` (names the user may not declare), and a
declared `route` tag takes the HTTP route of the request being served unless the call
passes one. Values go to the process's registry (surge.observability.user_metrics),
which the replica ships to the controller with its telemetry. Made outside a replica
(a driver), a metric has no default tags and records locally, never exported.

Where surge departs from Ray: undeclared tag keys passed to a record are dropped with
one warning (Ray's Python layer lets them through); histogram boundaries must increase
(Ray's exporter refuses such a histogram later, in its agent's log); `tags=None` with a
declared `route` does not raise; `set_default_tags` returns the metric (Ray's serve
classes return None); a name used before with other tag keys, or one of Ray Serve's
own metric names, records nothing, with a warning.
"""

from __future__ import annotations

import logging
import re
import warnings
from collections.abc import Mapping, Sequence
from itertools import pairwise
from typing import Any, ClassVar, Self

from surge.errors import RayServeException
from surge.observability.user_metrics import (
    COUNTER,
    GAUGE,
    HISTOGRAM,
    REGISTRY,
    RESERVED_NAMES,
    Family,
    MetricInfo,
)
from surge.replica.context import ReplicaContext, get_replica_context, request_context_var

__all__ = ["Counter", "Gauge", "Histogram"]

log = logging.getLogger("surge.metrics")

DEPLOYMENT_TAG, REPLICA_TAG, APPLICATION_TAG, ROUTE_TAG = (
    "deployment", "replica", "application", "route")
RESERVED_TAGS = (DEPLOYMENT_TAG, REPLICA_TAG, APPLICATION_TAG)
# Prometheus' metric name rule, as Ray checks it (ray/util/metrics.py).
_VALID_NAME = re.compile(r"^[a-zA-Z_:][a-zA-Z0-9_:]*$")


def _replica_context() -> ReplicaContext | None:
    try:
        return get_replica_context()
    except RayServeException:
        return None


def _refuse_reserved(keys: Sequence[Any]) -> None:
    for tag in RESERVED_TAGS:
        if tag in keys:
            raise ValueError(f"'{tag}' tag is reserved for Ray Serve metrics")


def _serve_tags(context: ReplicaContext | None) -> dict[str, str]:
    """Ray's default tags inside a replica (application only when it has a name)."""
    if context is None:
        return {}
    tags = {DEPLOYMENT_TAG: context.deployment, REPLICA_TAG: context.replica_tag}
    if context.app_name:
        tags[APPLICATION_TAG] = context.app_name
    return tags


def _check_value(value: Any) -> None:
    if not isinstance(value, int | float):
        raise TypeError(f"value must be int or float, got {type(value)}.")


class _Metric:
    _kind: ClassVar[str]

    def __init__(self, name: str, description: str = "",
                 tag_keys: tuple[str, ...] | None = None) -> None:
        if tag_keys and not isinstance(tag_keys, tuple):
            raise TypeError(f"tag_keys should be a tuple type, got: {type(tag_keys)}")
        context = _replica_context()
        serve_tags = _serve_tags(context)
        if context is not None:
            _refuse_reserved(tag_keys or ())
        keys = tuple(dict.fromkeys((*serve_tags, *(tag_keys or ()))))  # each key once
        if len(name) == 0:
            raise ValueError("Empty name is not allowed. Please provide a metric name.")
        self._discard = not _VALID_NAME.match(name)
        if self._discard:
            warnings.warn(f"Invalid metric name: {name}. Metric will be discarded and data "
                          "will not be collected or published. Metric names can only contain "
                          "letters, numbers, _, and :. Metric names cannot start with numbers.",
                          UserWarning, stacklevel=3)
        for key in keys:
            if not isinstance(key, str):
                raise TypeError(f"Tag keys must be str, got {type(key)}.")
        if ":" in name:
            warnings.warn(f"Metric name {name} contains a : character, which is no longer "
                          "allowed. Please migrate to the new metric name format. This will be "
                          "an error in the future.", FutureWarning, stacklevel=3)
        self._name, self._description = name, description
        self._tag_keys: tuple[str, ...] = keys
        self._user_tag_keys = tuple(tag_keys or ())
        self._boundaries: tuple[float, ...] = ()
        self._in_replica = context is not None
        self._serve_tags = serve_tags
        self._default_tags: dict[str, str] = dict(serve_tags)
        self._order = tuple(sorted(keys))
        self._undeclared_warned = False
        self._family: Family | None = None

    def _register(self) -> None:
        if self._discard:
            return
        if self._name in RESERVED_NAMES:
            log.warning("metric %s: the name is one of Ray Serve's own metrics; it records "
                        "nothing", self._name)
            return
        self._family = REGISTRY.define(MetricInfo(self._name, self._kind, self._description,
                                                  self._order, self._boundaries))

    def __repr__(self) -> str:
        return (f"<{type(self).__name__} {self._name} tag_keys={self._tag_keys} "
                f"default_tags={self._default_tags}>")

    def __reduce__(self) -> tuple[Any, ...]:
        # As Ray: a metric travels as its definition; default tags stay behind.
        return type(self), self._arguments()

    def _arguments(self) -> tuple[Any, ...]:
        return self._name, self._description, self._user_tag_keys or None

    @property
    def info(self) -> dict[str, Any]:
        return {"name": self._name, "description": self._description,
                "tag_keys": self._tag_keys, "default_tags": dict(self._default_tags)}

    def set_default_tags(self, default_tags: dict[str, str]) -> Self:
        """Tags used by every record unless the call passes them; returns the metric."""
        if self._in_replica:
            _refuse_reserved(list(default_tags))
        for key, value in default_tags.items():
            if key not in self._tag_keys:
                raise ValueError(f"Unrecognized tag key {key}.")
            if not isinstance(value, str):
                raise TypeError(f"Tag values must be str, got {type(value)}.")
        self._default_tags = {**self._serve_tags, **default_tags}
        return self

    def _with_route(self, tags: Mapping[str, str] | None) -> Mapping[str, str] | None:
        if ROUTE_TAG in self._tag_keys and (tags is None or ROUTE_TAG not in tags):
            return {**(tags or {}), ROUTE_TAG: request_context_var.get().route}
        return tags

    def _record(self, value: float, tags: Mapping[str, str] | None) -> None:
        if self._discard:
            return
        if tags:
            for tag_value in tags.values():
                if not isinstance(tag_value, str):
                    raise TypeError(f"Tag values must be str, got {type(tag_value)}.")
            final = {**self._default_tags, **tags}
        else:
            final = self._default_tags
        missing = [key for key in self._tag_keys if key not in final]
        if missing:
            raise ValueError(f"Missing value for tag key(s): {','.join(missing)}.")
        if tags and not self._undeclared_warned and len(final) > len(self._tag_keys):
            self._undeclared_warned = True
            log.warning("metric %s: tags %s are not in its tag_keys %s; they are dropped",
                        self._name, sorted(set(final) - set(self._tag_keys)), self._tag_keys)
        family = self._family
        if family is not None:
            labels = tuple([final[key] for key in self._order])
            with REGISTRY.lock:
                family.record(labels, value)


class Counter(_Metric):
    """A cumulative metric that only goes up; exported as `ray_<name>_total`.

    Inside a replica it is tagged with `deployment`, `replica` and `application`.
    """

    _kind = COUNTER

    def __init__(self, name: str, description: str = "",
                 tag_keys: tuple[str, ...] | None = None) -> None:
        super().__init__(name, description, tag_keys)
        self._register()

    def inc(self, value: int | float = 1.0, tags: dict[str, str] | None = None) -> None:
        """Add `value` (> 0, default 1); `tags` override the default tags."""
        resolved = self._with_route(tags)
        _check_value(value)
        if value <= 0:
            raise ValueError(f"value must be >0, got {value}")
        self._record(value, resolved)


class Gauge(_Metric):
    """The last value set, per label set (and per replica); exported as `ray_<name>`."""

    _kind = GAUGE

    def __init__(self, name: str, description: str = "",
                 tag_keys: tuple[str, ...] | None = None) -> None:
        super().__init__(name, description, tag_keys)
        self._register()

    def set(self, value: int | float | None, tags: dict[str, str] | None = None) -> None:
        """Set the gauge to `value` (None: do nothing, as Ray)."""
        resolved = self._with_route(tags)
        if value is None:
            return
        _check_value(value)
        self._record(value, resolved)


class Histogram(_Metric):
    """Counts of values per bucket, and their sum; exported as `ray_<name>_bucket`,
    `_sum` and `_count`, one bucket per boundary (`le`) and `+Inf`."""

    _kind = HISTOGRAM

    def __init__(self, name: str, description: str = "",
                 boundaries: Sequence[float] | None = None,
                 tag_keys: tuple[str, ...] | None = None) -> None:
        super().__init__(name, description, tag_keys)
        if boundaries is None or len(boundaries) == 0:
            raise ValueError("boundaries argument should be provided when using the "
                             "Histogram class. e.g., Histogram(\"name\", boundaries=[1.0, "
                             "2.0])")
        for index, boundary in enumerate(boundaries):
            if boundary <= 0:
                raise ValueError(f"Invalid `boundaries` argument at index {index}, "
                                 f"{boundaries}. Use positive values for the arguments.")
        if any(b <= a for a, b in pairwise(boundaries)):
            raise ValueError(f"Invalid `boundaries` argument {boundaries}: they must "
                             "increase (Prometheus buckets are sorted).")
        self.boundaries = list(boundaries)
        self._boundaries = tuple(float(b) for b in boundaries)
        self._register()

    def _arguments(self) -> tuple[Any, ...]:
        return self._name, self._description, self.boundaries, self._user_tag_keys or None

    @property
    def info(self) -> dict[str, Any]:
        return {**super().info, "boundaries": self.boundaries}

    def observe(self, value: int | float, tags: dict[str, str] | None = None) -> None:
        """Count `value` in its bucket."""
        resolved = self._with_route(tags)
        _check_value(value)
        self._record(value, resolved)
