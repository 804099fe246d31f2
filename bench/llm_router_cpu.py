"""The LLM router's cost on the real data path: proxy CPU per routed chat request.

    .venv/bin/python bench/llm_router_cpu.py [--replicas 4] [--duration 8] \
        [--ttft-connections 150]

One surge instance (bench/apps/llm_mock_app.py) serves an OpenAI app on mock vLLM
engines (0.2 ms steps: never the limit), the same app with prefix routing off
(`request_router_kwargs: {prefix_routing: false}`, at /off) and a plain POST echo. wrk
posts the same chat body to the three, in turns: to `/v1/chat/completions` it takes the
LLM path (the prompt read into chunk names, the prefix index, the engine-score choice,
the chat answer), to `/off/...` the LLM path without the prompt read and the index, to
`/echo` the same proxy path without any of it. With `--ttft-connections N`, then N
connections post the 220 KB chat to the LLM path with prefix routing on and off, in
turns: its latency (one token, not streamed) is the first token's, so their p99s' gap is
what prefix routing adds to TTFT at that concurrency (the mock replicas, on the same
cores, make that p99 noisy); `--choose-times` also times, in the proxy, what routing
holds each request between its body and its send (bench/apps/choose_timer: the prompt
read into chunk names, the index and the choice, for each attempt of a queued request)
and prints its p50/p99 with prefix routing on and off in that phase. The proxy's
CPU per request on each (less its idle CPU, measured first) and their difference, for a
short chat (~300 bytes) and a 220 KB one, with `max_tokens: 1` and no streaming. "Routed
requests/s per proxy core" is 1 / (proxy CPU per LLM request). Replicas' CPU is left out (the mock
engine tokenises 220 KB of words per request). The machine's other load moves wall-clock
figures more than CPU per request: read the difference within one run. Last line:
`summary: ...`.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import cmdline, cpu_seconds, free_port, run_wrk, start_system

ROOT = Path(__file__).resolve().parent.parent
# the LLM path; the same with prefix routing off (request_router_kwargs); a plain echo
PATHS = ("/v1/chat/completions", "/off/v1/chat/completions", "/echo")


def chat_body(system_bytes: int) -> str:
    words = " ".join(f"w{i % 997}" for i in range(system_bytes // 5))[:system_bytes]
    return json.dumps({"model": "mock", "max_tokens": 1, "ignore_eos": True,
                       "messages": [{"role": "system", "content": words},
                                    {"role": "user", "content": "which shoes are red?"}]})


def lua_script(body: str, directory: Path) -> Path:
    path = directory / f"post-{len(body)}.lua"
    path.write_text('wrk.method = "POST"\n'
                    'wrk.headers["content-type"] = "application/json"\n'
                    f"wrk.body = {json.dumps(body)}\n")
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--replicas", type=int, default=4)
    parser.add_argument("--duration", type=float, default=8.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--ttft-connections", type=int, default=0,
                        help="then 220 KB chats (max_tokens 1: latency ~ TTFT) from this "
                        "many connections, prefix routing on and off in turns")
    parser.add_argument("--choose-times", action="store_true",
                        help="time what routing holds each request in the proxy "
                        "(a bench-only hook)")
    args = parser.parse_args()
    port = free_port()
    times_dir = tempfile.mkdtemp(prefix="surge-choose-") if args.choose_times else ""
    env = {"SURGE_BENCH_CHOOSE_TIMES": times_dir, "PYTHONPATH": os.pathsep.join(
        p for p in (str(ROOT / "bench" / "apps" / "choose_timer"),
                    os.environ.get("PYTHONPATH", "")) if p)} if times_dir else None
    taken = 0
    rows: dict[str, dict[str, list[float]]] = {}
    with tempfile.TemporaryDirectory() as tmp, start_system(
            "surge", [sys.executable, str(ROOT / "bench" / "apps" / "llm_mock_app.py"),
                      str(port), str(args.replicas)], env=env, timeout_s=300) as system:
        proxy = [p for p in system.pids() if "surge:proxy" in cmdline(p)]
        assert proxy, "no proxy process found"
        before = cpu_seconds(proxy)
        time.sleep(args.duration)
        idle_us_per_s = (cpu_seconds(proxy) - before) / args.duration * 1e6
        print(f"  proxy idle: {idle_us_per_s:,.0f} µs of CPU per second", flush=True)
        for name, size, connections in (("short", 300, 32), ("220kb", 220_000, 8)):
            script = lua_script(chat_body(size), Path(tmp))
            for _ in range(args.rounds):
                for path in PATHS:
                    result = run_wrk(f"{system.url}{path}", connections, args.duration,
                                     proxy, script=str(script))
                    if result.non_2xx or result.errors:
                        raise RuntimeError(f"{path} ({name}): {result}")
                    row = rows.setdefault(f"{name} {path}", {"cpu": [], "rps": [], "p99": []})
                    # less what the proxy spends idle (routing-stats frames, telemetry)
                    # over the run: at 100 req/s it would add ~100x its share
                    idle = idle_us_per_s * max(1, round(args.duration)) / result.requests
                    row["cpu"].append(result.cpu_us_per_request - idle)
                    row["rps"].append(result.rps)
                    row["p99"].append(result.p99_ms)
                    print(f"  {name} {path}: {result.rps:,.0f} req/s, proxy "
                          f"{result.cpu_us_per_request:,.0f} µs/req, p99 {result.p99_ms} ms",
                          flush=True)
        rows_ttft: dict[str, list[tuple[float, float]]] = {}
        if times_dir:
            taken = len(choose_times(times_dir, proxy))
        if args.ttft_connections:
            script = lua_script(chat_body(220_000), Path(tmp))
            for i in range(args.rounds):
                paths = PATHS[:2] if i % 2 == 0 else PATHS[1::-1]
                for path in paths:
                    result = run_wrk(f"{system.url}{path}", args.ttft_connections,
                                     args.duration, proxy, script=str(script))
                    if result.non_2xx:
                        raise RuntimeError(f"{path} (220kb x {args.ttft_connections}): "
                                           f"{result}")
                    rows_ttft.setdefault(path, []).append((result.p50_ms, result.p99_ms))
                    # (a socket error here is wrk's 5 s timeout: the mock replicas'
                    # tokenising sets this phase's rate, and 150 connections queue on it)
                    print(f"  220kb x {args.ttft_connections} {path}: {result.rps:,.0f} "
                          f"req/s, p50 {result.p50_ms} ms p99 {result.p99_ms} ms, "
                          f"{result.errors} over 5 s", flush=True)
        choices = choose_times(times_dir, proxy)[taken:] if times_dir else []
    print()
    print(f"{args.replicas} mock replicas; medians of {args.rounds} interleaved rounds; proxy "
          f"idle {idle_us_per_s:,.0f} µs/s taken out")
    print("| body | path | proxy CPU µs/req | req/s | p99 ms |")
    print("|---|---|---|---|---|")
    summary = {}
    for key, row in rows.items():
        cpu = statistics.median(row["cpu"])
        runs = ", ".join(f"{c:.0f}" for c in row["cpu"])
        print(f"| {key.replace(' ', ' | ')} | {cpu:,.0f} ({runs}) | "
              f"{statistics.median(row['rps']):,.0f} | {statistics.median(row['p99']):.2f} |")
    for name in ("short", "220kb"):
        llm = statistics.median(rows[f"{name} /v1/chat/completions"]["cpu"])
        off = statistics.median(rows[f"{name} /off/v1/chat/completions"]["cpu"])
        echo = statistics.median(rows[f"{name} /echo"]["cpu"])
        summary[f"{name}_llm_cpu_us"] = f"{llm:.0f}"
        summary[f"{name}_off_cpu_us"] = f"{off:.0f}"
        summary[f"{name}_echo_cpu_us"] = f"{echo:.0f}"
        summary[f"{name}_llm_extra_us"] = f"{llm - echo:.0f}"
        summary[f"{name}_prefix_routing_us"] = f"{llm - off:.0f}"
        summary[f"{name}_routed_per_core_s"] = f"{1e6 / llm:.0f}"
        print(f"{name}: the LLM path costs {llm - echo:,.0f} µs more proxy CPU a request "
              f"({llm:,.0f} vs {echo:,.0f}), of which prefix routing {llm - off:,.0f} "
              f"(off: {off:,.0f}); {1e6 / llm:,.0f} routed requests/s per proxy core")
    if args.ttft_connections:
        summary.update(ttft_phase(rows_ttft))
    if choices:
        summary.update(choose_phase(choices, args.ttft_connections))
    print("summary: " + " ".join(f"{k}={v}" for k, v in summary.items()))


def ttft_phase(rows: dict[str, list[tuple[float, float]]]) -> dict[str, str]:
    """The 220 KB chats' latency with prefix routing on (PATHS[0]) and off (PATHS[1])."""
    on, off = rows[PATHS[0]], rows[PATHS[1]]
    p99_on = statistics.median(r[1] for r in on)
    p99_off = statistics.median(r[1] for r in off)
    p50_on = statistics.median(r[0] for r in on)
    p50_off = statistics.median(r[0] for r in off)
    print(f"220 KB chats, max_tokens 1: prefix routing on p50/p99 {p50_on:.1f}/{p99_on:.1f} "
          f"ms (rounds: {', '.join(f'{r[1]:.1f}' for r in on)}), off {p50_off:.1f}/"
          f"{p99_off:.1f} ms ({', '.join(f'{r[1]:.1f}' for r in off)}): on adds "
          f"{p99_on - p99_off:+.1f} ms at p99")
    return {"ttft_p99_on_ms": f"{p99_on:.1f}", "ttft_p99_off_ms": f"{p99_off:.1f}",
            "ttft_p50_on_ms": f"{p50_on:.1f}", "ttft_p50_off_ms": f"{p50_off:.1f}"}


def choose_times(directory: str, proxy: list[int]) -> list[tuple[bool, int, int, int]]:
    """What routing held the proxies' requests for so far (bench/apps/choose_timer):
    (prefix routing on, body bytes, wall ns, CPU ns), as last written (every 256)."""
    out: list[tuple[bool, int, int, int]] = []
    for pid in proxy:
        path = Path(directory) / f"{pid}.jsonl"
        if path.exists():
            for line in path.read_text().splitlines():
                out += [tuple(x) for x in json.loads(line)]  # type: ignore[misc]
    return out


def choose_phase(choices: list[tuple[bool, int, int, int]], connections: int
                 ) -> dict[str, str]:
    """What routing holds a 220 KB chat for in the proxy (body to send), prefix routing
    on and off: on the wall clock, and in the proxy thread's CPU time."""
    out = {}
    for on in (True, False):
        name = "on" if on else "off"
        for clock, column in (("wall", 2), ("cpu", 3)):
            spent = sorted(row[column] / 1e3 for row in choices
                           if row[0] == on and row[1] > 200_000)
            if len(spent) < 100:
                continue
            p50, p99 = statistics.median(spent), statistics.quantiles(spent, n=100)[98]
            print(f"routing's hold of a 220 KB chat at {connections} connections, prefix "
                  f"routing {name}, {clock}: p50 {p50:,.0f} µs, p99 {p99:,.0f} µs, max "
                  f"{spent[-1]:,.0f} µs ({len(spent)} requests)")
            suffix = "" if clock == "wall" else "_cpu"
            out[f"choose_{name}{suffix}_us_p50"] = f"{p50:.0f}"
            out[f"choose_{name}{suffix}_us_p99"] = f"{p99:.0f}"
    return out


if __name__ == "__main__":
    main()
