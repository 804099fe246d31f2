"""Fast model loading: 8 replicas of a 2 GiB model, with and without the weight store.

    python bench/weights.py [--size-gib 2] [--tensors 256] [--replicas 8] [--hold 90]

A generated safetensors model (random float16 tensors, cached in
~/.cache/surge-bench/) is loaded by every replica of bench/apps/weights_surge.py, from
the node's weight store (`weights.load`) or from the file (`safetensors.numpy.load_file`,
each replica its own copy); each replica then reads a byte of every page of it.

1. Replicas: one replica, then `num_replicas` 8. Per replica, "asked for -> serving"
   is the controller's own log line (`replica ... is running (pid ..., started in X s)`)
   and the load time is the replica's (`weights.load` and building every array, or
   `load_file`); then the PSS of the 8 replicas (/proc/PID/smaps_rollup).
2. Pulse: min 1 / max 8 replicas (target 2 ongoing, 40 ms handler: ~100 req/s a
   replica), 40 req/s for 5 s, then 700 req/s open-loop for `--hold` s (long enough for
   the no-store run's copies to finish on a busy machine): time to capacity
   (bench/autoscale_step.py's rule: the first 100 ms served at >= 95% of offered that
   starts a 0.5 s window doing so) and failed requests (any non-2xx) after the step.

The no-store runs hold up to 8 private copies (16 GiB for the default model): before
each, the script checks MemAvailable and lowers the replica count (and says so) if the
copies would not fit with 2 GiB to spare. The last line is `summary: first_load_s=...
next_load_ms=... pss_ratio=... capacity_s_store=... capacity_s_file=...`: the store's
first load (its one copy from the file), the slowest of the 2nd-8th replicas' loads, the
8 store replicas' total PSS over one file replica's, and the two times to capacity.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import statistics
import struct
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.autoscale_step import CaseResult, analyse
from bench.common import (
    APPS,
    ROOT,
    cmdline,
    driver,
    exit_on_sigterm,
    free_port,
    pss_kib,
    surge_env,
)
from bench.openloop import run as open_loop

CACHE = Path.home() / ".cache" / "surge-bench"
GiB = 1 << 30
BASELINE_RPS, PEAK_RPS, BASELINE_S = 40.0, 700.0, 5.0
SPARE_BYTES = 2 * GiB  # what the no-store runs leave free at least
STARTED = re.compile(r"replica (\S+) of weights#Model is running \(pid (\d+), started in "
                     r"([\d.]+)s\)")
WEIGHTS = re.compile(r"WEIGHTS pid=(\d+) mode=(\w+) load_s=([\d.]+) touch_s=([\d.]+) "
                     r"hit=(\w+) materialise_s=([\d.]+) load_cpu_s=([\d.]+)")


# -- the model -----------------------------------------------------------------------------


def make_model(path: Path, size_gib: float, tensors: int) -> Path:
    """A safetensors file of `tensors` random float16 tensors, `size_gib` in all (kept)."""
    per = int(size_gib * GiB) // tensors // 2  # float16 items per tensor
    rows = 1024
    cols = max(1, per // rows)
    if path.exists():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    print(f"writing {path} ({tensors} float16 tensors of {rows}x{cols}) ...", flush=True)
    header: dict[str, Any] = {"__metadata__": {"made_by": "bench/weights.py"}}
    nbytes = rows * cols * 2
    for i in range(tensors):
        header[f"layers.{i}.weight"] = {"dtype": "F16", "shape": [rows, cols],
                                        "data_offsets": [i * nbytes, (i + 1) * nbytes]}
    text = json.dumps(header).encode()
    text += b" " * (-(len(text) + 8) % 8)
    rng = np.random.default_rng(20261201)
    partial = path.with_suffix(".partial")
    with open(partial, "wb") as out:
        out.write(struct.pack("<Q", len(text)) + text)
        for _ in range(tensors):
            bits = rng.integers(0, 1 << 16, size=rows * cols, dtype=np.uint16)
            out.write((bits & 0xBFFF).tobytes())  # exponent < 31: no inf or NaN
    partial.rename(path)
    return path


def mem_available() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    return 0


def fitting_replicas(wanted: int, model_bytes: int, already: int) -> int:
    """How many replicas with a private copy each fit (`already` copies are held)."""
    room = mem_available() - SPARE_BYTES
    return max(1, min(wanted, already + int(room // (model_bytes * 1.05))))


# -- part 1: replicas ----------------------------------------------------------------------


@dataclass
class Replica:
    pid: int
    order: int = 1 << 30  # when the controller saw it serving
    startup_s: float = float("nan")
    load_s: float = float("nan")
    touch_s: float = float("nan")
    hit: bool = False
    materialise_s: float = 0.0
    load_cpu_s: float = float("nan")
    pss_kib: int = 0


@dataclass
class ReplicasRun:
    mode: str
    replicas: list[Replica] = field(default_factory=list)  # in the order they started
    note: str = ""

    @property
    def total_pss_kib(self) -> int:
        return sum(r.pss_kib for r in self.replicas)


def parse_stderr(text: str) -> dict[int, Replica]:
    found: dict[int, Replica] = {}
    for order, match in enumerate(STARTED.finditer(text)):
        replica = found.setdefault(int(match.group(2)), Replica(int(match.group(2))))
        replica.startup_s, replica.order = float(match.group(3)), order
    for match in WEIGHTS.finditer(text):
        replica = found.setdefault(int(match.group(1)), Replica(int(match.group(1))))
        replica.load_s, replica.touch_s = float(match.group(3)), float(match.group(4))
        replica.hit, replica.materialise_s = match.group(5) == "True", float(match.group(6))
        replica.load_cpu_s = float(match.group(7))
    return found


def replica_pids(tree: list[int]) -> list[int]:
    return [pid for pid in tree if "surge:replica:weights:Model" in cmdline(pid)]


def run_replicas(mode: str, model: Path, wanted: int) -> ReplicasRun:
    result = ReplicasRun(mode)
    argv = [sys.executable, str(APPS / "weights_surge.py"), "--mode", mode, "--model",
            str(model), "--port", str(free_port())]
    env = {**surge_env(), "SURGE_LOG_LEVEL": "INFO"}
    with driver(f"weights-{mode}", argv, env) as running:
        running.wait_line("READY", 600)
        count = wanted
        if mode == "file":
            count = fitting_replicas(wanted, model.stat().st_size, already=1)
            if count < wanted:
                result.note = (f"only {count} replicas: {wanted} private copies would leave "
                               f"less than {SPARE_BYTES / GiB:.0f} GiB free")
        running.send(f"SCALE {count}")
        running.wait_line("SCALED", 900)
        pids = replica_pids(running.remember_tree())
        running.stderr.flush()
        running.stderr.seek(0)
        parsed = parse_stderr(running.stderr.read())
        for pid in pids:
            replica = parsed.get(pid, Replica(pid))
            replica.pss_kib = pss_kib(pid)
            result.replicas.append(replica)
    result.replicas.sort(key=lambda r: r.order)
    return result


# -- part 2: the pulse ---------------------------------------------------------------------


def run_pulse(mode: str, model: Path, hold_s: float) -> tuple[CaseResult, str]:
    note = ""
    max_replicas = 8
    if mode == "file":
        max_replicas = fitting_replicas(8, model.stat().st_size, already=0)
        if max_replicas < 8:
            note = f"max_replicas {max_replicas}: more private copies would not fit"
    port = free_port()
    argv = [sys.executable, str(APPS / "weights_surge.py"), "--mode", mode, "--model",
            str(model), "--port", str(port), "--autoscale", "--max-replicas",
            str(max_replicas)]
    replicas: list[tuple[float, int, int]] = []
    with driver(f"pulse-{mode}", argv, surge_env()) as running:
        running.wait_line("READY", 600)
        offset = len(running.lines)

        def rate(t: float) -> float:
            return BASELINE_RPS if t < BASELINE_S else PEAK_RPS

        start_wall, outcomes = asyncio.run(open_loop("127.0.0.1", port, "/model", rate,
                                                     BASELINE_S + hold_s))
        for _, line in running.lines[offset:]:
            parts = line.split()
            if len(parts) == 4 and parts[0] == "REPLICAS":
                replicas.append((float(parts[1]), int(parts[2]), int(parts[3])))
    result = CaseResult(f"pulse:{mode}", start_wall + BASELINE_S, outcomes, replicas)
    analyse(result, hold_s)
    return result, note


# -- report --------------------------------------------------------------------------------


def _ms(values: list[float]) -> str:
    if not values:
        return "-"
    return f"{statistics.median(values) * 1000:,.1f} / {max(values) * 1000:,.1f}"


def print_replicas(run: ReplicasRun) -> None:
    first, rest = run.replicas[:1], run.replicas[1:]
    print(f"\n== {run.mode}: {len(run.replicas)} replicas" + (f" ({run.note})" if run.note
                                                            else ""))
    print("   replica  pid      asked->serving s  load s    load CPU s  touch s   hit    "
          "PSS MiB")
    for index, r in enumerate(run.replicas, 1):
        print(f"   {index:7d}  {r.pid:<7d}  {r.startup_s:16.3f}  {r.load_s:8.4f}  "
              f"{r.load_cpu_s:10.4f}  {r.touch_s:8.4f}  {r.hit!s:5}  {r.pss_kib / 1024:9,.1f}")
    if first:
        print(f"   1st: serving after {first[0].startup_s:.2f} s, load {first[0].load_s:.3f} s")
    print(f"   2nd-{len(run.replicas)}th (median / max): asked->serving "
          f"{_ms([r.startup_s for r in rest])} ms, load {_ms([r.load_s for r in rest])} ms")
    print(f"   total PSS of the replicas: {run.total_pss_kib / 1024:,.0f} MiB")


def main() -> None:
    exit_on_sigterm()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-gib", type=float, default=2.0)
    parser.add_argument("--tensors", type=int, default=256)
    parser.add_argument("--replicas", type=int, default=8)
    parser.add_argument("--hold", type=float, default=90.0, help="seconds at the peak")
    parser.add_argument("--model", type=Path, default=None)
    args = parser.parse_args()
    model = make_model(args.model or CACHE / f"weights-{args.size_gib:g}gib-"
                       f"{args.tensors}.safetensors", args.size_gib, args.tensors)
    size = model.stat().st_size
    print(f"model: {model} ({size / GiB:.2f} GiB, {args.tensors} tensors); load average "
          f"{os.getloadavg()[0]:.1f}, {mem_available() / GiB:.1f} GiB available", flush=True)
    runs = {}
    for mode in ("store", "file"):
        print(f"\nreplicas, {mode}: 1 then {args.replicas} ...", flush=True)
        runs[mode] = run_replicas(mode, model, args.replicas)
        print_replicas(runs[mode])
    pulses = {}
    for mode in ("store", "file"):
        print(f"\npulse, {mode}: {BASELINE_RPS:g} req/s for {BASELINE_S:g} s, then "
              f"{PEAK_RPS:g} req/s for {args.hold:g} s ...", flush=True)
        pulses[mode] = run_pulse(mode, model, args.hold)
        s = pulses[mode][0].summary
        print(f"   time to capacity {s['capacity_s']:.2f} s, failed {s['failed']:.2%}, p99 "
              f"{s['p99_ms']:.0f} ms, max replicas {s['max_replicas']:.0f}"
              + (f" ({pulses[mode][1]})" if pulses[mode][1] else ""))
    store, file = runs["store"], runs["file"]
    one_copy = file.replicas[0].pss_kib if file.replicas else float("nan")
    print("\n| | store | file |\n|---|---|---|")
    print(f"| 1st replica: asked -> serving | {store.replicas[0].startup_s:.2f} s | "
          f"{file.replicas[0].startup_s:.2f} s |")
    print(f"| 1st replica: load | {store.replicas[0].load_s:.2f} s | "
          f"{file.replicas[0].load_s:.2f} s |")
    print(f"| 2nd-8th: asked -> serving, median / max | "
          f"{_ms([r.startup_s for r in store.replicas[1:]])} ms | "
          f"{_ms([r.startup_s for r in file.replicas[1:]])} ms |")
    print(f"| 2nd-8th: load, median / max | {_ms([r.load_s for r in store.replicas[1:]])} ms | "
          f"{_ms([r.load_s for r in file.replicas[1:]])} ms |")
    print(f"| 2nd-8th: load's CPU time, median / max | "
          f"{_ms([r.load_cpu_s for r in store.replicas[1:]])} ms | "
          f"{_ms([r.load_cpu_s for r in file.replicas[1:]])} ms |")
    print(f"| total PSS, {len(store.replicas)} / {len(file.replicas)} replicas | "
          f"{store.total_pss_kib / 1024:,.0f} MiB ({store.total_pss_kib / one_copy:.2f}x one "
          f"copy) | {file.total_pss_kib / 1024:,.0f} MiB "
          f"({file.total_pss_kib / one_copy:.2f}x) |")
    for label, key, fmt in (("pulse: time to capacity", "capacity_s", "{:.2f} s"),
                            ("pulse: failed after the step", "failed", "{:.2%}"),
                            ("pulse: p99 of the served", "p99_ms", "{:.0f} ms")):
        print(f"| {label} | {fmt.format(pulses['store'][0].summary[key])} | "
              f"{fmt.format(pulses['file'][0].summary[key])} |")
    out = ROOT / "reports" / "weights.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps({
        "model_bytes": size,
        "replicas": {m: [r.__dict__ for r in run.replicas] for m, run in runs.items()},
        "notes": {m: run.note for m, run in runs.items()},
        "pulse": {m: {"summary": c.summary, "series": c.rows, "note": n}
                  for m, (c, n) in pulses.items()}}, indent=1))
    print(f"\nseries written to {out}; load average now {os.getloadavg()[0]:.1f}")
    next_load = max((r.load_s for r in store.replicas[1:]), default=float("nan"))
    print(f"summary: first_load_s={store.replicas[0].load_s:.2f} "
          f"next_load_ms={next_load * 1000:.1f} pss_ratio={store.total_pss_kib / one_copy:.2f} "
          f"capacity_s_store={pulses['store'][0].summary['capacity_s']:.2f} "
          f"capacity_s_file={pulses['file'][0].summary['capacity_s']:.2f}")


if __name__ == "__main__":
    main()
