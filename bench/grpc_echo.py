"""gRPC echo: surge's gRPC ingress vs Ray Serve 2.60's gRPC proxy, in one run.

    python bench/grpc_echo.py [--duration 5] [--clients 2] [--inflight 16]
                              [--systems raw,surge,ray] [--rounds 1]

Each system serves bench/apps/grpc_echo_app.py (the same code; Ray's API); `raw` is the
anchor, grpcio's own asyncio server answering in its one process
(bench/apps/grpc_raw_echo.py): what a Python gRPC server costs here at all. A grpcio
client of `--clients` processes (uvloop, grpc.aio, `--inflight` calls in flight each)
measures, per system:
- unary echo of 100 B: calls/s, p50/p99, CPU µs per call of the serving processes
  (proxy + replicas, from /proc);
- unary at moderate load (one client process, 2 calls in flight): p50/p99;
- server streaming, 50 messages of 100 B per call: messages/s;
- a 10 MB unary request, one at a time: p50 latency.
For surge it also runs wrk against the same app over HTTP (c=8) for the CPU per request
of its HTTP echo. `hyper` is surge with python-hyper's h2 behind its gRPC core instead
of its own HTTP/2 (bench/h2_hyper.py, through bench/h2_hyper_site/sitecustomize.py): the
A/B of issue 32 item 2. `--rounds N` measures every system N times, interleaved (the
order turned around each round), and reports each round and the medians. The last line
is `summary: key=value ...` (medians; `hyper_*` when it ran).
"""

from __future__ import annotations

import argparse
import hashlib
import multiprocessing
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import (
    APPS,
    cmdline,
    cpu_seconds,
    free_port,
    ray_python,
    run_wrk,
    start_system,
)

PROTO = """
syntax = "proto3";
package surgebench;
message EchoRequest { bytes payload = 1; int32 count = 2; }
message EchoReply { bytes payload = 1; int32 index = 2; }
service Echo {
  rpc Say(EchoRequest) returns (EchoReply);
  rpc Many(EchoRequest) returns (stream EchoReply);
}
"""
METADATA = (("application", "echo"),)
PROXY_TITLES = ("surge:proxy", "ProxyActor")
PAYLOAD = b"x" * 100
STREAM_MESSAGES = 50
BIG = 10 * 1024 * 1024
MAX_MESSAGE = [("grpc.max_send_message_length", 64 * 1024 * 1024),
               ("grpc.max_receive_message_length", 64 * 1024 * 1024)]


def compiled() -> str:
    """The directory of bench_echo_pb2*.py (compiled once with grpcio-tools)."""
    digest = hashlib.sha256(PROTO.encode()).hexdigest()[:16]
    directory = Path(tempfile.gettempdir()) / f"surge-bench-proto-{digest}"
    if not (directory / "bench_echo_pb2_grpc.py").exists():
        from grpc_tools import protoc

        work = Path(tempfile.mkdtemp(prefix="surge-bench-proto-"))
        (work / "bench_echo.proto").write_text(PROTO)
        if protoc.main(["protoc", f"-I{work}", f"--python_out={work}",
                        f"--grpc_python_out={work}", str(work / "bench_echo.proto")]):
            raise SystemExit("protoc failed")
        try:
            os.rename(work, directory)
        except OSError:
            pass
    return str(directory)


# -- the client (one process each) ---------------------------------------------------------


def _client(target: str, kind: str, inflight: int, start_at: float, duration: float,
            proto_dir: str, out: Any) -> None:
    sys.path.insert(0, proto_dir)
    import asyncio

    import bench_echo_pb2 as pb
    import bench_echo_pb2_grpc as pb_grpc
    import grpc
    import uvloop

    async def run() -> tuple[int, int, list[float]]:
        async with grpc.aio.insecure_channel(target, options=MAX_MESSAGE) as channel:
            stub = pb_grpc.EchoStub(channel)
            request = pb.EchoRequest(payload=PAYLOAD, count=STREAM_MESSAGES)
            calls = messages = 0
            latencies: list[float] = []
            await stub.Say(request, metadata=METADATA)  # connected before the clock starts
            await asyncio.sleep(max(0.0, start_at - time.time()))
            end = time.monotonic() + duration

            async def worker() -> None:
                nonlocal calls, messages
                while time.monotonic() < end:
                    began = time.perf_counter()
                    if kind == "unary":
                        await stub.Say(request, metadata=METADATA)
                        messages += 1
                    else:
                        async for _ in stub.Many(request, metadata=METADATA):
                            messages += 1
                    latencies.append((time.perf_counter() - began) * 1000)
                    calls += 1

            await asyncio.gather(*(worker() for _ in range(inflight)))
            return calls, messages, latencies

    out.put(uvloop.run(run()))


def load(target: str, kind: str, clients: int, inflight: int, duration: float,
         proto_dir: str, cpu_pids: list[int]) -> dict[str, float]:
    context = multiprocessing.get_context("spawn")
    queue = context.Queue()
    start_at = time.time() + 3.0  # every client connected and warmed by then
    procs = [context.Process(target=_client, args=(target, kind, inflight, start_at, duration,
                                                   proto_dir, queue)) for _ in range(clients)]
    for proc in procs:
        proc.start()
    time.sleep(max(0.0, start_at - time.time()))
    proxies = [pid for pid in cpu_pids if any(k in cmdline(pid) for k in PROXY_TITLES)]
    before, before_proxy = cpu_seconds(cpu_pids), cpu_seconds(proxies)
    results = [queue.get(timeout=duration + 120) for _ in procs]
    cpu = cpu_seconds(cpu_pids) - before
    proxy_cpu = cpu_seconds(proxies) - before_proxy
    for proc in procs:
        proc.join(timeout=10)
    calls = sum(r[0] for r in results)
    messages = sum(r[1] for r in results)
    latencies = sorted(x for r in results for x in r[2])
    return {"rps": calls / duration, "msgs_per_s": messages / duration,
            "p50_ms": _quantile(latencies, 0.5), "p99_ms": _quantile(latencies, 0.99),
            "cpu_us_per_call": cpu / max(calls, 1) * 1e6,
            "proxy_us_per_call": proxy_cpu / max(calls, 1) * 1e6}


def _quantile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    return values[min(len(values) - 1, int(q * len(values)))]


def big_unary(target: str, proto_dir: str, calls: int = 7) -> float:
    sys.path.insert(0, proto_dir)
    import bench_echo_pb2 as pb
    import bench_echo_pb2_grpc as pb_grpc
    import grpc

    request = pb.EchoRequest(payload=b"y" * BIG)
    with grpc.insecure_channel(target, options=MAX_MESSAGE) as channel:
        stub = pb_grpc.EchoStub(channel)
        stub.Say(request, metadata=METADATA, timeout=60)  # warm-up
        times = []
        for _ in range(calls):
            began = time.perf_counter()
            stub.Say(request, metadata=METADATA, timeout=60)
            times.append((time.perf_counter() - began) * 1000)
    return statistics.median(times)


HYPER_SITE = Path(__file__).resolve().parent / "h2_hyper_site"


def measure(name: str, args: argparse.Namespace, proto_dir: str) -> dict[str, float]:
    http_port, grpc_port = free_port(), free_port()
    python = ray_python() if name == "ray" else sys.executable
    surge = name in ("surge", "hyper")
    env = {"PYTHONPATH": os.pathsep.join([proto_dir, str(APPS.parent.parent / "src")])
           if surge else proto_dir, "SURGE_LOG_LEVEL": "WARNING"}
    marks = Path(tempfile.gettempdir()) / f"surge-bench-h2-{os.getpid()}-{grpc_port}"
    if name == "hyper":  # its processes swap the gRPC core's HTTP/2 for h2's
        env["PYTHONPATH"] += os.pathsep + str(HYPER_SITE)
        env["SURGE_BENCH_H2_MARKS"] = str(marks)
    if surge:
        env["SURGE_ADDRESS"] = f"127.0.0.1:{free_port()}"
    argv = [python, str(APPS / "grpc_echo_app.py"), "surge" if surge else name, str(http_port),
            str(grpc_port)]
    if name == "raw":
        argv = [python, str(APPS / "grpc_raw_echo.py"), str(grpc_port)]
    print(f"== {name}", flush=True)
    with start_system(name, argv, env, timeout_s=240) as system:
        target = system.info["grpc"]
        serving = system.serving_pids()
        if name == "hyper":
            _check_hyper(marks, serving)
            marks.unlink()
        out: dict[str, float] = {}
        profiler = None
        if args.profile and name == "surge":  # py-spy on the proxy and the replica
            from bench.profile import Profiler

            profiler = Profiler({f"{cmdline(pid).split()[0]} #{i}": pid
                                 for i, pid in enumerate(serving)}, args.duration + 3)
        unary = load(target, "unary", args.clients, args.inflight, args.duration, proto_dir,
                     serving)
        if profiler is not None:
            print(profiler.report(), flush=True)
        print(f"   unary      {unary['rps']:>9,.0f} calls/s  p50 {unary['p50_ms']:6.2f} ms  "
              f"p99 {unary['p99_ms']:7.2f} ms  cpu/call {unary['cpu_us_per_call']:6.0f} us "
              f"(proxy {unary['proxy_us_per_call']:.0f})",
              flush=True)
        moderate = load(target, "unary", 1, 2, args.duration, proto_dir, serving)
        print(f"   moderate   {moderate['rps']:>9,.0f} calls/s  p50 {moderate['p50_ms']:6.2f} "
              f"ms  p99 {moderate['p99_ms']:7.2f} ms", flush=True)
        stream = load(target, "stream", args.clients, max(1, args.inflight // 4),
                      args.duration, proto_dir, serving)
        print(f"   stream     {stream['msgs_per_s']:>9,.0f} msgs/s   ({stream['rps']:,.0f} "
              f"calls/s of {STREAM_MESSAGES})", flush=True)
        big = big_unary(target, proto_dir)
        print(f"   10 MB      p50 {big:7.1f} ms", flush=True)
        out.update(rps=unary["rps"], p50_ms=unary["p50_ms"], p99_ms=unary["p99_ms"],
                   cpu_us_per_req=unary["cpu_us_per_call"],
                   proxy_cpu_us_per_req=unary["proxy_us_per_call"],
                   moderate_p50_ms=moderate["p50_ms"],
                   moderate_p99_ms=moderate["p99_ms"], stream_msgs_per_s=stream["msgs_per_s"],
                   big_p50_ms=big)
        if name == "surge":
            http = run_wrk(system.url, 8, args.duration, serving)
            print(f"   HTTP echo  {http.rps:>9,.0f} req/s    cpu/req "
                  f"{http.cpu_us_per_request:6.0f} us (wrk c=8)", flush=True)
            out["http_cpu_us_per_req"] = http.cpu_us_per_request
        return out


def _check_hyper(marks: Path, serving: list[int]) -> None:
    """The proxy of the `hyper` system runs h2 (its sitecustomize wrote its pid)."""
    wrote = {int(line) for line in marks.read_text().split()} if marks.exists() else set()
    proxies = {pid for pid in serving if "surge:proxy" in cmdline(pid)}
    if not proxies or not proxies <= wrote:
        raise SystemExit(f"hyper: proxies {sorted(proxies)} did not load h2 (marks: "
                         f"{sorted(wrote)})")
    print(f"   h2 behind the gRPC core of proxy {sorted(proxies)}", flush=True)


def _median(rounds: list[dict[str, float]]) -> dict[str, float]:
    return {key: statistics.median(r[key] for r in rounds) for key in rounds[0]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=float, default=5.0)
    parser.add_argument("--clients", type=int, default=2, help="client processes")
    parser.add_argument("--inflight", type=int, default=16, help="calls in flight per client")
    parser.add_argument("--systems", default="raw,surge,ray",
                        help="of raw, surge, hyper (surge on python-hyper's h2), ray")
    parser.add_argument("--rounds", type=int, default=1,
                        help="measure every system this many times, interleaved")
    parser.add_argument("--profile", action="store_true",
                        help="sample surge's serving processes with py-spy during the unary run")
    args = parser.parse_args()
    proto_dir = compiled()
    print(f"load average at start: {os.getloadavg()[0]:.1f} (2 cores: above 2, other work "
          "competes with the systems and the client)", flush=True)
    names = [name for name in args.systems.split(",") if name]
    rounds: dict[str, list[dict[str, float]]] = {name: [] for name in names}
    for number in range(args.rounds):
        for name in names if number % 2 == 0 else names[::-1]:
            rounds[name].append(measure(name, args, proto_dir))
    print(f"load average at the end: {os.getloadavg()[0]:.1f}")
    results = {name: _median(measured) for name, measured in rounds.items()}
    surge, ray, raw = results.get("surge", {}), results.get("ray", {}), results.get("raw", {})
    hyper = results.get("hyper", {})
    nan = float("nan")
    print()
    print("| system | unary calls/s | p50 ms | p99 ms | CPU µs/call (proxy) | moderate p99 ms "
          "| stream msgs/s | 10 MB p50 ms |")
    print("|---|---|---|---|---|---|---|---|")
    rows = [(f"{name} (round {i + 1})", r) for name, measured in rounds.items()
            for i, r in enumerate(measured)] if args.rounds > 1 else []
    rows += [(f"{name} (median)" if args.rounds > 1 else name, r)
             for name, r in results.items()]
    for label, r in rows:
        print(f"| {label} | {r['rps']:,.0f} | {r['p50_ms']:.2f} | {r['p99_ms']:.2f} | "
              f"{r['cpu_us_per_req']:,.0f} ({r['proxy_cpu_us_per_req']:,.0f}) | "
              f"{r['moderate_p99_ms']:.2f} | "
              f"{r['stream_msgs_per_s']:,.0f} | {r['big_p50_ms']:.1f} |")
    if surge and ray:
        print(f"surge/ray unary: {surge['rps'] / ray['rps']:.1f}x; stream: "
              f"{surge['stream_msgs_per_s'] / ray['stream_msgs_per_s']:.1f}x; 10 MB p50: "
              f"{surge['big_p50_ms'] / ray['big_p50_ms']:.2f} of Ray's")
    if surge and raw:
        print(f"surge/raw: unary {surge['rps'] / raw['rps']:.2f}x, moderate-load p99 "
              f"{surge['moderate_p99_ms']:.2f} vs {raw['moderate_p99_ms']:.2f} ms")
    if surge.get("http_cpu_us_per_req"):
        print(f"surge gRPC CPU per call / HTTP CPU per request: "
              f"{surge['cpu_us_per_req'] / surge['http_cpu_us_per_req']:.2f}x")
    fields = {
        "rps": surge.get("rps", nan), "ray_rps": ray.get("rps", nan),
        "p99_ms": surge.get("moderate_p99_ms", nan),
        "cpu_us_per_req": surge.get("cpu_us_per_req", nan),
        "http_cpu_us_per_req": surge.get("http_cpu_us_per_req", nan),
        "stream_msgs_per_s": surge.get("stream_msgs_per_s", nan),
        "ray_stream_msgs_per_s": ray.get("stream_msgs_per_s", nan),
        "big_p50_ms": surge.get("big_p50_ms", nan), "ray_big_p50_ms": ray.get("big_p50_ms", nan),
        "raw_rps": raw.get("rps", nan), "raw_p99_ms": raw.get("moderate_p99_ms", nan),
    }
    if hyper:
        fields.update({f"hyper_{key}": hyper[key] for key in (
            "rps", "moderate_p99_ms", "cpu_us_per_req", "proxy_cpu_us_per_req",
            "stream_msgs_per_s", "big_p50_ms")})
    if surge:
        fields["proxy_cpu_us_per_req"] = surge["proxy_cpu_us_per_req"]
    print("summary: " + " ".join(f"{k}={v:.4g}" for k, v in fields.items()))


if __name__ == "__main__":
    main()
