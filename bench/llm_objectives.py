"""LLM latency objectives: the first scale-up decision after an arrival step, on real
surge with mock engines and in the simulator beside Ray's default policy.

    python bench/llm_objectives.py [--rounds 3] [--real-only | --sim-only]
        [--base-rate 1 --step-rate 16] [--step-s 4] [--ramp-s 0]

`--base-rate` / `--step-rate` set the step's two rates (req/s; default 1 -> 16). The
engine's prefill speed scales with the step rate so that the step stays 1.6x what one
replica prefills (prefill_s_per_token 0.0002 x 16 / step rate: 5,000 tokens/s at 16
req/s, 50,000 at 160); the baseline must stay under half of that (one replica holds it).
Only the rates and the engine's prefill speed change; the prompts, outputs, batch and
objectives do not. At a higher base rate the step's first request still comes on
the baseline's beat, 1 / base rate after the one before, but its 2nd comes ~1 / step
rate after it. `--ramp-s` raises the baseline's rate from 0 over its first seconds
(default 0: 10 req/s from the start is itself a step, and at 10 -> 160 req/s it was
scaled 1 -> 2 before the step; bench/README.md's runs at 10 -> 160 use `--ramp-s 4`).

Engines: `surge.testing:MockVLLMEngine` with ENGINE (prefill 5,000 tokens/s at the
default rates, so a ~520-token prompt takes ~0.1 s of prefill; max_num_seqs 32); prompts
of PROMPT_WORDS words, each its own (no prefix-cache hits), MAX_TOKENS output tokens.

* real: one surge instance on this machine; each round deploys one app per case, in
  turn: an LLMServer with min 1 / max 8 replicas, initial 1. Open-loop chats at BASE_RPS
  for BASELINE_S, evenly spaced (the replica measures its prefill rate; no burst of its
  own to scale on), then Poisson at STEP_RPS (1.6x what one replica prefills; 16x by default) for
  STEP_S. Cases: `objectives` (proactive with
  objectives {ttft_ms: 500, tpot_ms: 50}) and `levels` (proactive on LLMServer's
  target_ongoing_requests = max_num_seqs, no objectives). The figure: the first
  scale-up decision (the controller's record, `loop_stats`) minus the step's first
  scheduled send (both this machine's monotonic clock), its kind and target; and the
  step's answers: 2xx, 429 (shed), 5xx, errors; TTFT p50/p99 of the 2xx. Beside it, when
  the step's 2nd and 3rd requests were due: the step's first request comes on the
  baseline's beat (1 / BASE_RPS after the one before), so nothing can tell the step from the
  baseline before its 2nd request (each round's arrivals are its seed's, the same in
  every run).
* sim: the same step (a BurstGPT-shaped trace, burstiness 1: Poisson, BurstGPT's
  lengths) through `surge simulate`'s LLM model with the step held 60 s, under
  `ray_default` (Ray's defaults), `proactive` (levels) and `proactive` + objectives; the
  engines' load (with the prefill backlog the objectives read) reported every 0.25 s as
  LLMServer reports it, replicas starting in `--sim-startup-s` (default 1 s). Per policy,
  over --rounds seeds: the first scale-up decision after the step, and the share of the
  step's requests shed (429: with objectives the simulated replicas admit by
  policy/llm_shedding.py as real ones do, sim/llm_flow.py), over the real step's
  `--step-s` (the real run's figure: 429s over the step's requests) and over the held
  step.
* prefill-heavy (sim): long prompts (2,000 tokens) at a constant rate 1.25x one
  replica's prefill, KV use held near 30% by a large cache: nothing but the prefill
  backlog grows. The figure: the first tick at which the engines' report shows a
  backlog past the objectives' scale-up point, and the decision's tick: `up_prefill`
  within one decision interval (0.1 s) of it; without objectives (the engines' waiting
  and KV signals) the decision. With objectives the replicas also shed, which holds the
  backlog under the target; a third row has objectives with `shed: false`.

Hold /tmp/surge-bench.lock around a real run. Last line: `summary: ...`.
(Over 500 lines: three scenarios, each on real surge and in the simulator on the same
trace and engine timing, printed side by side by one command.)
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import random
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path[:] = [str(ROOT / "src"), str(ROOT)] + [
    p for p in sys.path if Path(p or ".").resolve() != ROOT / "bench"]

from bench.common import free_port  # noqa: E402

ENGINE_DEFAULT = {"step_s": 0.004, "decode_s_per_seq": 0.0002, "prefill_s_per_token": 0.0002,
                  "max_num_seqs": 32, "max_num_batched_tokens": 2048, "num_blocks": 8192,
                  "block_size": 16, "max_model_len": 8192}
ENGINE = dict(ENGINE_DEFAULT)  # configure() scales its prefill speed with --step-rate
OBJECTIVES = {"ttft_ms": 500, "tpot_ms": 50}
PROMPT_WORDS = 500
MAX_TOKENS = 16
BASE_RPS, STEP_RPS = 1.0, 16.0
STEP_RPS_DEFAULT = STEP_RPS
STEP_OVER_ONE = 1.6  # the step's rate over what one replica prefills (~10 req/s at 16)
BASELINE_S, STEP_S = 8.0, 4.0
RAMP_S = 0.0  # --ramp-s: the baseline's rate rises from 0 over this long first
SIM_STARTUP_S = 1.0  # --sim-startup-s: a simulated replica's start-up
CASES = ("objectives", "levels")
PROMPT_TOKENS = 502  # PROMPT_WORDS words in the mock's chat template
SIM_HOLD_S = 60.0  # the simulated step is held long enough for Ray's delays


def configure(base_rps: float, step_rps: float, step_s: float, ramp_s: float = 0.0) -> None:
    """Set the step's rates and length; scale the engine's prefill speed with the step
    rate (the step stays STEP_OVER_ONE x one replica's prefill)."""
    global BASE_RPS, STEP_RPS, STEP_S, RAMP_S, ENGINE
    if not 0 < base_rps <= 0.5 * step_rps / STEP_OVER_ONE:
        raise SystemExit(f"--base-rate {base_rps:g} must be over 0 and at most half of what "
                         f"one replica prefills at --step-rate {step_rps:g} "
                         f"({step_rps / STEP_OVER_ONE:g} req/s)")
    if not 0 <= ramp_s <= BASELINE_S - 2:
        raise SystemExit(f"--ramp-s {ramp_s:g} must leave 2 s of the {BASELINE_S:g} s baseline")
    BASE_RPS, STEP_RPS, STEP_S, RAMP_S = base_rps, step_rps, step_s, ramp_s
    ENGINE = {**ENGINE_DEFAULT, "prefill_s_per_token":
              ENGINE_DEFAULT["prefill_s_per_token"] * STEP_RPS_DEFAULT / step_rps}


def arrivals(seed: int, hold_s: float) -> list[float]:
    """Send times: evenly spaced at BASE_RPS until the step (a steady baseline: no burst
    of its own to scale on), then Poisson at STEP_RPS for `hold_s`, its first request at
    the step (the same for the real run and the simulated one)."""
    rng = random.Random(seed)
    # the first at 0: a trace's times count from its first request
    times = [i / BASE_RPS for i in range(math.ceil(BASELINE_S * BASE_RPS))]
    if RAMP_S > 0:  # the rate rises linearly from 0 over RAMP_S, then the same beats
        ramp = [math.sqrt(2 * RAMP_S * k / BASE_RPS) for k in range(int(RAMP_S * BASE_RPS / 2))]
        times = ramp + [t for t in times if t >= RAMP_S]
    t = BASELINE_S
    while t < BASELINE_S + hold_s:
        times.append(t)
        t += rng.expovariate(STEP_RPS)
    return times


def write_trace(path: Path, times: list[float], prompt: int | list[int], output: int) -> Path:
    """A BurstGPT CSV of these send times, `prompt` tokens in (each request's, or one for
    all), `output` out."""
    prompts = prompt if isinstance(prompt, list) else [prompt] * len(times)
    rows = ["Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type"]
    rows += [f"{t:.6f},mock,{p},{output},{p + output},Conversation log"
             for t, p in zip(times, prompts, strict=True)]
    path.write_text("\n".join(rows) + "\n")
    return path


# -- real ------------------------------------------------------------------------------------


@dataclass
class RealRound:
    case: str
    index: int
    first_decision_s: float = float("nan")
    kind: str = ""
    target: int = 0
    reason: str = ""
    statuses: dict[str, int] = field(default_factory=dict)
    ttft_s: list[float] = field(default_factory=list)
    step_sends_s: list[float] = field(default_factory=list)  # the step's 2nd, 3rd request


def llm_config(case: str) -> dict[str, Any]:
    scaling: dict[str, Any] = {"min_replicas": 1, "max_replicas": 8, "initial_replicas": 1}
    if case == "objectives":
        scaling["objectives"] = OBJECTIVES
    return {"model_loading_config": {"model_id": "m"},
            "llm_engine": "surge.testing:MockVLLMEngine", "engine_kwargs": ENGINE,
            "deployment_config": {"max_ongoing_requests": 64,
                                  "autoscaling_config": scaling}}


def body(seq: int) -> dict[str, Any]:
    words = " ".join(f"r{seq}w{i}" for i in range(PROMPT_WORDS))
    return {"model": "m", "stream": True, "max_tokens": MAX_TOKENS, "ignore_eos": True,
            "messages": [{"role": "user", "content": words}]}


async def one(client: Any, path: str, seq: int, at: float, out: RealRound,
              stepped: bool) -> None:
    try:
        async with client.stream("POST", path, json=body(seq)) as answer:
            status = answer.status_code
            first = None
            async for line in answer.aiter_lines():
                if first is None and line.startswith("data: {") and '"content":"t' in line:
                    first = time.monotonic()
        if stepped:
            out.statuses[str(status)] = out.statuses.get(str(status), 0) + 1
            if status == 200 and first is not None:
                out.ttft_s.append(first - at)
    except Exception as exc:  # a timeout or a broken connection: counted, not raised
        if stepped:
            kind = type(exc).__name__
            out.statuses[kind] = out.statuses.get(kind, 0) + 1


async def drive(url: str, path: str, out: RealRound, seed: int) -> float:
    """Send the baseline then the step; the step's first scheduled send (monotonic)."""
    import httpx

    limits = httpx.Limits(max_connections=200, max_keepalive_connections=200)
    async with httpx.AsyncClient(base_url=url, timeout=30.0, limits=limits) as client:
        tasks: list[asyncio.Task[None]] = []
        start = time.monotonic()
        for seq, offset in enumerate(arrivals(seed, STEP_S)):
            at = start + offset
            await asyncio.sleep(max(0.0, at - time.monotonic()))
            tasks.append(asyncio.create_task(one(client, path, seq, at, out,
                                                 offset >= BASELINE_S)))
        await asyncio.gather(*tasks)
    return start + BASELINE_S


def scale_ups(app: str, since: float) -> list[dict[str, Any]]:
    from surge.api.instance import current

    instance = current()
    assert instance is not None
    stats = instance.call("loop_stats", timeout=10, since=since)
    return sorted((d for d in stats["decisions"]
                   if d["deployment"].split("#")[0] == app and d["target"] > d["previous"]),
                  key=lambda d: d["at"])


def real_round(url: str, case: str, index: int) -> RealRound:
    from surge import serve
    from surge.serve.llm import build_openai_app

    app = f"{case}-r{index}"
    result = RealRound(case, index, step_sends_s=[
        t - BASELINE_S for t in arrivals(index, STEP_S) if t >= BASELINE_S][1:3])
    serve.run(build_openai_app({"llm_configs": [llm_config(case)]}), name=app,
              route_prefix=f"/{app}")
    try:
        step_at = asyncio.run(drive(url, f"/{app}/v1/chat/completions", result, index))
        ups = scale_ups(app, step_at - BASELINE_S)
        early = [d for d in ups if d["at"] < step_at]
        if early:
            result.reason = (f"scaled up before the step, at "
                             f"{early[0]['at'] - step_at:+.2f} s: {early[0]['reason']}")
        later = [d for d in ups if d["at"] >= step_at]
        if later:
            first = later[0]
            result.first_decision_s = first["at"] - step_at
            result.kind, result.target = first["kind"], first["target"]
            result.reason = result.reason or first["reason"]
    finally:
        serve.delete(app)
    return result


def _pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, math.ceil(q * len(ordered)) - 1)]


def real_report(rounds: list[RealRound]) -> dict[str, float]:
    print(f"\nreal surge, mock engines: {BASE_RPS:g} -> {STEP_RPS:g} req/s "
          f"({STEP_RPS / BASE_RPS:g}x) for {STEP_S:g} s, {PROMPT_WORDS}-word prompts, "
          f"{MAX_TOKENS} tokens, prefill {1 / ENGINE['prefill_s_per_token']:,.0f} tokens/s"
          + (f", the baseline ramped over {RAMP_S:g} s" if RAMP_S else ""))
    print("| case | round | step -> first scale-up ms | the step's 2nd / 3rd request ms | "
          "kind | target | step's answers | TTFT p50 / p99 ms (2xx) |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rounds:
        answers = " ".join(f"{k}:{v}" for k, v in sorted(r.statuses.items()))
        sends = " / ".join(f"{1000 * t:.0f}" for t in r.step_sends_s)
        print(f"| {r.case} | {r.index} | {1000 * r.first_decision_s:.0f} | {sends} | "
              f"{r.kind or '-'} | {r.target or '-'} | {answers} | "
              f"{1000 * _pct(r.ttft_s, 0.5):.0f} / {1000 * _pct(r.ttft_s, 0.99):.0f} |")
    summary: dict[str, float] = {}
    for case in CASES:
        times = [r.first_decision_s for r in rounds if r.case == case
                 and not math.isnan(r.first_decision_s)]
        n = sum(1 for r in rounds if r.case == case)
        if times:
            print(f"{case}: step -> first scale-up median {1000 * statistics.median(times):.0f} "
                  f"ms (min {1000 * min(times):.0f}, max {1000 * max(times):.0f}; "
                  f"{len(times)}/{n} rounds decided)")
            summary[f"real_{case}_first_decision_ms"] = round(
                1000 * statistics.median(times), 1)
        else:
            print(f"{case}: no scale-up decision after the step in {n} rounds")
    for r in rounds:
        if r.reason:
            print(f"  {r.case} r{r.index}: {r.reason[:240]}")
    return summary


def run_real(rounds: int) -> dict[str, float]:
    from surge import serve

    # Replicas import from the repository's root, never from bench/ (its profile.py
    # shadows the standard library's): surge puts the main script's folder on their path.
    del sys.modules["__main__"].__file__
    os.environ.setdefault("SURGE_LOG_LEVEL", "WARNING")
    os.environ.setdefault("SURGE_ADDRESS", f"127.0.0.1:{free_port()}")
    port = free_port()
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    results: list[RealRound] = []
    try:
        for index in range(rounds):
            for case in CASES if index % 2 == 0 else CASES[::-1]:  # interleaved
                results.append(real_round(f"http://127.0.0.1:{port}", case, index))
                print(f"  round {index} {case}: {results[-1].first_decision_s:.3f} s "
                      f"{results[-1].kind}", flush=True)
    finally:
        serve.shutdown()
    return real_report(results)


# -- simulated ------------------------------------------------------------------------------


SIM_POLICIES = {
    "ray_default": {"policy": {"policy_function": "ray_default"}},
    "proactive (levels)": {},
    "proactive + objectives": {"objectives": OBJECTIVES},
}


def scenario(policy: dict[str, Any], seed: int, trace: Path, engine: dict[str, Any],
             max_ongoing: int = 64) -> Any:
    from surge.sim.scenario import Scenario

    return Scenario.from_mapping({
        "name": "llm-objectives", "seed": seed, "slo_ms": 60000,
        "cluster": {"nodes": 1, "replicas_per_node": 8, "startup_s": SIM_STARTUP_S},
        "traffic": {"timeout_s": 60},
        "llm": {"engine": engine, "trace": {"file": str(trace)}, "objectives": OBJECTIVES},
        "deployment": {"name": "LLM", "max_ongoing_requests": max_ongoing,
                       "autoscaling_config": {"min_replicas": 1, "max_replicas": 8,
                                              "initial_replicas": 1,
                                              "target_ongoing_requests":
                                                  engine["max_num_seqs"], **policy}},
        "control": {"clock_offset_s": 0}})


class Reported:
    """What the simulated engines report (`EngineLoad`), as LLMServer reports it every
    0.25 s: their queues and KV use, the prompt tokens not yet answered, and the capacity
    a replica measures of a mock engine with this timing."""

    def __init__(self, sim: Any, engine: dict[str, Any], period_s: float = 0.25) -> None:
        self.sim, self.engine, self.period_s = sim, engine, period_s
        self.at = -math.inf
        self.last: Any = None
        self.prompts: dict[str, tuple[float, int]] = {}  # seen: (when, prompt tokens)

    def __call__(self, now: float) -> Any:
        if now - self.at >= self.period_s - 1e-9:
            self.at, self.last = now, self.read()
        return self.last

    def read(self) -> Any:
        from surge.policy.engine_load import EngineLoad

        replicas = [r for r in self.sim.llm.replicas if r.routable]
        if not replicas:
            return None
        seqs = [s for r in replicas for s in (*r.model.waiting, *r.model.running)]
        now = self.at
        for s in seqs:  # the mean prompt admitted over the last 10 s, as a replica's
            self.prompts.setdefault(s.id, (now, len(s.prompt)))
        self.prompts = {k: v for k, v in self.prompts.items() if v[0] > now - 10.0}
        prompt = (sum(n for _, n in self.prompts.values()) / len(self.prompts)
                  if self.prompts else 0.0)
        e = self.engine
        return EngineLoad(
            len(replicas), float(sum(len(r.model.waiting) for r in replicas)),
            float(sum(len(r.model.running) for r in replicas)),
            sum(r.model.blocks.usage() for r in replicas) / len(replicas),
            prefill_backlog_tokens=float(sum(len(s.prompt) - s.computed for s in seqs
                                             if not s.output)),
            prefill_tokens_per_s=1 / e["prefill_s_per_token"], prompt_tokens=prompt,
            decode_step_s=e["step_s"], decode_s_per_seq=e["decode_s_per_seq"])


def simulate(policy: dict[str, Any], seed: int, trace: Path, engine: dict[str, Any],
             **kw: Any) -> Any:
    from surge.sim.engine import Simulation

    sim = Simulation(scenario(policy, seed, trace, engine, **kw))
    sim.engine_load = Reported(sim, engine)
    return sim.run()


def first_up(sim: Any, after: float) -> Any:
    return next((d for d in sim.decisions if d.t >= after and d.target > d.previous), None)


def run_sim(rounds: int, directory: Path) -> dict[str, float]:
    traces = [write_trace(directory / f"step-{seed}.csv", arrivals(seed, SIM_HOLD_S),
                          PROMPT_TOKENS, MAX_TOKENS) for seed in range(rounds)]
    print(f"\nsimulated: the same arrivals ({BASE_RPS:g} -> {STEP_RPS:g} req/s at "
          f"t={BASELINE_S:g} s, held {SIM_HOLD_S:g} s; {PROMPT_TOKENS} tokens in, "
          f"{MAX_TOKENS} out), the same engine timing")
    print("| policy | step -> first scale-up ms, median (min-max) | kinds | first target | "
          f"shed in the first {STEP_S:g} s of the step, per round | shed over "
          f"{SIM_HOLD_S:g} s |")
    print("|---|---|---|---|---|---|")
    summary: dict[str, float] = {}
    for name, policy in SIM_POLICIES.items():
        times, kinds, targets, shares, held = [], set(), [], [], []
        for seed in range(rounds):
            sim = simulate(policy, seed, traces[seed], ENGINE)
            d = first_up(sim, BASELINE_S)
            if d is not None:
                times.append(d.t - BASELINE_S)
                kinds.add(d.kind)
                targets.append(d.target)
            shares.append(step_shed(sim, STEP_S))
            held.append(step_shed(sim, SIM_HOLD_S))
        shown = (f"{1000 * statistics.median(times):.0f} ({1000 * min(times):.0f}-"
                 f"{1000 * max(times):.0f})" if times else "none within 60 s")
        print(f"| {name} | {shown} | {', '.join(sorted(kinds)) or '-'} | "
              f"{statistics.median(targets) if targets else '-'} | "
              f"{', '.join(f'{100 * x:.1f}%' for x in shares)} | "
              f"{', '.join(f'{100 * x:.1f}%' for x in held)} |")
        key = name.split()[0] + ("_objectives" if "objectives" in name else "")
        if times:
            summary[f"sim_{key}_first_decision_ms"] = round(1000 * statistics.median(times), 1)
        summary[f"sim_{key}_step_shed_pct"] = round(100 * statistics.median(shares), 1)
    return summary


def step_shed(sim: Any, seconds: float) -> float:
    """The share of the requests sent in the step's first `seconds` that were shed (429),
    by the 100 ms point each arrived in."""
    from surge.sim.engine import TICK_S

    first, last = round(BASELINE_S / TICK_S), round((BASELINE_S + seconds) / TICK_S)
    sent = sum(sim.llm.offered[first:last])
    return sum(sim.llm.shed_sent[first:last]) / sent if sent else 0.0


# -- prefill-heavy, KV near 30% ------------------------------------------------------------

# a KV cache of 48,000 tokens: the long prompts in flight hold ~30% of it
HEAVY_ENGINE = {**ENGINE_DEFAULT, "prefill_s_per_token": 0.0001, "max_num_seqs": 64,
                "max_num_batched_tokens": 2048, "num_blocks": 3000}
HEAVY_RPS, HEAVY_OUTPUT = 4.0, 16
HEAVY_SHORT, HEAVY_LONG = 500, 3000  # prompt tokens before and after the shift
HEAVY_SHIFT_S, HEAVY_S = 20.0, 50.0


def shifted_prompts() -> tuple[list[float], list[int]]:
    """Evenly spaced arrivals at one rate throughout (no burst for a rate to read), the
    prompts 6x longer from HEAVY_SHIFT_S."""
    times = [i / HEAVY_RPS for i in range(round(HEAVY_S * HEAVY_RPS))]
    return times, [HEAVY_SHORT if t < HEAVY_SHIFT_S else HEAVY_LONG for t in times]


def run_heavy(directory: Path, seed: int = 0) -> dict[str, float]:
    """The request rate stays at HEAVY_RPS; at HEAVY_SHIFT_S the prompts grow from 500 to
    3,000 tokens: 12,000 prompt tokens/s for a replica that prefills 10,000. The rate
    does not change, KV use stays near 30%, and the prefill backlog grows
    (llm-d-autoscaling#662). The moment a new prompt's TTFT starts to miss the objective
    (some engine's backlog needs longer than ttft_ms to prefill, read from the engines'
    state at every tick) against the first scale-up decision after the shift. With
    objectives the replicas shed (429) what their backlog would keep past the TTFT
    target, which holds the backlog under it: `shed off` is the same without that."""
    from surge.sim.engine import Simulation

    times, prompts = shifted_prompts()
    trace = write_trace(directory / "heavy.csv", times, prompts, HEAVY_OUTPUT)
    rate = 1 / HEAVY_ENGINE["prefill_s_per_token"]
    ttft_s = OBJECTIVES["ttft_ms"] / 1000
    print(f"\nprefill-heavy (simulated): {HEAVY_RPS:g} req/s throughout, prompts "
          f"{HEAVY_SHORT} -> {HEAVY_LONG} tokens at t={HEAVY_SHIFT_S:g} s "
          f"({HEAVY_RPS * HEAVY_LONG / rate:g}x one replica's prefill), {HEAVY_OUTPUT} out; "
          "1 replica; the engines report every 0.25 s; decisions every 0.1 s")
    summary: dict[str, float] = {}
    for name, policy in (("proactive + objectives", {"objectives": OBJECTIVES}),
                         ("proactive + objectives, shed off",
                          {"objectives": {**OBJECTIVES, "shed": False}}),
                         ("proactive (levels)", {})):
        sim = Simulation(scenario(policy, seed, trace, HEAVY_ENGINE, max_ongoing=128))
        reported = Reported(sim, HEAVY_ENGINE)
        missed: list[tuple[float, float]] = []  # (when, KV use then)
        kv_peak = [0.0]  # after the shift, until the first scale-up

        def load(now: float, sim: Any = sim, reported: Reported = reported,
                 missed: list[tuple[float, float]] = missed, kv_peak: list[float] = kv_peak,
                 ) -> Any:
            if now >= HEAVY_SHIFT_S and sim.target == 1:
                kv_peak[0] = max([kv_peak[0], *(r.model.blocks.usage()
                                                for r in sim.llm.replicas)])
            if not missed and now >= HEAVY_SHIFT_S:
                for r in sim.llm.replicas:
                    m = r.model
                    backlog = sum(len(q.prompt) - q.computed
                                  for q in (*m.waiting, *m.running) if not q.output)
                    if backlog / rate > ttft_s:
                        missed.append((now, m.blocks.usage()))
                        break
            return reported(now)

        sim.engine_load = load
        sim.run()
        early = [d for d in sim.decisions if d.t < HEAVY_SHIFT_S and d.target > d.previous]
        if early:
            print(f"  {name}: scaled up before the shift, at t={early[0].t:.2f} s: "
                  f"{early[0].reason[:200]}")
        d = first_up(sim, HEAVY_SHIFT_S)
        if missed:
            print(f"  {name}: TTFT objective first missed (backlog > {ttft_s:g} s of "
                  f"prefill) at t={missed[0][0]:.2f} s, KV {100 * missed[0][1]:.0f}%; KV "
                  f"peaked at {100 * kv_peak[0]:.0f}% while 1 replica served (a scaler on "
                  "KV use at 80% would not act)")
        if d is None:
            print(f"  {name}: no scale-up within {HEAVY_S - HEAVY_SHIFT_S:g} s of the shift")
            continue
        lag = (f", {1000 * (d.t - missed[0][0]):+.0f} ms from the first miss" if missed
               else ", before any miss")
        shed = sum(sim.llm.shed)
        print(f"  {name}: first scale-up at t={d.t:.2f} s{lag} ({d.kind}, {d.previous} -> "
              f"{d.target}; {shed} shed in the run): {d.reason[:300]}")
        key = ("levels" if "objectives" not in name else
               "objectives_noshed" if "shed off" in name else "objectives")
        summary[f"heavy_{key}_after_shift_s"] = round(d.t - HEAVY_SHIFT_S, 2)
        if missed:
            summary[f"heavy_{key}_after_first_miss_ms"] = round(1000 * (d.t - missed[0][0]), 1)
    return summary


def main() -> None:
    global SIM_STARTUP_S
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--real-only", action="store_true")
    parser.add_argument("--sim-only", action="store_true")
    parser.add_argument("--base-rate", type=float, default=BASE_RPS, help="req/s before the step")
    parser.add_argument("--step-rate", type=float, default=STEP_RPS,
                        help="req/s of the step (the engine's prefill speed scales with it)")
    parser.add_argument("--step-s", type=float, default=STEP_S, help="the real step's length")
    parser.add_argument("--ramp-s", type=float, default=RAMP_S,
                        help="the baseline's rate rises from 0 over this long (default none)")
    parser.add_argument("--sim-startup-s", type=float, default=SIM_STARTUP_S,
                        help="a simulated replica's start-up (default 1 s)")
    args = parser.parse_args()
    configure(args.base_rate, args.step_rate, args.step_s, args.ramp_s)
    SIM_STARTUP_S = args.sim_startup_s
    summary: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="surge-objectives-") as directory:
        if not args.real_only:
            summary.update(run_sim(args.rounds, Path(directory)))
            summary.update(run_heavy(Path(directory)))
    if not args.sim_only:
        summary.update(run_real(args.rounds))
    print("summary: " + " ".join(f"{k}={v}" for k, v in summary.items()))


if __name__ == "__main__":
    main()
