"""The simulator against a real run: one BurstGPT-shaped trace, mock engines, autoscaling on.

    .venv/bin/python bench/llm_sim_vs_real.py [--minutes 10] [--sim-only] [--out DIR]

A BurstGPT-shaped trace (surge.loadtest.traces' lengths, gamma burstiness 0.25) whose
mean rate is `--low` req/s for the first fifth, `--high` for the next two fifths, then
`--low` again, is written as a BurstGPT CSV and replayed twice:

* real: surge on this machine (bench/apps/llm_autoscale_app.py: `build_openai_app` on
  `surge.testing:MockVLLMEngine` with `ENGINE` as its engine_kwargs, the proactive
  policy), driven by `surge pulse --trace` (streamed chats, TTFT from each request's
  scheduled time, replica counts sampled every 0.1 s);
* simulated: `surge simulate` with an `llm:` section naming the same file, the same
  engine timing, deployment and objectives, and the replicas' start-up the controller
  logged in the real run ("started in X s"; 2 s with --sim-only).

Printed side by side: TTFT and TPOT p50/p90/p99, SLO attainment (TTFT and TPOT within
OBJECTIVES), running replicas per 30 s window and replica-seconds, with sim/real ratios.
Last line: `summary: ...`. Hold /tmp/surge-bench.lock around a real run.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import ROOT, free_port
from surge.loadtest.llm import LLMPreset
from surge.loadtest.options import PulseOptions
from surge.loadtest.runner import run_pulse
from surge.loadtest.schedule import Schedule
from surge.loadtest.slo import Slo
from surge.loadtest.traces import write_burstgpt
from surge.sim.llm_report import TIMELINE_S
from surge.sim.llm_spec import shaped_trace
from surge.sim.scenario import Scenario
from surge.sim.sweep import simulate

APP = Path(__file__).resolve().parent / "apps" / "llm_autoscale_app.py"
# Steps of 20 ms + 2 ms per sequence, 8 sequences: ~220 tokens/s an engine, ~0.65
# BurstGPT requests/s at a full batch; prefill 20 µs a token.
ENGINE = {"step_s": 0.02, "decode_s_per_seq": 0.002, "prefill_s_per_token": 0.00002,
          "max_num_seqs": 8, "max_num_batched_tokens": 2048, "num_blocks": 4096,
          "block_size": 16, "max_model_len": 4096}
DEPLOYMENT = {"max_ongoing_requests": 16, "max_queued_requests": 1000,
              "autoscaling_config": {"min_replicas": 1, "max_replicas": 6,
                                     "target_ongoing_requests": 8, "downscale_delay_s": 60}}
OBJECTIVES = {"ttft_ms": 2000.0, "tpot_ms": 100.0}
TIMEOUT_S = 300.0  # a stream may run this long from its scheduled time
DEFAULT_STARTUP_S = 2.0
STARTED = re.compile(r"started in ([\d.]+)s")


def make_trace(minutes: float, low: float, high: float, seed: int, path: Path) -> int:
    span = minutes * 60
    schedule = Schedule.from_spec([{"rps": low, "for_s": 0.2 * span},
                                   {"rps": high, "for_s": 0.4 * span},
                                   {"rps": low, "for_s": 0.4 * span}])
    trace = shaped_trace("burstgpt", schedule, 0.25, random.Random(seed),
                         int(ENGINE["max_model_len"]))
    write_burstgpt(trace, path)
    return len(trace)


def run_real(trace: Path, out: Path) -> tuple[dict[str, Any], list[float]]:
    """The pulse's report and the start-up times the controller logged."""
    port, control = free_port(), f"127.0.0.1:{free_port()}"
    env = {**os.environ, "SURGE_ADDRESS": control, "SURGE_LOG_LEVEL": "INFO",
           "PYTHONPATH": str(ROOT / "src")}
    log = out / "surge.log"
    config = json.dumps({"engine_kwargs": ENGINE, "deployment": DEPLOYMENT})
    with log.open("w") as stderr:
        process = subprocess.Popen([sys.executable, str(APP), str(port), config],
                                   stdout=subprocess.PIPE, stderr=stderr, text=True, env=env,
                                   cwd=ROOT, start_new_session=True)
    try:
        assert process.stdout is not None
        line = process.stdout.readline()
        if not line.startswith("READY"):
            raise RuntimeError(f"the app did not start: {line!r}; see {log}")
        before = len(STARTED.findall(log.read_text()))
        preset = LLMPreset(kind="chat", model="mock", trace=str(trace),
                           goodput=Slo.parse([f"ttft:{OBJECTIVES['ttft_ms']:g}",
                                              f"tpot:{OBJECTIVES['tpot_ms']:g}"]))
        options = PulseOptions(url=line.split()[1], schedule=preset.trace_schedule(),
                               llm=preset, timeout_s=TIMEOUT_S, slo_ms=OBJECTIVES["ttft_ms"],
                               surge_address=control)
        report = run_pulse(options, quiet=True).report
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGTERM)
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
    startups = [float(x) for x in STARTED.findall(log.read_text())[before:]]
    (out / "real.json").write_text(json.dumps(report, indent=1) + "\n")
    (out / "startups.json").write_text(json.dumps(startups) + "\n")
    return report, startups


def run_sim(trace: Path, startup_s: float, out: Path) -> dict[str, Any]:
    scenario = {
        "name": "llm-sim-vs-real", "seed": 1, "slo_ms": OBJECTIVES["ttft_ms"],
        "cluster": {"nodes": 1, "replicas_per_node": 16, "startup_s": startup_s},
        "traffic": {"timeout_s": TIMEOUT_S},
        "llm": {"engine": ENGINE, "trace": {"file": str(trace)}, "routing": "engine_score",
                "objectives": OBJECTIVES},
        "deployment": {"name": "LLM", **DEPLOYMENT}}
    run = simulate(Scenario.from_mapping(scenario, str(out / "scenario.yaml"), out))
    (out / "sim.json").write_text(json.dumps(run.report, indent=1) + "\n")
    return run.report


def real_timeline(report: dict[str, Any], end_s: float) -> list[float | None]:
    windows: list[list[float]] = [[] for _ in range(max(1, math.ceil(end_s / TIMELINE_S)))]
    for point in report["series"]:
        index = int(point["t"] // TIMELINE_S)
        if point.get("replicas") is not None and 0 <= index < len(windows):
            windows[index].append(point["replicas"])
    return [round(sum(w) / len(w), 2) if w else None for w in windows]


def _ratio(sim: float | None, real: float | None) -> str:
    return f"{sim / real:.2f}" if sim is not None and real else "-"


def _v(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def compare(real: dict[str, Any] | None, sim: dict[str, Any], end_s: float) -> dict[str, Any]:
    s = sim["summary"]["llm_sim"]
    r = real["summary"].get("llm") if real else None
    rows = []
    for metric in ("ttft", "tpot"):
        for q, key in (("p50", "median"), ("p90", "p90"), ("p99", "p99")):
            rows.append((f"{metric.upper()} {q} (ms)", r[f"{key}_{metric}_ms"] if r else None,
                         s[f"{metric}_ms"][q]))
    good = r["goodput_pct"] / 100 if r and r.get("goodput_pct") is not None else None
    rows.append(("SLO attainment", good, s["slo_attainment"]))
    sim_line = s["replica_timeline"]
    real_line = real_timeline(real, end_s) if real else [None] * len(sim_line)
    real_rs = sum(v for v in real_line if v is not None) * TIMELINE_S if real else None
    sim_rs = sum(sim_line) * TIMELINE_S
    rows.append(("running replica-seconds", real_rs, sim_rs))
    print("| figure | real | simulated | sim/real |\n|---|--:|--:|--:|")
    for label, rv, sv in rows:
        digits = 3 if label == "SLO attainment" else 1
        print(f"| {label} | {_v(rv, digits)} | {_v(sv, digits)} | {_ratio(sv, rv)} |")
    print(f"\nrunning replicas, mean per {TIMELINE_S:g} s window (real / simulated):")
    errors = []
    for index, sv in enumerate(sim_line):
        rv = real_line[index] if index < len(real_line) else None
        if rv:
            errors.append(abs(sv - rv) / rv)
        print(f"  {index * TIMELINE_S:>5.0f} s  {_v(rv, 2):>6} / {sv:>5.2f}  "
              f"{_ratio(sv, rv):>5}")
    return {"p99_ttft_ratio": _ratio(s["ttft_ms"]["p99"], r["p99_ttft_ms"] if r else None),
            "p99_tpot_ratio": _ratio(s["tpot_ms"]["p99"], r["p99_tpot_ms"] if r else None),
            "replica_seconds_ratio": _ratio(sim_rs, real_rs),
            "timeline_mean_abs_error": f"{sum(errors) / len(errors):.3f}" if errors else "-",
            "timeline_windows_within_15pct": (f"{sum(e <= 0.15 for e in errors)}/{len(errors)}"
                                              if errors else "-")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--low", type=float, default=0.5, help="req/s before and after")
    parser.add_argument("--high", type=float, default=2.0, help="req/s in the middle")
    parser.add_argument("--seed", type=int, default=3)
    parser.add_argument("--sim-only", action="store_true")
    parser.add_argument("--reuse", action="store_true",
                        help="simulate again against the real run already in --out")
    parser.add_argument("--out", default=f"reports/llm-sim-vs-real-{time.strftime('%H%M%S')}")
    args = parser.parse_args()
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    trace = out / "trace.csv"
    if not args.reuse:
        count = make_trace(args.minutes, args.low, args.high, args.seed, trace)
        print(f"trace: {count} BurstGPT-shaped requests over {args.minutes:g} min "
              f"({args.low:g} -> {args.high:g} -> {args.low:g} req/s, burstiness 0.25), "
              f"{trace}", flush=True)
    if args.reuse:
        real = json.loads((out / "real.json").read_text())
        startups = json.loads((out / "startups.json").read_text())
    else:
        real, startups = (None, []) if args.sim_only else run_real(trace, out)
    startup = (round(sum(startups) / len(startups), 3) if startups else DEFAULT_STARTUP_S)
    print(f"replica start-up: {startup} s ({len(startups)} measured: "
          f"{', '.join(f'{s:.2f}' for s in startups) or 'none, assumed'})", flush=True)
    started = time.perf_counter()
    sim = run_sim(trace, startup, out)
    print(f"simulated in {time.perf_counter() - started:.1f} s\n", flush=True)
    summary = compare(real, sim, args.minutes * 60)
    sim_llm = sim["summary"]["llm_sim"]
    summary.update(sim_first_up_s=sim_llm["first_scale_up_s"],
                   sim_direction_changes=sim_llm["direction_changes"], startup_s=startup)
    print("\nsummary: " + " ".join(f"{k}={v}" for k, v in summary.items()))


if __name__ == "__main__":
    main()
