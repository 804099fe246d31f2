"""Service-time and start-up-time distributions of a scenario, in seconds.

Spelled in YAML as a number (a constant) or a mapping:

    {distribution: constant, value: 0.005}
    {distribution: lognormal, mean: 5, p99: 15}       # or median + sigma
    {distribution: exponential, mean: 5}
    {distribution: uniform, low: 2, high: 8}

(in the unit of the key that holds it: `service_time_ms` in ms, `startup_s` in s).
Each distribution samples with a caller's `random.Random`, gives its exact `cdf` and
`quantile`, and a discretisation (`points`): values at the middle of probability bins
that are fine in the tail (p90..p99.99), so a mixture of shifted copies keeps its p99.
"""

from __future__ import annotations

import itertools
import math
import random
from collections.abc import Mapping
from dataclasses import dataclass
from statistics import NormalDist
from typing import Any

from surge.config.schema import number, number_in

__all__ = ["Distribution", "parse_distribution"]

_NORMAL = NormalDist()
_Z99 = _NORMAL.inv_cdf(0.99)


def _bins() -> tuple[tuple[float, ...], tuple[float, ...]]:
    """(middle probability, weight) of bins: 5% wide to p90, then finer into the tail."""
    edges = [i * 0.05 for i in range(19)]  # 0 .. 0.90
    edges += [0.90 + i * 0.005 for i in range(1, 19)]  # .. 0.99
    edges += [0.99 + i * 0.001 for i in range(1, 10)]  # .. 0.999
    edges += [0.9995, 0.9999, 1.0]
    middles = tuple((a + b) / 2 for a, b in itertools.pairwise(edges))
    weights = tuple(b - a for a, b in itertools.pairwise(edges))
    return middles, weights


_MIDDLES, _WEIGHTS = _bins()


@dataclass(frozen=True)
class Distribution:
    """One of constant, lognormal (mu, sigma of the log), exponential, uniform."""

    kind: str
    a: float  # constant: value; lognormal: mu; exponential: mean; uniform: low
    b: float = 0.0  # lognormal: sigma; uniform: high

    def __repr__(self) -> str:
        return f"<Distribution {self.kind} mean={self.mean:g} p99={self.quantile(0.99):g}>"

    @property
    def mean(self) -> float:
        if self.kind == "lognormal":
            return math.exp(self.a + self.b * self.b / 2)
        if self.kind == "uniform":
            return (self.a + self.b) / 2
        return self.a

    def quantile(self, p: float) -> float:
        if self.kind == "constant":
            return self.a
        if self.kind == "lognormal":
            return math.exp(self.a + self.b * _NORMAL.inv_cdf(min(max(p, 1e-12), 1 - 1e-12)))
        if self.kind == "exponential":
            return -self.a * math.log1p(-min(p, 1 - 1e-12))
        return self.a + (self.b - self.a) * p

    def cdf(self, x: float) -> float:
        if self.kind == "constant":
            return 1.0 if x >= self.a else 0.0
        if x <= 0:
            return 0.0
        if self.kind == "lognormal":
            return _NORMAL.cdf((math.log(x) - self.a) / self.b)
        if self.kind == "exponential":
            return 1.0 - math.exp(-x / self.a)
        if self.b == self.a:
            return 1.0 if x >= self.a else 0.0
        return min(max((x - self.a) / (self.b - self.a), 0.0), 1.0)

    def sample(self, rng: random.Random) -> float:
        if self.kind == "constant":
            return self.a
        if self.kind == "lognormal":
            return rng.lognormvariate(self.a, self.b)
        if self.kind == "exponential":
            return rng.expovariate(1.0 / self.a)
        return rng.uniform(self.a, self.b)

    def points(self) -> tuple[tuple[float, ...], tuple[float, ...]]:
        """(values, probabilities) approximating the distribution, tail-heavy."""
        if self.kind == "constant" or (self.kind == "uniform" and self.a == self.b):
            return (self.a,), (1.0,)
        return tuple(self.quantile(p) for p in _MIDDLES), _WEIGHTS

    def scaled(self, factor: float) -> Distribution:
        """The same distribution in another unit (ms -> s: factor 0.001)."""
        if self.kind == "lognormal":
            return Distribution("lognormal", self.a + math.log(factor), self.b)
        return Distribution(self.kind, self.a * factor, self.b * factor)


def _lognormal(spec: Mapping[str, Any], where: str) -> Distribution:
    keys = set(spec) - {"distribution"}
    if keys == {"mean", "p99"}:
        mean = float(number_in(spec, "mean", where, gt=0))
        p99 = float(number_in(spec, "p99", where, gt=0))
        # ln(p99 / mean) = z*sigma - sigma^2/2: the smaller root is the usual shape.
        gap = math.log(p99 / mean)
        if p99 <= mean or _Z99 * _Z99 - 2 * gap < 0:
            highest = mean * math.exp(_Z99 * _Z99 / 2)
            raise ValueError(f"{where}: no lognormal has mean {mean:g} and p99 {p99:g} "
                             f"(p99 must lie between the mean and {highest:g})")
        sigma = _Z99 - math.sqrt(_Z99 * _Z99 - 2 * gap)
        return Distribution("lognormal", math.log(mean) - sigma * sigma / 2, sigma)
    if keys == {"median", "sigma"}:
        median = float(number_in(spec, "median", where, gt=0))
        sigma = float(number_in(spec, "sigma", where, gt=0))
        return Distribution("lognormal", math.log(median), sigma)
    raise ValueError(f"{where}: a lognormal takes {{mean, p99}} or {{median, sigma}}, got "
                     f"{sorted(keys)}")


def parse_distribution(spec: Any, where: str) -> Distribution:
    """A number (constant) or {distribution: kind, ...}; errors name `where`."""
    if isinstance(spec, int | float) and not isinstance(spec, bool):
        return Distribution("constant", float(number(where, spec, ge=0, path=())))
    if not isinstance(spec, Mapping) or "distribution" not in spec:
        raise ValueError(f"{where} must be a number or a mapping like {{distribution: "
                         f"lognormal, mean: 5, p99: 15}}, got {spec!r}")
    kind = spec["distribution"]
    keys = set(spec) - {"distribution"}
    if kind == "constant" and keys == {"value"}:
        return Distribution("constant", float(number_in(spec, "value", where, ge=0)))
    if kind == "lognormal":
        return _lognormal(spec, where)
    if kind == "exponential" and keys == {"mean"}:
        return Distribution("exponential", float(number_in(spec, "mean", where, gt=0)))
    if kind == "uniform" and keys == {"low", "high"}:
        low = float(number_in(spec, "low", where, ge=0))
        high = float(number_in(spec, "high", where, ge=0))
        if high < low:
            raise ValueError(f"{where}: uniform high ({high:g}) is below low ({low:g})")
        return Distribution("uniform", low, high)
    known = {"constant": "value", "exponential": "mean", "uniform": "low, high",
             "lognormal": "mean, p99 (or median, sigma)"}
    if kind not in known:
        raise ValueError(f"{where}.distribution must be one of {', '.join(known)}, got {kind!r}")
    raise ValueError(f"{where}: a {kind} distribution takes {known[kind]}, got {sorted(keys)}")
