"""First-token overhead: surge's OpenAI app vs `vllm serve`, request by request.

    make llm-env
    flock /tmp/surge-bench.lock .venv-llm/bin/python bench/llm_first_token.py \
        [--requests 300] [--warmup 20]

Both servers up at once, each with one engine of the same tiny random Llama and the same
engine arguments as bench/llm.py (vLLM's server is `python -m
vllm.entrypoints.openai.api_server` from the same install; surge runs the same model as a
Ray Serve LLM config with `surge run`). One client sends one streamed chat at a time
(64 output tokens, `ignore_eos`), alternating between the servers and flipping the order
each round, so both see the same machine at the same moments and only one works at a
time; bench/llm.py runs them one after the other, minutes apart, which on a shared
2-core host moves c=1 TTFT by more than the 2 ms to be measured. Prints TTFT p50/p90/p99
per server and surge's overhead (its p50 minus vLLM's, with the per-round differences'
median); last line `summary: ...`.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# Not bench/ itself: bench/profile.py would shadow the standard library's `profile`.
sys.path[:] = [str(ROOT / "src"), str(ROOT)] + [
    p for p in sys.path if Path(p or ".").resolve() != ROOT / "bench"]

from bench.common import free_port  # noqa: E402
from bench.llm import MAX_TOKENS, MODEL_DIR, PROMPT, server, surge_config, vllm_argv  # noqa: E402
from bench.llm_client import _Conn, chat_body  # noqa: E402


async def alternate(ports: dict[str, int], requests: int, warmup: int
                    ) -> dict[str, list[float | None]]:
    """TTFT (ms; None when a request failed) per server, one request at a time."""
    body = chat_body("tiny", MAX_TOKENS, PROMPT)
    loop = asyncio.get_running_loop()
    conns, heads = {}, {}
    for name, port in ports.items():
        _, conns[name] = await loop.create_connection(_Conn, "127.0.0.1", port)
        heads[name] = (f"POST /v1/chat/completions HTTP/1.1\r\nhost: 127.0.0.1:{port}\r\n"
                       "content-type: application/json\r\ncontent-length: ").encode()
    ttft: dict[str, list[float | None]] = {name: [] for name in ports}
    names = list(ports)
    for i in range(warmup + requests):
        for name in names if i % 2 else reversed(names):
            result = await conns[name].request(heads[name], body, 60.0)
            if result.error or result.status != 200:
                _, conns[name] = await loop.create_connection(_Conn, "127.0.0.1", ports[name])
            if i >= warmup:
                ok = result.status == 200 and not result.error and result.ttft_s is not None
                ttft[name].append(result.ttft_s * 1000 if ok and result.ttft_s else None)
    return ttft


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=300, help="per server")
    parser.add_argument("--warmup", type=int, default=20)
    args = parser.parse_args()
    from surge.testing.tiny_llm import make_tiny_llama

    make_tiny_llama(MODEL_DIR)
    out = ROOT / "reports" / f"llm-first-token-{time.strftime('%Y%m%d-%H%M%S')}"
    out.mkdir(parents=True, exist_ok=True)
    ports = {"vllm": free_port(), "surge": free_port()}
    config = out / "surge.yaml"
    config.write_text(surge_config(ports["surge"], {"num_replicas": 1}))
    with server("vllm", vllm_argv(ports["vllm"]), ports["vllm"], out / "vllm.log"), \
            server("surge", [sys.executable, "-m", "surge.cli.main", "run", str(config)],
                   ports["surge"], out / "surge.log",
                   {"SURGE_ADDRESS": f"127.0.0.1:{free_port()}"}):
        ttft = asyncio.run(alternate(ports, args.requests, args.warmup))
    figures = {}
    for name, values in ttft.items():
        ok = sorted(v for v in values if v is not None)
        q = statistics.quantiles(ok, n=100)
        figures[name] = (statistics.median(ok), q[89], q[98])
        print(f"{name:5}: {len(ok)}/{len(values)} ok, TTFT p50 {figures[name][0]:.2f} ms "
              f"p90 {figures[name][1]:.2f} ms p99 {figures[name][2]:.2f} ms")
    pairs = [s - v for s, v in zip(ttft["surge"], ttft["vllm"], strict=True)
             if s is not None and v is not None]
    overhead = figures["surge"][0] - figures["vllm"][0]
    print(f"surge - vllm: p50 {overhead:+.2f} ms, p99 "
          f"{figures['surge'][2] - figures['vllm'][2]:+.2f} ms; median of the "
          f"{len(pairs)} rounds' differences {statistics.median(pairs):+.2f} ms")
    print(f"summary: ttft_overhead_p50_ms={overhead:.3f} "
          f"ttft_overhead_p99_ms={figures['surge'][2] - figures['vllm'][2]:.3f} "
          f"round_difference_median_ms={statistics.median(pairs):.3f} "
          f"vllm_ttft_p50_ms={figures['vllm'][0]:.3f} surge_ttft_p50_ms={figures['surge'][0]:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
