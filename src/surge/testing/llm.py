"""`FakeLLMEngine`: a deterministic engine for the OpenAI layer's tests (no model).

It speaks `surge.llm.engine.LLMEngine`. Words are tokens (ids by a stable hash); the
chat template is `role: content` lines and `assistant:`. Generation yields `t0 t1 ...`,
one token per step every `token_delay_s`, up to `max_tokens` (finish "length"), or to
`eos_after` tokens (finish "stop"); a stop string ends it at its first occurrence. Each
of `n` choices gets its own deltas. With `pooling: true` it is an embedding model:
8-dimensional vectors computed from the token ids. Settings come from the LLMConfig's
`engine_kwargs`: token_delay_s, max_model_len, max_num_seqs, eos_after, pooling,
fail_start, fail_after (tokens, then an EngineError), reveal_pid (an adapter's first
word ends with `@<pid>`: which replica answered), batch (true: at most max_num_seqs
sequences run at once, the rest wait their turn, as a real engine's scheduler), tag_pid
(true: output words are `p<pid>t<step>`, so a test sees which replica's engine answered).
`loads` and `unloads` record the adapters it was told to load and unload, in order.
"""

from __future__ import annotations

import asyncio
import math
import os
import zlib
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any, cast

from surge.llm.config import LLMConfig
from surge.llm.engine import (
    AdapterError,
    Delta,
    EngineError,
    EngineStats,
    ModelInfo,
    Prompt,
    SamplingParams,
)

__all__ = ["FakeLLMEngine", "WordsChat", "word_tokens", "words_chat"]


_TOKEN_IDS: dict[str, int] = {}  # words seen, bounded (a 220 KB prompt: ~44,000 words)
_MAX_TOKEN_IDS = 1 << 16


def _token(word: str) -> int:
    """A word's id: a stable hash (crc32), kept once computed."""
    token = _TOKEN_IDS.get(word)
    if token is None:
        if len(_TOKEN_IDS) >= _MAX_TOKEN_IDS:
            _TOKEN_IDS.clear()
        token = _TOKEN_IDS[word] = zlib.crc32(word.encode()) % 50_000
    return token


def word_tokens(text: str) -> list[int]:
    """Words are tokens: each one's id by a stable hash (crc32, kept per word)."""
    words = text.split()
    known = list(map(_TOKEN_IDS.get, words))  # (most words are known: read at C speed)
    if None not in known:
        return cast(list[int], known)
    return [_token(word) if token is None else token
            for word, token in zip(words, known, strict=True)]


def words_chat(messages: Sequence[Mapping[str, Any]], add_generation_prompt: bool) -> Prompt:
    """The fake chat template: `role: content` lines (text parts joined), `assistant:`."""
    lines = []
    for message in messages:
        content = message.get("content") or ""
        if isinstance(content, list):  # content parts: the text ones
            content = " ".join(p.get("text", "") for p in content if isinstance(p, dict))
        lines.append(f"{message['role']}: {content}")
    if add_generation_prompt:
        lines.append("assistant:")
    text = "\n".join(lines)
    return Prompt(text=text, token_ids=tuple(word_tokens(text)))


class WordsChat:
    """An engine's chat template and tokenizer where words are tokens (the fakes')."""

    async def render_chat(self, messages: Sequence[Mapping[str, Any]], *,
                          add_generation_prompt: bool = True,
                          continue_final_message: bool = False,
                          tools: Sequence[Mapping[str, Any]] | None = None,
                          chat_template_kwargs: Mapping[str, Any] | None = None) -> Prompt:
        return words_chat(messages, add_generation_prompt)

    async def tokenize(self, text: str) -> list[int]:
        return word_tokens(text)


class FakeLLMEngine(WordsChat):
    def __init__(self, llm_config: LLMConfig) -> None:
        kwargs = llm_config.engine_kwargs
        self.config = llm_config
        self.token_delay_s = float(kwargs.get("token_delay_s", 0.0))
        self.max_model_len = int(kwargs.get("max_model_len", 256))
        self.max_num_seqs = int(kwargs.get("max_num_seqs", 16))
        self.eos_after = kwargs.get("eos_after")
        self.pooling = bool(kwargs.get("pooling", False))
        self.fail_start = bool(kwargs.get("fail_start", False))
        self.fail_after = kwargs.get("fail_after")
        self.batch = bool(kwargs.get("batch", False))
        self.tag = f"p{os.getpid()}t" if kwargs.get("tag_pid") else "t"
        self._slots: asyncio.Semaphore | None = None
        self.active: dict[str, int] = {}  # request id -> tokens (prompt + output) so far
        self.aborted: list[str] = []
        self.adapters: dict[str, str] = {}
        self.loads: list[str] = []
        self.unloads: list[str] = []
        self.reveal_pid = bool(kwargs.get("reveal_pid", False))
        self.started = False

    def __repr__(self) -> str:
        return (f"<FakeLLMEngine active={len(self.active)} aborted={len(self.aborted)} "
                f"adapters={sorted(self.adapters)}>")

    async def start(self) -> ModelInfo:
        if self.fail_start:
            raise EngineError("the fake engine was told to fail at start")
        self.started = True
        return ModelInfo(max_model_len=self.max_model_len, is_pooling=self.pooling)

    async def generate(self, prompt: Prompt, params: SamplingParams, request_id: str, *,
                       adapter: str | None = None) -> AsyncIterator[Delta]:
        if adapter is not None and adapter not in self.adapters:
            raise AdapterError(f"adapter {adapter!r} is not loaded")
        if request_id in self.active:
            raise ValueError(f"request id {request_id} is already running")
        prompt_tokens = len(prompt.token_ids or ())
        self.active[request_id] = prompt_tokens
        limit = params.max_tokens or (self.max_model_len - prompt_tokens)
        if self.eos_after is not None and not params.ignore_eos:
            limit = min(limit, int(self.eos_after))
        if self.batch and self._slots is None:
            self._slots = asyncio.Semaphore(self.max_num_seqs)
        slots, held = self._slots if self.batch else None, False
        try:
            if slots is not None:
                await slots.acquire()
                held = True
            async for delta in self._steps(request_id, params, limit, adapter, prompt_tokens):
                yield delta
        finally:
            self.active.pop(request_id, None)
            if held and slots is not None:
                slots.release()

    async def _steps(self, request_id: str, params: SamplingParams, limit: int,
                     adapter: str | None, prompt_tokens: int) -> AsyncIterator[Delta]:
        for step in range(max(limit, 0)):
            if self.token_delay_s:
                await asyncio.sleep(self.token_delay_s)
            else:
                await asyncio.sleep(0)
            if self.fail_after is not None and step >= int(self.fail_after):
                raise EngineError("the fake engine was told to fail")
            self.active[request_id] += params.n
            last = step == limit - 1
            word = f"{self.tag}{step}" if adapter is None else f"{adapter}{step}"
            if adapter is not None and step == 0 and self.reveal_pid:
                word += f"@{os.getpid()}"
            text = word if step == 0 else f" {word}"
            reason = None
            if any(stop in word for stop in params.stop):
                text, reason = "", "stop"
            elif last:
                stopped = self.eos_after is not None and limit == int(self.eos_after)
                reason = "stop" if stopped else "length"
            for index in range(params.n):
                yield Delta(text, (_token(word),), reason, index,
                            prompt_tokens if step == 0 else 0)
            if reason is not None:
                return

    async def embed(self, inputs: Sequence[Prompt], request_id: str) -> list[list[float]]:
        if not self.pooling:
            raise EngineError("not a pooling model")
        vectors = []
        for prompt in inputs:
            ids = prompt.token_ids or ()
            raw = [math.sin(sum(ids) * (i + 1) + len(ids)) for i in range(8)]
            norm = math.sqrt(sum(x * x for x in raw)) or 1.0
            vectors.append([x / norm for x in raw])
        return vectors

    async def abort(self, request_id: str) -> None:
        self.aborted.append(request_id)
        self.active.pop(request_id, None)

    def stats(self) -> EngineStats:
        active = len(self.active)
        used = sum(self.active.values())
        return EngineStats(waiting=max(0, active - self.max_num_seqs),
                           running=min(active, self.max_num_seqs),
                           kv_cache_usage=min(1.0, used / (self.max_num_seqs
                                                           * self.max_model_len)),
                           max_running=self.max_num_seqs)

    async def check_health(self) -> None:
        if not self.started:
            raise EngineError("the fake engine is not started")

    async def load_adapter(self, name: str, path: str) -> None:
        if not os.path.isdir(path):
            raise AdapterError(f"no adapter at {path}")
        self.adapters[name] = path
        self.loads.append(name)

    async def unload_adapter(self, name: str) -> None:
        self.adapters.pop(name, None)
        self.unloads.append(name)

    async def shutdown(self) -> None:
        self.started = False
