"""Model multiplexing, surge vs Ray Serve 2.60 in one run (issue 17's shape).

    python bench/multiplex.py [--systems surge,ray] [--rps 50] [--seconds 40]

The same app (bench/apps/multiplex_app.py) on both: 4 replicas, at most 3 models each, a
loader that sleeps 200 ms, requests that run 20 ms. Three phases per system:
1. concurrent loads: two different models requested at once from a one-replica app;
   how long until both answer (~0.2 s when loads run at once, ~0.4 s when serialised);
2. the mix: open-loop Poisson traffic at --rps for --seconds, 40 models m0..m39 with
   Zipf(1.1) popularity (m0 takes ~27%), so the replicas carry it easily when models
   stay resident (4 x 8 / 20 ms = 1,600 req/s) and the difference is where requests go;
3. a hot model: --hot-rps of m0 alone for --hot-seconds, each running 200 ms, more than
   one replica carries (8 / 0.2 s = 40 req/s): how many replicas serve it.
Per system: hit rate (the model was resident on the replica when the request arrived;
"waited on a load" is the rest), loads per minute, p50/p99 of the mix, non-2xx, how many
replicas held each of the top-3 models (mean and max over the mix, from the replicas'
answers), the replicas that served the hot model, and the concurrent-load time. Ends
with `summary: hit_rate=... ray_hit_rate=... p99_ms=... ray_p99_ms=...
hot_model_replicas=... ray_hot_model_replicas=... concurrent_load_s=...
ray_concurrent_load_s=...`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import random
import sys
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import APPS, free_port, ray_python, start_system, surge_env
from bench.openloop import Outcome, run

MODELS = 40
ZIPF_S = 1.1
TOP = ("m0", "m1", "m2")


def zipf_weights(n: int, s: float) -> list[float]:
    raw = [1.0 / (rank + 1) ** s for rank in range(n)]
    total = sum(raw)
    return [w / total for w in raw]


def _percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _get(url: str, model: str) -> dict[str, Any]:
    request = urllib.request.Request(url, headers={"serve_multiplexed_model_id": model})
    with urllib.request.urlopen(request, timeout=30) as response:
        return dict(json.loads(response.read()))


def concurrent_load_s(base: str) -> float:
    """Two models new to a one-replica app, requested at once: seconds until both answer."""
    url = base.replace("/models", "/single")
    _get(url, "warm")  # the replica is up and has served once
    with ThreadPoolExecutor(2) as pool:
        started = time.perf_counter()
        answers = list(pool.map(lambda m: _get(url, m), ["cold-a", "cold-b"]))
        elapsed = time.perf_counter() - started
    assert not any(a["hit"] for a in answers), answers
    return elapsed


def _phase(host: str, port: int, path: str, rps: float, seconds: float,
           models: list[str], seed: int) -> list[Outcome]:
    rng = random.Random(seed)
    gaps: list[float] = []

    def rate_at(t: float) -> float:  # Poisson arrivals: exponential gaps
        gap = rng.expovariate(rps)
        gaps.append(gap)
        return 1.0 / gap

    def headers_for(index: int) -> bytes:
        return f"serve_multiplexed_model_id: {models[index]}\r\n".encode()

    _, outcomes = asyncio.run(run(host, port, path, rate_at, seconds, timeout_s=30,
                                  headers_for=headers_for, keep_bodies=True))
    return outcomes


def measure(system: str, url: str, args: argparse.Namespace) -> dict[str, Any]:
    host_port = url.split("//", 1)[1].split("/", 1)[0]
    host, port = host_port.rsplit(":", 1)
    concurrent = concurrent_load_s(url)
    rng = random.Random(1)
    mix = rng.choices([f"m{i}" for i in range(MODELS)], zipf_weights(MODELS, ZIPF_S),
                      k=int(args.rps * args.seconds * 2) + 100)
    started = time.perf_counter()
    outcomes = _phase(host, int(port), "/models", args.rps, args.seconds, mix, 2)
    mix_s = time.perf_counter() - started
    ok = [o for o in outcomes if o.status == 200]
    answers = [(o.scheduled + o.latency_s, mix[o.index], json.loads(o.body)) for o in ok]
    answers.sort(key=lambda a: a[0])
    held: dict[int, list[str]] = {}
    loads: dict[int, int] = {}
    copies: dict[str, list[int]] = {m: [] for m in TOP}
    for _, _, answer in answers:
        held[answer["pid"]] = answer["held"]
        loads[answer["pid"]] = max(loads.get(answer["pid"], 0), answer["loads"])
        for model in TOP:
            copies[model].append(sum(model in h for h in held.values()))
    hits = sum(a["hit"] for _, _, a in answers)
    latencies = [o.latency_s * 1000 for o in ok]
    hot = _phase(host, int(port), "/models?work=0.2", args.hot_rps, args.hot_seconds,
                 ["m0"] * (int(args.hot_rps * args.hot_seconds * 2) + 100), 3)
    hot_ok = [json.loads(o.body) for o in hot if o.status == 200]
    late = hot_ok[len(hot_ok) // 2:]  # once it had time to spread
    return {
        "system": system, "requests": len(outcomes), "ok": len(ok),
        "failed": len(outcomes) - len(ok),
        "hit_rate": hits / len(ok) if ok else float("nan"),
        "waited": 1 - hits / len(ok) if ok else float("nan"),
        "loads_per_min": sum(loads.values()) / mix_s * 60,
        "p50_ms": _percentile(latencies, 0.5), "p99_ms": _percentile(latencies, 0.99),
        "copies": {m: (sum(c) / len(c) if c else 0.0, max(c, default=0))
                   for m, c in copies.items()},
        "hot_model_replicas": len({a["pid"] for a in late}),
        "hot_failed": len(hot) - len(hot_ok),
        "hot_p99_ms": _percentile([o.latency_s * 1000 for o in hot if o.status == 200], 0.99),
        "concurrent_load_s": concurrent,
    }


def print_table(results: list[dict[str, Any]]) -> None:
    print("| system | requests | hit rate | waited on a load | loads/min | p50 ms | p99 ms "
          "| failed | replicas holding top-3 (mean, max) | hot model: replicas, p99 ms, "
          "failed | 2 loads at once |")
    print("|---|--:|--:|--:|--:|--:|--:|--:|---|---|--:|")
    for r in results:
        copies = ", ".join(f"{m} {mean:.2f} (max {most})"
                           for m, (mean, most) in r["copies"].items())
        print(f"| {r['system']} | {r['requests']:,} | {r['hit_rate']:.1%} | {r['waited']:.1%} "
              f"| {r['loads_per_min']:.0f} | {r['p50_ms']:.0f} | {r['p99_ms']:.0f} "
              f"| {r['failed']} | {copies} | {r['hot_model_replicas']}, "
              f"{r['hot_p99_ms']:.0f}, {r['hot_failed']} | {r['concurrent_load_s']:.2f} s |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--systems", default="surge,ray")
    parser.add_argument("--rps", type=float, default=50.0)
    parser.add_argument("--seconds", type=float, default=40.0)
    parser.add_argument("--hot-rps", type=float, default=80.0)
    parser.add_argument("--hot-seconds", type=float, default=10.0)
    parser.add_argument("--replicas", type=int, default=4)
    args = parser.parse_args()
    results = []
    for system in args.systems.split(","):
        python = sys.executable if system == "surge" else ray_python()
        argv = [python, str(APPS / "multiplex_app.py"), system, str(free_port()),
                str(args.replicas)]
        env = surge_env() if system == "surge" else None
        with start_system(system, argv, env, timeout_s=600) as running:
            results.append(measure(system, running.url, args))
        print(f"{system}: done", file=sys.stderr, flush=True)
    print_table(results)
    by = {r["system"]: r for r in results}
    fields = []
    for key in ("hit_rate", "p99_ms", "hot_model_replicas", "concurrent_load_s"):
        for system, prefix in (("surge", ""), ("ray", "ray_")):
            if system in by:
                value = by[system][key]
                text = f"{value:.3f}" if isinstance(value, float) and not math.isnan(value) \
                    else str(value)
                fields.append(f"{prefix}{key}={text}")
    print("summary: " + " ".join(fields))


if __name__ == "__main__":
    main()
