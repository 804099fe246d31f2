"""LLM routing policies on mock engines, in virtual time: prefix-cache hits, TTFT, balance.

    .venv/bin/python bench/llm_routing_sim.py [--replicas 16] [--requests 4000] [--load 0.7] \
        [--mix system_prompts,conversations] [--trace mooncake.jsonl]

Mooncake-shaped traces (generated here, seeded; equal block ids are equal tokens), one
per `--mix` (loadtest/traces.py): `system_prompts`, sessions whose turns extend the
previous turn's 512-token blocks over a Zipf-popular pool of system prompts, most reuse
in heads every replica soon holds; `conversations`, the mix of Mooncake's FAST'25
conversation and synthetic traces, most reuse a conversation's own earlier turns (or a
published file with `--trace`, its gaps scaled to the rate), each replayed against
`--replicas` engine models (sim/engine_model.py: vLLM's scheduler, step time and prefix
cache, as the mock engine runs them) in virtual time, once per routing policy, same
arrivals. Each trace's line gives its reuse shape (reuse_shape: how much of the reuse is
in heads `--replicas`+ requests had, and round robin's ceiling with caches that never
evict: what prefix routing can gain over it at most):

* `round_robin`; `p2c`: power of two choices on the engines' queues (what surge does
  for an LLM deployment without affinity);
* `byte_prefix`: today's affinity, rendezvous hashing of the body's first 1,024 bytes
  within the slack (policy/engine_routing.py);
* `prefix_index`: policy/prefix_index.py fed by the router's own sends (the chunks of
  each prompt recorded for the replica it went to);
* `prefix_events`: the same index also fed by what the engines report they hold and
  evicted (their KV events, translated by policy/kv_chunks.py in each replica and sent
  every `REPORT_S`, as LLMServer's routing stats carry them);
* `oracle`: the same choice (`choose_by_prefix`, same slack) on what each engine really
  holds (its KV blocks, read from the engine model).

Then the router's own cost, CPU per request: reading a 220 KB chat body's prompt into
chunk names (`prompt_stream` + `chunk_names`, once per request; and the same body again
through `PromptNames`, as a router's pool names prompts), and one decision
(`PrefixIndex.held` + `read_holders` + `choose_by_prefix`) at 512 replicas, when 3 of
them hold the prompt's prefix, and when 24, 128 and all 512 hold its first part (a 20 KB
system prompt, then a question shorter than a chunk there: a depth more than 16 hold is
read on a sample first, whole only when the sampled holders are all over the slack).

Per policy: the engines' prefix-cache hit rate (vLLM's: prompt tokens found cached over
prompt tokens), TTFT p50/p99, end-to-end p50, and the max/mean of requests served and of
busy time per replica. The engine queue a router sees is exact here (no report delay):
this measures the policies' choices, not the data path. `--routers K` spreads the
requests over K routers (proxies) in turn, each with its own index: fed by its own sends
only, each sees 1/K of the traffic; fed by the engines' events, each sees what all sent.
With several traces, a last table puts them side by side: prefix_events against the
oracle and round robin, and its balance. The rate is --load x the replicas' capacity if
each finds cached what round robin would at most. Last line: `summary: ...`.
"""

from __future__ import annotations

import argparse
import heapq
import json
import random
import statistics
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from surge.codecs.kv_events import replay as replay_events
from surge.loadtest.traces import (
    BLOCK_TOKENS,
    MOONCAKE_MIXES,
    ReuseShape,
    TraceRequest,
    mooncake_shaped,
    read_mooncake,
    reuse_shape,
)
from surge.policy.engine_routing import (
    AFFINITY_PREFIX_BYTES,
    choose_by_score,
    choose_with_affinity,
    rendezvous,
)
from surge.policy.kv_chunks import ChunkCoverage
from surge.policy.prefix_index import (
    PrefixIndex,
    choose_by_prefix,
    chunk_names,
    prompt_stream,
    read_holders,
)
from surge.policy.prompt_names import PromptNames
from surge.sim.engine_model import EngineModel, EngineTiming
from surge.sim.kv_blocks import prefix_hashes

# An 8B model on one GPU, in shape: ~12k prompt tokens/s, ~25 ms decode steps at 64 seqs.
TIMING = EngineTiming(step_s=0.012, decode_s_per_seq=0.0002, prefill_s_per_token=0.00008,
                      max_num_seqs=128, max_num_batched_tokens=8192, num_blocks=6000,
                      block_size=16, max_model_len=65536)
REPORT_S = 0.25  # how often a replica's routing stats (and its cache changes) go out


def tokens_of(r: TraceRequest) -> tuple[int, ...]:
    """Equal hash ids, equal token blocks (as loadtest/traces.py's prompt words)."""
    out: list[int] = []
    for block in r.hash_ids:
        base = block * 7919
        out += [(base + j) % 32000 for j in range(BLOCK_TOKENS)]
    return tuple(out[:r.input_length])


class Cluster:
    def __init__(self, replicas: int, timing: EngineTiming = TIMING) -> None:
        self.engines = [EngineModel(timing) for _ in range(replicas)]
        self.busy_until = [0.0] * replicas
        self.busy_s = [0.0] * replicas
        self.served = [0] * replicas
        self.in_flight = [0] * replicas
        self.coverage = [ChunkCoverage() for _ in range(replicas)]  # in each replica
        self.now = 0.0

    def queue(self, i: int) -> int:
        e = self.engines[i]
        return len(e.waiting) + len(e.running)


# (cluster, request, its tokens, its prompt stream as a router reads it, rng) -> replica
Policy = Callable[[Cluster, TraceRequest, tuple[int, ...], bytes, random.Random], int]


def make_policies(replicas: int, routers: int = 1) -> dict[str, Policy]:
    ids = [f"replica-{i}" for i in range(replicas)]
    at = {r: i for i, r in enumerate(ids)}
    capacity = 10_000  # the engines queue: no router-side bound in this comparison
    turn = iter(range(10**9))
    indexes = [PrefixIndex() for _ in range(routers)]
    sent = iter(range(10**9))  # which router takes the next request: each in turn
    reported = [0.0]  # when the replicas last reported

    def scores(c: Cluster) -> list[int]:
        return [c.queue(i) for i in range(replicas)]

    def round_robin(c: Cluster, r: TraceRequest, tokens: tuple[int, ...], body: bytes,
                    rng: random.Random) -> int:
        return next(turn) % replicas

    def p2c(c: Cluster, r: TraceRequest, tokens: tuple[int, ...], body: bytes,
                    rng: random.Random) -> int:
        return choose_by_score(c.in_flight, scores(c), capacity, rng)

    def byte_prefix(c: Cluster, r: TraceRequest, tokens: tuple[int, ...], body: bytes,
                    rng: random.Random) -> int:
        if len(body) < AFFINITY_PREFIX_BYTES:
            return p2c(c, r, tokens, body, rng)
        preferred = rendezvous(body[:AFFINITY_PREFIX_BYTES], ids)
        return choose_with_affinity(c.in_flight, scores(c), capacity, preferred, rng)

    def prefix(c: Cluster, r: TraceRequest, tokens: tuple[int, ...], body: bytes,
                    rng: random.Random) -> int:
        index = indexes[next(sent) % routers]
        names = chunk_names(body)
        held = read_holders(index, index.held(names), at, rng)
        choice = choose_by_prefix(c.in_flight, scores(c), capacity, held, rng)
        index.record(ids[choice], names)
        return choice

    def oracle(c: Cluster, r: TraceRequest, tokens: tuple[int, ...], body: bytes,
                    rng: random.Random) -> int:
        hashes = prefix_hashes(tokens, TIMING.block_size, None)
        depths = {i: n for i, e in enumerate(c.engines)
                  if (n := e.blocks.cached_prefix(hashes))}
        held = [(d, [i for i, n in depths.items() if n == d])
                for d in sorted(set(depths.values()), reverse=True)]
        return choose_by_prefix(c.in_flight, scores(c), capacity, held, rng)

    def prefix_events(c: Cluster, r: TraceRequest, tokens: tuple[int, ...], body: bytes,
                      rng: random.Random) -> int:
        while c.now >= reported[0] + REPORT_S:  # every replica's report reaches every router
            reported[0] += REPORT_S
            for i, coverage in enumerate(c.coverage):
                change = coverage.take()
                for index in indexes:
                    index.follow(ids[i], change.stored, change.removed, change.cleared)
        return prefix(c, r, tokens, body, rng)

    return {"round_robin": round_robin, "p2c": p2c, "byte_prefix": byte_prefix,
            "prefix_index": prefix, "prefix_events": prefix_events, "oracle": oracle}


def _stream(tokens: tuple[int, ...]) -> bytes:
    return b"".join(t.to_bytes(2, "big") for t in tokens)


def replay(trace: list[TraceRequest], replicas: int, policy: Policy, seed: int,
           timing: EngineTiming = TIMING) -> dict[str, float]:
    rng = random.Random(seed)
    c = Cluster(replicas, timing)
    prompts: dict[str, tuple[list[int], int, tuple[int, ...]]] = {}
    events: list[tuple[float, int, int, int]] = []  # (time, kind 0 step-end 1 arrival, i, n)
    for n, r in enumerate(trace):
        heapq.heappush(events, (r.at_s, 1, -1, n))
    arrived: dict[str, float] = {}
    ttft: list[float] = []
    e2e: list[float] = []
    pending: dict[int, object] = {}
    decide_s = 0.0
    while events:
        now, kind, i, n = heapq.heappop(events)
        c.now = now
        if kind == 1:
            r = trace[n]
            tokens = tokens_of(r)
            body = _stream(tokens)
            prompts[f"r{n}"] = (chunk_names(body), len(body), tokens)
            started = time.perf_counter()
            i = policy(c, r, tokens, body, rng)
            decide_s += time.perf_counter() - started
            sid = f"r{n}"
            arrived[sid] = now
            c.engines[i].add(sid, tokens, r.output_length)
            c.in_flight[i] += 1
            c.served[i] += 1
            if i not in pending:
                _start(c, i, now, events, pending)
            continue
        step = pending.pop(i)
        for sid in step.first:  # type: ignore[attr-defined]
            ttft.append(now - arrived[sid])
            c.coverage[i].served(*prompts.pop(sid))  # the replica reads it against its events
        for sid in step.finished:  # type: ignore[attr-defined]
            e2e.append(now - arrived.pop(sid))
            c.in_flight[i] -= 1
        _start(c, i, now, events, pending)
    hits = sum(e.prefix_hits for e in c.engines)
    queries = sum(e.prefix_queries for e in c.engines)
    q = statistics.quantiles(ttft, n=100)
    return {"hit_rate": hits / queries, "ttft_p50": statistics.median(ttft), "ttft_p99": q[98],
            "e2e_p50": statistics.median(e2e),
            "served_max_mean": max(c.served) / statistics.mean(c.served),
            "busy_max_mean": max(c.busy_s) / statistics.mean(c.busy_s),
            "decide_us": decide_s / len(trace) * 1e6}


def _start(c: Cluster, i: int, now: float, events: list[tuple[float, int, int, int]],
           pending: dict[int, object]) -> None:
    engine = c.engines[i]
    if engine.idle:
        return
    step = engine.step()
    replay_events(engine.take_events(), c.coverage[i])
    c.busy_s[i] += step.duration_s
    pending[i] = step
    heapq.heappush(events, (now + step.duration_s, 0, i, 0))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--replicas", type=int, default=16)
    parser.add_argument("--requests", type=int, default=4000)
    parser.add_argument("--rate", type=float, default=0.0,
                        help="arrivals per second (default: --load x an estimate of capacity)")
    parser.add_argument("--load", type=float, default=0.7)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--routers", type=int, default=1,
                        help="routers (proxies) taking the requests in turn, each its index")
    parser.add_argument("--policies",
                        default="round_robin,p2c,byte_prefix,prefix_index,prefix_events,oracle")
    parser.add_argument("--num-blocks", type=int, default=TIMING.num_blocks,
                        help="each engine's KV blocks of 16 tokens (fewer: a KV-bound "
                             "regime, where every replica cannot hold every popular prefix)")
    parser.add_argument("--mix", default=",".join(MOONCAKE_MIXES),
                        help="the generated traces' reuse mixes, each in turn "
                             f"({', '.join(MOONCAKE_MIXES)}: loadtest/traces.py)")
    parser.add_argument("--trace", default="",
                        help="replay this Mooncake .jsonl instead (its first --requests, "
                             "its gaps scaled to the rate)")
    args = parser.parse_args()
    timing = replace(TIMING, num_blocks=args.num_blocks)
    shapes = {}
    for name in ([args.trace] if args.trace else args.mix.split(",")):
        trace, rate = make_trace(args, name, timing)
        shape = reuse_shape(trace, args.replicas)
        print(f"{name}: {len(trace)} requests at {rate:.1f}/s, mean input "
              f"{statistics.mean(r.input_length for r in trace):.0f} tokens, mean output "
              f"{statistics.mean(r.output_length for r in trace):.0f}, block reuse "
              f"{shape.reuse:.0%} ({shape.widely_shared:.0%} of it in heads "
              f"{args.replicas}+ requests had before; round robin's ceiling "
              f"{shape.round_robin:.0%}: at most {shape.ceiling:.2f}x); {args.replicas} "
              f"replicas of {timing.num_blocks} KV blocks, {args.routers} router(s)")
        rows = {}
        for policy_name in args.policies.split(","):
            policy = make_policies(args.replicas, args.routers)[policy_name]
            started = time.perf_counter()
            rows[policy_name] = replay(trace, args.replicas, policy, args.seed, timing)
            print(f"  {policy_name}: {time.perf_counter() - started:.1f} s", flush=True)
        print_rows(rows)
        shapes[Path(name).stem] = (shape, rows)
    if len(shapes) > 1:
        print_side_by_side(shapes)
    cost = router_cost()
    print()
    print(f"router cost (CPU): a 220 KB chat body read into chunk names p50 "
          f"{cost['parse_220kb_us_p50']:.0f} µs, p99 {cost['parse_220kb_us_p99']:.0f} µs "
          f"(the same body again, through PromptNames: {cost['again_220kb_us_p50']:.0f} / "
          f"{cost['again_220kb_us_p99']:.0f} µs); "
          f"a decision at 512 replicas p50/p99: 3 holders {cost['decision_3_hold_us_p50']:.1f}"
          f"/{cost['decision_3_hold_us_p99']:.1f} µs, 24 holding the system prompt "
          f"{cost['decision_24_hold_us_p50']:.1f}/{cost['decision_24_hold_us_p99']:.1f} µs, "
          f"128 {cost['decision_128_hold_us_p50']:.1f}/{cost['decision_128_hold_us_p99']:.1f} µs, "
          f"all holding it "
          f"{cost['decision_all_hold_us_p50']:.1f}/{cost['decision_all_hold_us_p99']:.1f} µs")
    summary = {}
    for mix, (_, rows) in shapes.items():
        prefix = f"{mix}_" if len(shapes) > 1 else ""
        summary.update({f"{prefix}{k}_hit": f"{v['hit_rate']:.3f}" for k, v in rows.items()})
        for policy in ("prefix_index", "prefix_events"):
            short = policy.removeprefix("prefix_")
            for base, tag in (("oracle", "oracle"), ("round_robin", "rr")):
                if policy in rows and base in rows:
                    summary[f"{prefix}{short}_vs_{tag}"] = (
                        f"{rows[policy]['hit_rate'] / rows[base]['hit_rate']:.2f}")
    summary.update({k: f"{v:.1f}" for k, v in cost.items()})
    print("summary: " + " ".join(f"{k}={v}" for k, v in summary.items()))


def make_trace(args: argparse.Namespace, name: str,
               timing: EngineTiming) -> tuple[list[TraceRequest], float]:
    """The trace `name` names (a mix, or a file) at --rate, or at --load x an estimate of
    the replicas' capacity: a replica's if it finds cached what round robin would with
    caches that never evict (reuse_shape) and decode runs 64 wide, so that no policy
    is over capacity."""
    if args.trace:
        fits = [r for r in read_mooncake(name)
                if r.input_length + r.output_length <= timing.max_model_len]
        probe = fits[:args.requests]
    else:
        probe = mooncake_shaped(args.requests, 1.0, random.Random(args.seed), mix=name)
    mean_in = statistics.mean(r.input_length for r in probe)
    mean_out = statistics.mean(r.output_length for r in probe)
    cached = reuse_shape(probe, args.replicas).round_robin
    per_request_s = (mean_in * (1 - cached) * timing.prefill_s_per_token
                     + mean_out * (timing.step_s + 64 * timing.decode_s_per_seq) / 64)
    rate = args.rate or args.load * args.replicas / per_request_s
    if not args.trace:
        return mooncake_shaped(args.requests, rate, random.Random(args.seed), mix=name), rate
    scale = (len(probe) - 1) / rate / (probe[-1].at_s - probe[0].at_s)  # its gaps, rescaled
    return [replace(r, at_s=(r.at_s - probe[0].at_s) * scale) for r in probe], rate


def print_rows(rows: dict[str, dict[str, float]]) -> None:
    print()
    print("| policy | prefix-cache hit rate | TTFT p50 s | TTFT p99 s | e2e p50 s | "
          "served max/mean | busy max/mean | decision µs (wall) |")
    print("|---|---|---|---|---|---|---|---|")
    for name, row in rows.items():
        print(f"| {name} | {row['hit_rate']:.1%} | {row['ttft_p50']:.3f} | "
              f"{row['ttft_p99']:.3f} | {row['e2e_p50']:.2f} | {row['served_max_mean']:.2f} | "
              f"{row['busy_max_mean']:.2f} | {row['decide_us']:.0f} |")
    print()


def print_side_by_side(shapes: dict[str, tuple[ReuseShape, dict[str, dict[str, float]]]]
                       ) -> None:
    """prefix_events (else prefix_index) against the oracle and round robin, per trace."""
    print("| trace | block reuse | widely shared | ceiling vs RR | routed hit | oracle | "
          "round robin | vs oracle | vs round robin | served max/mean | busy max/mean |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for mix, (shape, rows) in shapes.items():
        routed = rows.get("prefix_events") or rows.get("prefix_index")
        oracle, rr = rows.get("oracle"), rows.get("round_robin")
        if routed is None or oracle is None or rr is None:
            continue
        print(f"| {mix} | {shape.reuse:.0%} | {shape.widely_shared:.0%} | "
              f"{shape.ceiling:.2f}x | {routed['hit_rate']:.1%} | {oracle['hit_rate']:.1%} | "
              f"{rr['hit_rate']:.1%} | {routed['hit_rate'] / oracle['hit_rate']:.2f} | "
              f"{routed['hit_rate'] / rr['hit_rate']:.2f}x | {routed['served_max_mean']:.2f} | "
              f"{routed['busy_max_mean']:.2f} |")


def router_cost(replicas: int = 512, rounds: int = 3000) -> dict[str, float]:
    rng = random.Random(1)

    def text(n: int) -> str:
        return "".join(rng.choice("abcdefghij klmnop") for _ in range(n))

    shared = text(20_000)
    questions = [json.dumps({"model": "m", "messages": [
        {"role": "system", "content": shared},
        {"role": "user", "content": f"q{i} " * 100}]}).encode() for i in range(50)]
    big = json.dumps({"model": "m", "messages": [{"role": "system", "content": text(220_000)},
                                                 {"role": "user", "content": "hi"}]}).encode()
    parse = []
    for _ in range(200):
        started = time.process_time_ns()
        chunk_names(prompt_stream(big) or b"")
        parse.append(time.process_time_ns() - started)
    out = {"parse_220kb_us_p50": statistics.median(parse) / 1e3,
           "parse_220kb_us_p99": statistics.quantiles(parse, n=100)[98] / 1e3}
    recent = PromptNames()  # the same body again: its chunks named from the last one's
    parse = []
    for _ in range(200):
        started = time.process_time_ns()
        recent.names(prompt_stream(big) or b"")
        parse.append(time.process_time_ns() - started)
    out["again_220kb_us_p50"] = statistics.median(parse) / 1e3
    out["again_220kb_us_p99"] = statistics.quantiles(parse, n=100)[98] / 1e3
    ids = [f"replica-{i}" for i in range(replicas)]
    at = {r: i for i, r in enumerate(ids)}
    names = [chunk_names(prompt_stream(q) or b"") for q in questions]
    for case, held_by in (("3_hold", 3), ("24_hold", 24), ("128_hold", 128),
                          ("all_hold", replicas)):
        index = PrefixIndex()
        for i in range(replicas):  # each replica's own conversations
            own = json.dumps({"model": "m", "messages": [
                {"role": "system", "content": text(4000)}]}).encode()
            index.record(ids[i], chunk_names(prompt_stream(own) or b""))
        for i in range(held_by):
            index.record(ids[i * (replicas // held_by)], names[i % len(names)])
        in_flight = [rng.randrange(5) for _ in range(replicas)]
        scores = [x + rng.randrange(3) for x in in_flight]
        spent = []
        for k in range(rounds):
            prompt = names[k % len(names)]
            started = time.process_time_ns()
            held = read_holders(index, index.held(prompt), at, rng)
            choose_by_prefix(in_flight, scores, 100, held, rng)
            spent.append(time.process_time_ns() - started)
        q = statistics.quantiles(spent, n=100)
        out[f"decision_{case}_us_p50"] = statistics.median(spent) / 1e3
        out[f"decision_{case}_us_p99"] = q[98] / 1e3
    return out


if __name__ == "__main__":
    main()
