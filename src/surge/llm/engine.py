"""The one small protocol every LLM engine speaks, and the values that cross it.

The OpenAI layer (`surge.llm.openai`) turns HTTP bodies into a `Prompt` and
`SamplingParams`, asks the engine to `generate` (an async iterator of `Delta`s, one per
engine step that produced tokens), and turns the deltas into chunks. An engine does the
model's work only: chat templates and tokenizing (`render_chat`, `tokenize`), generation,
embeddings, aborting a request, and reporting its load (`stats`: waiting and running
sequences, KV-cache use) for metrics and for routing and autoscaling signals.

vLLM's `AsyncLLM` behind this protocol is the production engine (`surge.llm.vllm_engine`);
`surge.testing.FakeLLMEngine` is a deterministic one for the protocol layer's tests.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

__all__ = ["AdapterError", "Delta", "EngineError", "EngineOverloaded", "EngineStats",
           "LLMEngine", "ModelInfo", "Prompt", "PromptTooLong", "SamplingParams"]


class EngineError(Exception):
    """The engine failed (HTTP 500 with an OpenAI error body)."""


class PromptTooLong(EngineError):
    """The prompt plus max_tokens does not fit the model's context (HTTP 400)."""


class EngineOverloaded(EngineError):
    """The engine's queue is over its bound (HTTP 429 with Retry-After)."""

    def __init__(self, message: str, retry_after_s: float = 1.0) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class AdapterError(EngineError):
    """A LoRA adapter could not be found or loaded (HTTP 404)."""


@dataclass(frozen=True, slots=True)
class Prompt:
    """What to generate from: text, token ids, or both (ids win when both are set)."""

    text: str | None = None
    token_ids: tuple[int, ...] | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class SamplingParams:
    max_tokens: int | None = None  # None: up to the model's context
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    min_tokens: int = 0
    n: int = 1
    seed: int | None = None
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logprobs: int | None = None
    ignore_eos: bool = False
    extra: Mapping[str, Any] = field(default_factory=dict)  # engine-specific extras


@dataclass(frozen=True, slots=True)
class Delta:
    """What one engine step added to a request's output (index: which of its n choices)."""

    text: str
    token_ids: tuple[int, ...]
    finish_reason: str | None = None  # "stop" | "length" | "abort" | None (not finished)
    index: int = 0
    prompt_tokens: int = 0  # set on the first delta
    cached_tokens: int = 0  # prompt tokens served from the prefix cache (first delta)


@dataclass(frozen=True, slots=True)
class EngineStats:
    """An engine's load right now: the signals routing and autoscaling want."""

    waiting: int = 0  # sequences queued, not yet scheduled
    running: int = 0  # sequences being decoded
    kv_cache_usage: float = 0.0  # fraction of the KV cache in use, 0..1
    max_running: int = 0  # the engine's max_num_seqs (0: unknown)
    prefix_cache_hit_rate: float = 0.0
    # Since the engine started, as vLLM's counters vllm:prefix_cache_queries / _hits:
    # prompt tokens looked up in the prefix cache, and found there.
    prefix_cache_queries: int = 0
    prefix_cache_hits: int = 0

    def to_dict(self) -> dict[str, float]:
        return {"waiting": self.waiting, "running": self.running,
                "kv_cache_usage": self.kv_cache_usage, "max_running": self.max_running,
                "prefix_cache_hit_rate": self.prefix_cache_hit_rate}


@dataclass(frozen=True, slots=True)
class ModelInfo:
    max_model_len: int
    is_pooling: bool = False  # serves embeddings, not generation
    has_chat_template: bool = True


@runtime_checkable
class LLMEngine(Protocol):
    """An engine for one model. Constructed with the LLMConfig; `start` loads it."""

    async def start(self) -> ModelInfo: ...

    async def render_chat(self, messages: Sequence[Mapping[str, Any]], *,
                          add_generation_prompt: bool = True,
                          continue_final_message: bool = False,
                          tools: Sequence[Mapping[str, Any]] | None = None,
                          chat_template_kwargs: Mapping[str, Any] | None = None) -> Prompt: ...

    def generate(self, prompt: Prompt, params: SamplingParams, request_id: str, *,
                 adapter: str | None = None) -> AsyncIterator[Delta]: ...

    async def embed(self, inputs: Sequence[Prompt], request_id: str) -> list[list[float]]: ...

    async def tokenize(self, text: str) -> list[int]: ...

    async def abort(self, request_id: str) -> None: ...

    def stats(self) -> EngineStats: ...

    async def check_health(self) -> None: ...

    async def load_adapter(self, name: str, path: str) -> None: ...

    async def unload_adapter(self, name: str) -> None: ...

    async def shutdown(self) -> None: ...
