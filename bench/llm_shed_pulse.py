"""Shed, do not fail: a BurstGPT-shaped pulse against a fixed replica budget, mock engines.

    python bench/llm_shed_pulse.py [--rounds 1] [--replicas 1] [--seconds 60]
        [--sim | --sim-only]

A BurstGPT-shaped trace (surge.loadtest.traces' lengths; gamma arrivals of burstiness
0.25) at BASE_RPS, then 10x for the middle sixth, then BASE_RPS again; output lengths
are divided by OUTPUT_DIVISOR (this machine's 2 cores stream every token through the
proxy). It is replayed by `surge pulse --trace` (streamed chats, TTFT from each
request's scheduled send) against an LLMServer on `surge.testing:MockVLLMEngine`
(ENGINE: 10,000 prefill tokens/s in chunks of 256 tokens a step, 4 ms + 0.2 ms a
sequence a decode step, 32 sequences) with a fixed budget (min = max = --replicas)
and objectives OBJECTIVES, in two cases, in turn: `shed` (the replica answers 429 with
Retry-After to what it predicts would miss the TTFT objective) and `queue` (the same
objectives, `shed: false`: everything is queued). Per case: requests sent, served
(2xx), shed (429), 5xx, timeouts and connection errors; TTFT and TPOT p99 of the
served; SLO attainment (both objectives met) over the served, and over served + shed.

`--sim` adds (`--sim-only`: only) the same trace through `surge simulate`'s LLM model
(sim/llm_flow.py: EngineModel replicas on ENGINE's timing, the same budget, objectives
and the LLM deployment's defaults, max_ongoing_requests 2 x max_num_seqs), rows `sim
shed` / `sim queue`: there a replica admits by policy/llm_shedding.py as the real one
does, on the prefill rate it measured of its engine model; shed means the same (429).

Hold /tmp/surge-bench.lock around it. Last line: `summary: ...`.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path[:] = [str(ROOT / "src"), str(ROOT)] + [
    p for p in sys.path if Path(p or ".").resolve() != ROOT / "bench"]

from bench.common import free_port  # noqa: E402

# Chunked prefill of 256 tokens a step (25.6 ms): a step with a longer chunk would stall
# every decoding sequence past the TPOT objective (at 4,096 tokens a step: 0.41 s).
ENGINE = {"step_s": 0.004, "decode_s_per_seq": 0.0002, "prefill_s_per_token": 0.0001,
          "max_num_seqs": 32, "max_num_batched_tokens": 256, "num_blocks": 16384,
          "block_size": 16, "max_model_len": 16384}
OBJECTIVES = {"ttft_ms": 1000, "tpot_ms": 50}
BASE_RPS, PEAK_FACTOR, BURSTINESS = 2.0, 10.0, 0.25
OUTPUT_DIVISOR = 4
TIMEOUT_S = 60.0
CASES = ("shed", "queue")


def make_trace(path: Path, seconds: float, seed: int) -> int:
    from surge.loadtest.schedule import Schedule
    from surge.loadtest.traces import TraceRequest, write_burstgpt
    from surge.sim.llm_spec import shaped_trace

    sixth = seconds / 6
    schedule = Schedule.from_spec([{"rps": BASE_RPS, "for_s": 2.5 * sixth},
                                   {"rps": BASE_RPS * PEAK_FACTOR, "for_s": sixth},
                                   {"rps": BASE_RPS, "for_s": 2.5 * sixth}])
    trace = shaped_trace("burstgpt", schedule, BURSTINESS, random.Random(seed),
                         int(ENGINE["max_model_len"]))
    trace = [TraceRequest(r.at_s, r.input_length, max(1, r.output_length // OUTPUT_DIVISOR))
             for r in trace]
    write_burstgpt(trace, path)
    return len(trace)


def llm_config(case: str, replicas: int) -> dict[str, Any]:
    objectives = {**OBJECTIVES, "shed": case == "shed"}
    return {"model_loading_config": {"model_id": "mock"},
            "llm_engine": "surge.testing:MockVLLMEngine", "engine_kwargs": ENGINE,
            "deployment_config": {"autoscaling_config": {
                "min_replicas": replicas, "max_replicas": replicas,
                "objectives": objectives}}}


def pulse(url: str, trace: Path) -> dict[str, Any]:
    from surge.loadtest.llm import LLMPreset
    from surge.loadtest.options import PulseOptions
    from surge.loadtest.runner import run_pulse
    from surge.loadtest.slo import Slo

    preset = LLMPreset(kind="chat", model="mock", trace=str(trace),
                       goodput=Slo.parse([f"ttft:{OBJECTIVES['ttft_ms']:g}",
                                          f"tpot:{OBJECTIVES['tpot_ms']:g}"]))
    options = PulseOptions(url=url, schedule=preset.trace_schedule(), llm=preset,
                           timeout_s=TIMEOUT_S, slo_ms=OBJECTIVES["ttft_ms"])
    report: dict[str, Any] = run_pulse(options, quiet=True).report
    return report


def one_case(base: str, case: str, index: int, replicas: int, trace: Path,
             ) -> dict[str, Any]:
    from surge import serve
    from surge.serve.llm import build_openai_app

    app = f"{case}-r{index}"
    serve.run(build_openai_app({"llm_configs": [llm_config(case, replicas)]}), name=app,
              route_prefix=f"/{app}")
    try:
        report = pulse(f"{base}/{app}", trace)
    finally:
        serve.delete(app)
    summary = report["summary"]
    llm = summary.get("llm") or {}
    errors = summary["errors"]
    return {"case": case, "round": index, "sent": summary["sent"],
            "served": summary["ok"], "shed": llm.get("shed", errors.get("429", 0)),
            "5xx": sum(n for k, n in errors.items() if k.isdigit() and k.startswith("5")),
            "timeouts": errors.get("timeout", 0), "connection": errors.get("connection", 0),
            "unanswered": summary["unanswered"],
            "ttft_p99_ms": llm.get("p99_ttft_ms"), "tpot_p99_ms": llm.get("p99_tpot_ms"),
            "slo_served_pct": llm.get("goodput_pct"),
            "slo_answered_pct": llm.get("goodput_of_answered_pct")}


def sim_case(case: str, replicas: int, trace: Path, seed: int) -> dict[str, Any]:
    """One case through the simulator: the table's columns."""
    from surge.sim.scenario import Scenario
    from surge.sim.sweep import simulate

    seqs = int(ENGINE["max_num_seqs"])
    data = {"name": f"shed-pulse-{case}", "seed": seed, "slo_ms": OBJECTIVES["ttft_ms"],
            "cluster": {"nodes": 1, "replicas_per_node": replicas, "startup_s": 1},
            "traffic": {"timeout_s": TIMEOUT_S},
            "llm": {"engine": ENGINE, "trace": {"file": str(trace)}, "objectives": OBJECTIVES},
            "deployment": {"name": "LLM", "max_ongoing_requests": 2 * seqs,
                           "autoscaling_config": {
                               "min_replicas": replicas, "max_replicas": replicas,
                               "target_ongoing_requests": seqs,
                               "objectives": {**OBJECTIVES, "shed": case == "shed"}}}}
    run = simulate(Scenario.from_mapping(data, str(trace.parent / "sim.yaml"), trace.parent))
    summary, llm = run.summary, run.summary["llm_sim"]
    errors = summary["errors"]
    within = sum(row[3] for row in run.simulation.llm.finished)
    answered = llm["served"] + llm["shed"]
    return {"case": f"sim {case}", "round": seed, "sent": summary["sent"],
            "served": llm["served"], "shed": llm["shed"], "5xx": errors.get("503", 0),
            "timeouts": errors.get("timeout", 0), "connection": 0,
            "unanswered": summary["unanswered"], "ttft_p99_ms": llm["ttft_ms"]["p99"],
            "tpot_p99_ms": llm["tpot_ms"]["p99"],
            "slo_served_pct": round(100 * within / llm["served"], 2) if llm["served"] else None,
            "slo_answered_pct": round(100 * within / answered, 2) if answered else None}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--replicas", type=int, default=1)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--sim", action="store_true", help="the simulator's rows too")
    parser.add_argument("--sim-only", action="store_true", help="the simulator's rows only")
    args = parser.parse_args()
    from surge import serve

    # Replicas import from the repository's root, never from bench/ (its profile.py
    # shadows the standard library's): surge puts the main script's folder on their path.
    del sys.modules["__main__"].__file__
    os.environ.setdefault("SURGE_LOG_LEVEL", "WARNING")
    os.environ.setdefault("SURGE_ADDRESS", f"127.0.0.1:{free_port()}")
    port = free_port()
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="surge-shed-") as directory:
        trace = Path(directory) / "burstgpt.csv"
        count = make_trace(trace, args.seconds, args.seed)
        print(f"trace: {count} requests over {args.seconds:g} s, {BASE_RPS:g} req/s with a "
              f"{PEAK_FACTOR:g}x pulse, burstiness {BURSTINESS:g}; outputs / "
              f"{OUTPUT_DIVISOR}; budget {args.replicas} replica(s); objectives "
              f"{OBJECTIVES}", flush=True)
        if args.sim or args.sim_only:
            for case in CASES:
                rows.append(sim_case(case, args.replicas, trace, args.seed))
                print(f"  {rows[-1]}", flush=True)
        if not args.sim_only:
            serve.start(http_options={"host": "127.0.0.1", "port": port})
        try:
            for index in range(0 if args.sim_only else args.rounds):
                for case in CASES if index % 2 == 0 else CASES[::-1]:
                    rows.append(one_case(f"http://127.0.0.1:{port}", case, index,
                                         args.replicas, trace))
                    print(f"  {rows[-1]}", flush=True)
        finally:
            if not args.sim_only:
                serve.shutdown()
    keys = ("sent", "served", "shed", "5xx", "timeouts", "connection", "unanswered",
            "ttft_p99_ms", "tpot_p99_ms", "slo_served_pct", "slo_answered_pct")
    print("\n| case | round | " + " | ".join(keys) + " |")
    print("|---|---|" + "---|" * len(keys))
    for row in rows:
        print(f"| {row['case']} | {row['round']} | "
              + " | ".join(str(row[k]) for k in keys) + " |")
    summary = {}
    for case in (*CASES, *(f"sim {c}" for c in CASES)):
        mine = [r for r in rows if r["case"] == case]
        for key in ("slo_served_pct", "shed", "5xx", "timeouts", "ttft_p99_ms"):
            values = [r[key] for r in mine if r[key] is not None]
            if values:
                summary[f"{case.replace(' ', '_')}_{key}"] = statistics.median(values)
    print("summary: " + " ".join(f"{k}={v}" for k, v in summary.items()))


if __name__ == "__main__":
    main()
