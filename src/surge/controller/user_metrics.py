"""The replicas' `serve.metrics`, added up at the controller for /metrics.

Each telemetry report carries, per metric, what one replica recorded since its last
report. Counters add up per label set and histograms merge per label set (replicas
that share a label set share a series, as in Ray's exporter); a gauge keeps the last
value set per label set, which inside a replica includes its `replica` tag. Every
series remembers the replicas that fed it: when they are gone (the observer says when,
after the last scrape it keeps them for) the series goes; gauges go as soon as their
replica stops. One metric holds at most MAX_SERIES_PER_METRIC label sets here too (all
replicas together) and there are at most MAX_METRICS of them; beyond, the controller
drops with one warning per metric. The first definition of a name holds until all its
series are gone; reports of the name with other tag keys, kind or boundaries are
dropped meanwhile (a rollout that changes them shows the new ones once the old
replicas' series have left).
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Mapping

from surge.observability.user_metrics import (
    COUNTER,
    GAUGE,
    MAX_METRICS,
    MAX_SERIES_PER_METRIC,
    Buckets,
    Labels,
    MetricInfo,
    UserReport,
    Value,
)

__all__ = ["UserFamily", "UserMetrics"]

log = logging.getLogger("surge.metrics")


class UserFamily:
    """One metric at the controller: its series and the replicas that fed each."""

    __slots__ = ("_warned", "info", "sources", "values")

    def __init__(self, info: MetricInfo) -> None:
        self.info = info
        self.values: dict[Labels, Value] = {}
        self.sources: dict[Labels, set[str]] = {}
        self._warned = False

    def __repr__(self) -> str:
        return f"<UserFamily {self.info.kind} {self.info.name} series={len(self.values)}>"

    def add(self, source: str, values: Mapping[Labels, Value]) -> None:
        kind = self.info.kind
        for labels, value in values.items():
            current = self.values.get(labels)
            if current is None:
                if len(self.values) >= MAX_SERIES_PER_METRIC:
                    self._warn_full()
                    continue
                self.sources[labels] = {source}
            elif kind == GAUGE:
                self.sources[labels] = {source}  # the last writer owns it
            else:
                self.sources[labels].add(source)
            if isinstance(value, Buckets):
                if isinstance(current, Buckets):
                    current.merge(value)
                else:
                    self.values[labels] = value.copy()
            elif kind == COUNTER and isinstance(current, float):
                self.values[labels] = current + value
            else:
                self.values[labels] = float(value)

    def forget(self, gone: Collection[str]) -> None:
        """Drop the series only replicas in `gone` fed."""
        for labels in list(self.sources):
            sources = self.sources[labels]
            sources.difference_update(gone)
            if not sources:
                del self.sources[labels]
                self.values.pop(labels, None)

    def _warn_full(self) -> None:
        if not self._warned:
            self._warned = True
            log.warning("metric %s: more than %d label sets across replicas; dropping new "
                        "ones", self.info.name, MAX_SERIES_PER_METRIC)


class UserMetrics:
    """Every user metric the replicas reported, by name."""

    def __init__(self) -> None:
        self.families: dict[str, UserFamily] = {}
        self._warned: set[str] = set()

    def __repr__(self) -> str:
        series = sum(len(f.values) for f in self.families.values())
        return f"<UserMetrics metrics={len(self.families)} series={series}>"

    def add(self, source: str, report: UserReport) -> None:
        for info, values in report.items():
            family = self.families.get(info.name)
            if family is None or (family.info.shape != info.shape and not family.values):
                if family is None and len(self.families) >= MAX_METRICS:
                    self._warn_once("", f"more than {MAX_METRICS} user metrics; dropping "
                                        f"{info.name} and other new ones")
                    continue
                family = self.families[info.name] = UserFamily(info)
            elif family.info.shape != info.shape:
                self._warn_once(info.name, f"metric {info.name} is reported as a {info.kind} "
                                           f"with tag_keys {info.tag_keys} by {source}; it is "
                                           f"a {family.info.kind} with tag_keys "
                                           f"{family.info.tag_keys}: dropping that report")
                continue
            family.add(source, values)

    def forget(self, gone: Collection[str]) -> None:
        """The replicas in `gone` have left and had their last scrape."""
        for family in self.families.values():
            family.forget(gone)

    def drop_gauges(self, stopped: Collection[str]) -> None:
        """A stopped replica's gauges describe nothing any more."""
        for family in self.families.values():
            if family.info.kind == GAUGE:
                family.forget(stopped)

    def _warn_once(self, key: str, message: str) -> None:
        if key not in self._warned:
            self._warned.add(key)
            log.warning("%s", message)
