"""LLM serving: surge's OpenAI app vs vLLM's own OpenAI server, same engine, same model.

    make llm-env && .venv-llm/bin/python bench/llm.py            # ~10 min on 2 cores
    .venv-llm/bin/python bench/llm.py --quick                    # shorter runs, no pulse

Both serve the tiny random Llama of surge.testing.tiny_llm with the same engine
arguments, one after the other (never at once: 2 cores). vLLM's server is
`python -m vllm.entrypoints.openai.api_server` from the same install; surge runs a Ray
Serve LLM config file (`import_path: ray.serve.llm:build_openai_app`) with `surge run`.
Closed-loop users (bench/llm_client.py) stream chat completions of a fixed length
(`ignore_eos`) at c = 1, 8, 32: TTFT and ITL p50/p99, output tokens/s, and CPU seconds
of each server's processes per 1,000 output tokens.

The pulse: surge with `autoscaling_config {min_replicas: 1, max_replicas: 2}`, 2 users,
then 24 within 0.5 s, held long enough for a second replica to start; every request must
end in a 200 or a fast 429/503 (never a timeout). Its table (per 5 s: users, answers by
status, TTFT p99, tokens/s, replicas) and JSON go to reports/llm-bench-TIME/.

The last line is `summary: key=value ...` (ttft_overhead_p50_ms_c1,
ttft_overhead_p99_ms_c1, tokens_per_s_ratio_c32, pulse_unanswered, pulse_timeouts).
Figures vary with what else the machine runs; read them side by side, in one run.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parent.parent
# Not bench/ itself: bench/profile.py would shadow the standard library's `profile`,
# which torch imports (through cProfile).
sys.path[:] = [str(ROOT / "src"), str(ROOT)] + [
    p for p in sys.path if Path(p or ".").resolve() != ROOT / "bench"]

from bench.common import cpu_seconds, free_port, process_tree  # noqa: E402
from bench.llm_client import Result, chat_body, run_users  # noqa: E402

MODEL_DIR = Path.home() / ".cache" / "surge-bench" / "tiny-llama-v2"
MAX_TOKENS = 64
MAX_NUM_SEQS = 32
ENGINE = {"dtype": "float32", "enforce_eager": True, "max_model_len": 256,
          "max_num_seqs": MAX_NUM_SEQS, "kv_cache_memory_bytes": 256 * 1024 * 1024}
ENV = {"VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1", "HF_HUB_OFFLINE": "1",
       "TOKENIZERS_PARALLELISM": "false", "SURGE_LOG_LEVEL": "WARNING"}
PROMPT = "Hello! Please tell me about the quick brown fox and the lazy dog."
START_TIMEOUT_S = 600


@contextmanager
def server(name: str, argv: list[str], port: int, log: Path,
           env: dict[str, str] | None = None) -> Iterator[subprocess.Popen[bytes]]:
    """Start `argv` in its own process group, wait for /v1/models, stop the group after."""
    with open(log, "wb") as out:
        process = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT,
                                   env={**os.environ, **ENV, **(env or {}),
                                        # surge from this checkout (the LLM venv has none)
                                        "PYTHONPATH": f"{ROOT / 'src'}{os.pathsep}{ROOT}"},
                                   start_new_session=True, cwd=log.parent)
    try:
        began = time.monotonic()
        while True:
            if process.poll() is not None:
                raise SystemExit(f"{name} exited:\n{log.read_text()[-3000:]}")
            if time.monotonic() - began > START_TIMEOUT_S:
                raise SystemExit(f"{name} not ready in {START_TIMEOUT_S}s")
            try:
                if httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=5).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(1)
        print(f"{name}: ready in {time.monotonic() - began:.0f} s", flush=True)
        yield process
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGTERM)
            try:
                process.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()


def vllm_argv(port: int) -> list[str]:
    return [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model",
            str(MODEL_DIR), "--served-model-name", "tiny", "--dtype", "float32",
            "--enforce-eager", "--max-model-len", str(ENGINE["max_model_len"]),
            "--max-num-seqs", str(MAX_NUM_SEQS), "--kv-cache-memory-bytes",
            str(ENGINE["kv_cache_memory_bytes"]), "--host", "127.0.0.1", "--port", str(port),
            "--disable-uvicorn-access-log"]


def surge_config(port: int, deployment: dict[str, Any]) -> str:
    llm = {"model_loading_config": {"model_id": "tiny", "model_source": str(MODEL_DIR)},
           "engine_kwargs": ENGINE, "deployment_config": deployment}
    config = {"http_options": {"host": "127.0.0.1", "port": port},
              "applications": [{"name": "llm", "route_prefix": "/",
                                "import_path": "ray.serve.llm:build_openai_app",
                                "args": {"llm_configs": [llm]}}]}
    return json.dumps(config)  # JSON is YAML


def pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * len(ordered) + 0.5) - 1))]


def measure(port: int, users: int, duration_s: float, pids: list[int]) -> dict[str, Any]:
    body = chat_body("tiny", MAX_TOKENS, PROMPT)
    asyncio.run(run_users("127.0.0.1", port, min(users, 4), 3.0, body))  # warm up
    cpu0, t0 = cpu_seconds(pids), time.perf_counter()
    results = asyncio.run(run_users("127.0.0.1", port, users, duration_s, body))
    wall, cpu = time.perf_counter() - t0, cpu_seconds(pids) - cpu0
    ok = [r for r in results if r.status == 200 and not r.error]
    ttft = [r.ttft_s * 1000 for r in ok if r.ttft_s is not None]
    gaps = [g * 1000 for r in ok for g in r.gaps_s]
    tokens = sum(r.tokens for r in ok)
    return {"users": users, "requests": len(results), "ok": len(ok),
            "ttft_p50_ms": pct(ttft, 0.5), "ttft_p99_ms": pct(ttft, 0.99),
            "itl_p50_ms": pct(gaps, 0.5), "itl_p99_ms": pct(gaps, 0.99),
            "tokens_per_s": tokens / wall, "cpu_s_per_1k_tokens": 1000 * cpu / max(tokens, 1),
            "mean_request_s": statistics.fmean(r.done - r.started for r in ok) if ok else None}


def run_system(name: str, argv: list[str], port: int, out: Path, levels: list[int],
               duration_s: float, env: dict[str, str] | None = None) -> list[dict[str, Any]]:
    rows = []
    with server(name, argv, port, out / f"{name}.log", env) as process:
        pids = process_tree(process.pid)
        for users in levels:
            row = {"system": name, **measure(port, users, duration_s, pids)}
            rows.append(row)
            print(f"  {name:6} c={users:<3} ttft p50 {row['ttft_p50_ms']:.1f} ms  p99 "
                  f"{row['ttft_p99_ms']:.1f} ms  itl p50 {row['itl_p50_ms']:.1f} ms  "
                  f"{row['tokens_per_s']:,.0f} tok/s  {row['cpu_s_per_1k_tokens']:.2f} "
                  f"cpu-s/1k tok  ({row['ok']}/{row['requests']} ok)", flush=True)
    return rows


async def pulse_run(port: int, control: str, hold_s: float) -> dict[str, Any]:
    from surge.loadtest.replicas import ReplicaSampler

    sampler = await ReplicaSampler.connect(control, "flag", "127.0.0.1", port, "/", print)
    stop = asyncio.Event()
    t0 = time.monotonic()
    sampling = asyncio.get_running_loop().create_task(
        sampler.run(t0, stop)) if sampler is not None else None
    ramp = [(0.0, 2)] + [(5.0 + 0.5 * i / 11, 2 + 2 * i) for i in range(1, 12)]  # 2 -> 24
    results = await run_users("127.0.0.1", port, 24, 5.0 + hold_s,
                              chat_body("tiny", MAX_TOKENS, PROMPT), ramp=ramp, timeout_s=30)
    stop.set()
    samples = await sampling if sampling is not None else []
    if sampler is not None:
        sampler.close()
    return {"results": results, "replicas": [(s.t, s.running, s.target) for s in samples]}


def pulse_table(run: dict[str, Any], step_s: float = 5.0) -> tuple[list[dict[str, Any]],
                                                                     dict[str, Any]]:
    results: list[Result] = run["results"]
    replicas: list[tuple[float, int, int]] = run["replicas"]
    end = max((r.done for r in results), default=0.0)
    rows = []
    t = 0.0
    while t < end:
        here = [r for r in results if t <= r.started < t + step_s]
        ttft = [r.ttft_s * 1000 for r in here if r.status == 200 and r.ttft_s is not None]
        done = [r for r in results if t <= r.done < t + step_s and r.status == 200]
        seen = [s for s in replicas if t <= s[0] < t + step_s]
        rows.append({"t": t, "sent": len(here),
                     "ok": sum(r.status == 200 and not r.error for r in here),
                     "rejected": sum(r.status in (429, 503) for r in here),
                     "timeouts": sum(r.error == "timeout" for r in here),
                     "ttft_p99_ms": pct(ttft, 0.99),
                     "tokens_per_s": sum(r.tokens for r in done) / step_s,
                     "replicas": max((s[1] for s in seen), default=None)})
        t += step_s
    second = next((s[0] for s in replicas if s[1] >= 2), None)
    rejected = [r for r in results if r.status in (429, 503)]
    totals = {"requests": len(results), "ok": sum(r.status == 200 for r in results),
              "rejected": len(rejected),
              "rejected_p99_ms": pct([(r.done - r.started) * 1000 for r in rejected], 0.99),
              "timeouts": sum(r.error == "timeout" for r in results),
              "unanswered": sum(bool(r.error) or r.status == 0 for r in results),
              "other_status": sum(r.status not in (0, 200, 429, 503) for r in results),
              "second_replica_at_s": second}
    return rows, totals


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="short runs and no pulse")
    parser.add_argument("--duration", type=float, default=20.0, help="seconds per level")
    parser.add_argument("--hold", type=float, default=150.0,
                        help="seconds of the pulse at 24 users")
    args = parser.parse_args()
    duration = 8.0 if args.quick else args.duration
    out = ROOT / "reports" / f"llm-bench-{time.strftime('%Y%m%d-%H%M%S')}"
    out.mkdir(parents=True, exist_ok=True)
    from surge.testing.tiny_llm import make_tiny_llama

    make_tiny_llama(MODEL_DIR)
    levels = [1, 8, 32]
    print(f"tiny Llama at {MODEL_DIR}; {MAX_TOKENS} output tokens a request; "
          f"{duration:g} s per level; logs in {out}", flush=True)
    port = free_port()
    rows = run_system("vllm", vllm_argv(port), port, out, levels, duration)
    port = free_port()
    config = out / "surge.yaml"
    config.write_text(surge_config(port, {"num_replicas": 1}))
    control = f"127.0.0.1:{free_port()}"
    rows += run_system("surge", [sys.executable, "-m", "surge.cli.main", "run", str(config)],
                       port, out, levels, duration, {"SURGE_ADDRESS": control})
    by = {(r["system"], r["users"]): r for r in rows}
    summary: dict[str, Any] = {
        "ttft_overhead_p50_ms_c1": by["surge", 1]["ttft_p50_ms"] - by["vllm", 1]["ttft_p50_ms"],
        "ttft_overhead_p99_ms_c1": by["surge", 1]["ttft_p99_ms"] - by["vllm", 1]["ttft_p99_ms"],
        "tokens_per_s_ratio_c32": by["surge", 32]["tokens_per_s"]
        / by["vllm", 32]["tokens_per_s"]}
    report: dict[str, Any] = {"levels": rows}
    if not args.quick:
        port = free_port()
        config = out / "surge-pulse.yaml"
        config.write_text(surge_config(port, {
            "autoscaling_config": {"min_replicas": 1, "max_replicas": 2,
                                   "target_ongoing_requests": 8},
            "max_queued_requests": 16}))
        control = f"127.0.0.1:{free_port()}"
        print(f"pulse: 2 -> 24 users in 0.5 s at t=5 s, held {args.hold:g} s, "
              "min_replicas 1, max_replicas 2", flush=True)
        with server("surge-pulse", [sys.executable, "-m", "surge.cli.main", "run",
                                    str(config)], port, out / "surge-pulse.log",
                    {"SURGE_ADDRESS": control}):
            run = asyncio.run(pulse_run(port, control, args.hold))
        table, totals = pulse_table(run)
        for row in table:
            print(f"  t={row['t']:5.0f}s sent {row['sent']:4} ok {row['ok']:4} 429/503 "
                  f"{row['rejected']:3} timeouts {row['timeouts']:2} ttft p99 "
                  f"{row['ttft_p99_ms'] or 0:7.1f} ms  {row['tokens_per_s']:6.0f} tok/s  "
                  f"replicas {row['replicas']}", flush=True)
        print(f"  totals: {totals}", flush=True)
        report["pulse"] = {"table": table, "totals": totals, "replicas": run["replicas"]}
        summary.update(pulse_unanswered=totals["unanswered"], pulse_timeouts=totals["timeouts"],
                       pulse_rejected=totals["rejected"],
                       pulse_second_replica_at_s=totals["second_replica_at_s"])
    (out / "report.json").write_text(json.dumps({**report, "summary": summary}, indent=1,
                                                default=str))
    print("summary: " + " ".join(
        f"{k}={v:.3f}" if isinstance(v, float) else f"{k}={v}" for k, v in summary.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
