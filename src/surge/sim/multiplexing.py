"""A scenario's `multiplex:` section: many models behind one deployment, `@serve.multiplexed`.

    multiplex:
      models: 40                            # model ids m0 (most requested) .. m39
      popularity: {distribution: zipf, s: 1.1}   # or uniform, or a list of weights
      load_time_s: 0.2                      # a number or a distribution (sim/distributions)
      max_num_models_per_replica: 3         # the decorator's argument; -1: unlimited
      routing: surge                        # or ray (Ray Serve 2.60's multiplex routing)
      loads: concurrent                     # or serial (Ray's replica: one load at a time)
      max_replicas_per_model: 2             # surge routing: copies of one model; 0: no bound
      matching_timeout_s: 1.0               # ray: held-first for U(t, 2t); surge: fallback

Each request names one model, drawn from `popularity`; the replica side follows
replica/multiplex.py (`loads: concurrent`) or Ray's ray/serve/multiplex.py (`serial`), the
router policy/model_routing.py (`surge`) or Ray's MultiplexMixin (`ray`): sim/mux_*.py.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from surge.config.schema import check_keys, choice, number_in
from surge.sim.distributions import Distribution, parse_distribution

__all__ = ["KEYS", "LOADS", "ROUTINGS", "Multiplexing", "Popularity", "parse_multiplexing"]

ROUTINGS = ("surge", "ray")
LOADS = ("concurrent", "serial")
KEYS = ("models", "popularity", "load_time_s", "max_num_models_per_replica", "routing",
        "loads", "max_replicas_per_model", "matching_timeout_s", "advertise_interval_s")
# Ray's RAY_SERVE_MULTIPLEXED_MODEL_ID_MATCHING_TIMEOUT_S: each routing attempt compares
# the time since its first with a fresh draw in [t, 2t].
DEFAULT_MATCHING_TIMEOUT_S = 1.0
# Ray's PUSH_MULTIPLEXED_MODEL_IDS_INTERVAL_S: a replica pushes its model ids this often
# (when they changed); the controller passes them on at its next 0.1 s loop.
DEFAULT_ADVERTISE_INTERVAL_S = 0.1
# @serve.multiplexed's default.
DEFAULT_MODELS_PER_REPLICA = 3
# How many replicas may hold one model under surge routing (0: no bound). The router
# has no default yet (issue 17, item 3); in this simulator's sweeps an unbounded spread
# turns momentary full holders into copies that evict other models, then more loads,
# and can collapse a cluster that one or two copies per model serve well.
DEFAULT_MAX_REPLICAS_PER_MODEL = 2


@dataclass(frozen=True)
class Popularity:
    """How often each model is requested: weights normalised to probabilities."""

    kind: str  # zipf, uniform, weights
    probabilities: tuple[float, ...]
    s: float = 0.0

    def __repr__(self) -> str:
        top = ", ".join(f"{p:.3f}" for p in self.probabilities[:3])
        return f"<Popularity {self.kind} models={len(self.probabilities)} top=[{top}]>"

    def sample(self, rng: np.random.Generator, count: int) -> list[int]:
        """`count` model indices (0 is the most requested)."""
        if count <= 0:
            return []
        picks: list[int] = rng.choice(len(self.probabilities), size=count,
                                      p=self.probabilities).tolist()
        return picks

    def top(self, n: int) -> list[int]:
        """The `n` most requested models, most requested first (ties: lower index)."""
        order = sorted(range(len(self.probabilities)), key=lambda m: -self.probabilities[m])
        return order[:n]


@dataclass(frozen=True)
class Multiplexing:
    models: int
    popularity: Popularity
    load_time_s: Distribution
    max_num_models_per_replica: int  # -1: unlimited
    routing: str = "surge"
    loads: str = "concurrent"
    max_replicas_per_model: int = DEFAULT_MAX_REPLICAS_PER_MODEL
    matching_timeout_s: float | None = DEFAULT_MATCHING_TIMEOUT_S  # None: surge never falls back
    advertise_interval_s: float = DEFAULT_ADVERTISE_INTERVAL_S

    @property
    def capacity(self) -> int:
        """Models a replica may hold or load at once; 0 for unlimited."""
        return max(self.max_num_models_per_replica, 0)


def parse_popularity(spec: Any, models: int, where: str) -> Popularity:
    """{distribution: zipf, s: 1.1}, `uniform` (or {distribution: uniform}), or weights."""
    if isinstance(spec, list):
        if len(spec) != models or not all(
                isinstance(w, int | float) and not isinstance(w, bool) and math.isfinite(w)
                and w >= 0 for w in spec) or not sum(spec) > 0:
            raise ValueError(f"{where}: a list of weights needs {models} numbers >= 0 (one "
                             f"per model), not all 0, got {spec!r}")
        total = float(sum(spec))
        return Popularity("weights", tuple(w / total for w in spec))
    kind = spec.get("distribution") if isinstance(spec, Mapping) else spec
    keys = set(spec) - {"distribution"} if isinstance(spec, Mapping) else set()
    if kind == "uniform" and not keys:
        return Popularity("uniform", tuple(1.0 / models for _ in range(models)))
    if kind == "zipf" and keys == {"s"}:
        s = spec["s"]
        if isinstance(s, bool) or not isinstance(s, int | float) or not 0 <= s < 100:
            raise ValueError(f"{where}.s must be a number in [0, 100), got {s!r}")
        weights = [(rank + 1) ** -float(s) for rank in range(models)]
        total = sum(weights)
        return Popularity("zipf", tuple(w / total for w in weights), float(s))
    raise ValueError(f"{where} must be {{distribution: zipf, s: 1.1}}, uniform, or a list "
                     f"of {models} weights, got {spec!r}")


def parse_multiplexing(section: Mapping[str, Any], where: str) -> Multiplexing:
    """The validated section; ValueError names `where` and the field."""
    check_keys(section, KEYS, where)
    models: int = number_in(section, "models", where, ge=1, integer=True)
    if "load_time_s" not in section:
        raise ValueError(f"{where}.load_time_s is missing: how long one model load takes "
                         "(a number of seconds or a distribution)")
    load = parse_distribution(section["load_time_s"], f"{where}.load_time_s")
    per_replica = section.get("max_num_models_per_replica", DEFAULT_MODELS_PER_REPLICA)
    if isinstance(per_replica, bool) or not isinstance(per_replica, int) or (
            per_replica != -1 and per_replica <= 0):
        raise ValueError(f"{where}.max_num_models_per_replica must be a positive integer or "
                         f"-1 (unlimited), got {per_replica!r}")
    routing = choice(f"{where}.routing", section.get("routing", ROUTINGS[0]), ROUTINGS)
    timeout = number_in(section, "matching_timeout_s", where, DEFAULT_MATCHING_TIMEOUT_S,
                        ge=0, allow_none=True)
    if timeout is None and routing == "ray":
        raise ValueError(f"{where}.matching_timeout_s: Ray's routing always has one "
                         "(null is for surge routing: never fall back)")
    interval = float(number_in(section, "advertise_interval_s", where,
                               DEFAULT_ADVERTISE_INTERVAL_S, gt=0))
    return Multiplexing(
        models=models,
        popularity=parse_popularity(section.get("popularity", "uniform"), models,
                                    f"{where}.popularity"),
        load_time_s=load, max_num_models_per_replica=per_replica,
        routing=routing,
        loads=choice(f"{where}.loads", section.get("loads", LOADS[0]), LOADS),
        max_replicas_per_model=number_in(section, "max_replicas_per_model", where,
                                         DEFAULT_MAX_REPLICAS_PER_MODEL, ge=0, integer=True),
        matching_timeout_s=None if timeout is None else float(timeout),
        advertise_interval_s=interval)
