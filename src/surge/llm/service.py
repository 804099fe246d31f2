"""The OpenAI API over one engine, independent of how requests arrive.

`prepare_chat`/`prepare_completion` do everything that may fail before the first byte
(decode, checks, model selection, chat template, context length), so an error is an
OpenAI error with its status rather than a broken stream; the `Run` they return then
streams Server-Sent Events (`stream()`, one body part per engine step: the first part
goes out as soon as the engine yields the first token) or builds the whole answer
(`complete()`). A run that ends early, by a client disconnect (the task is cancelled)
or by an error, aborts its engine request, so the engine stops spending tokens on it.

An engine that publishes its KV events (`kv_events()`, as the mock vLLM engine does)
gets a `ChunkCoverage` (policy/kv_chunks.py): each prompt that came as an HTTP body is,
once its first token went out (never before it: naming a long prompt takes ~1 ms),
named in the routers' chunks and read against the engine's blocks, so LLMServer's
routing stats can tell routers what the engine holds.

Every run is counted in the service's `CapacityMeter` (policy/llm_capacity.py: its prompt
in the prefill backlog until its first token, its inter-token gaps against the decode
batch), which LLMServer's autoscaling stats report. With a TTFT objective (the
deployment's `autoscaling_config.objectives`, shed on), a request that would wait past
it behind the backlog is answered 429 with Retry-After when prepared
(policy/llm_shedding.py).
"""

from __future__ import annotations

import os
import time
from collections.abc import AsyncGenerator, Callable, Mapping
from contextlib import aclosing
from typing import Any

from surge.codecs.kv_events import replay
from surge.config.autoscaling import Objectives, parse_objectives
from surge.llm.config import LLMConfig
from surge.llm.engine import (
    AdapterError,
    Delta,
    EngineError,
    EngineOverloaded,
    LLMEngine,
    ModelInfo,
    Prompt,
    PromptTooLong,
    SamplingParams,
)
from surge.llm.lora import Adapters
from surge.llm.metrics import LLMMetrics
from surge.llm.protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    EmbeddingRequest,
    OpenAIError,
    decode,
    sampling_params,
)
from surge.llm.responses import (
    DONE,
    Usage,
    chat_chunk,
    chat_response,
    completion_chunk,
    completion_response,
    embedding_response,
    model_card,
    sse,
    usage_chunk,
)
from surge.policy.kv_chunks import ChunkCoverage
from surge.policy.llm_capacity import CapacityMeter
from surge.policy.llm_models import split_lora_id
from surge.policy.llm_shedding import shed_retry_after
from surge.policy.prefix_index import prompt_stream
from surge.policy.prompt_names import PromptNames
from surge.replica.context import deployment_objectives, replica_context_or_none

__all__ = ["OpenAIService", "Run", "engine_error", "objectives_of"]


def engine_error(exc: BaseException) -> OpenAIError:
    """The OpenAI error for what an engine raised."""
    if isinstance(exc, OpenAIError):
        return exc
    if isinstance(exc, PromptTooLong):
        return OpenAIError(400, str(exc), param="messages")
    if isinstance(exc, EngineOverloaded):
        return OpenAIError(429, str(exc), type="rate_limit_error", code="rate_limit_exceeded",
                           retry_after_s=exc.retry_after_s)
    if isinstance(exc, AdapterError):
        return OpenAIError(404, str(exc), param="model", code="model_not_found")
    if isinstance(exc, ValueError):  # engines reject bad parameters with ValueError
        return OpenAIError(400, str(exc))
    return OpenAIError(500, f"The engine failed: {type(exc).__name__}: {exc}",
                       type="server_error", code="internal_error")


class OpenAIService:
    def __init__(self, config: LLMConfig, engine: LLMEngine, info: ModelInfo,
                 metrics: LLMMetrics | None = None,
                 clock: Callable[[], float] = time.perf_counter) -> None:
        self.config = config
        self.engine = engine
        self.info = info
        self.metrics = metrics
        self.clock = clock
        self.model_id = config.model_id
        self.created = int(time.time())
        # LoRA adapters loaded into the engine: a multiplexed model cache (llm/lora.py)
        self.loras = Adapters(config.model_id, config.lora, engine) \
            if config.lora is not None else None
        self.aborted = 0  # engine requests aborted: client gone, or failed mid-way
        # what the engine caches, in the routers' chunk names (engines with KV events)
        self.prefixes = ChunkCoverage() if callable(getattr(engine, "kv_events", None)) \
            else None
        self.prompt_names = PromptNames()  # recent prompts: their chunks not hashed again
        self.capacity = CapacityMeter()  # what the engine sustains (autoscaling stats)
        self.objectives = objectives_of(config)
        self.shed = 0  # requests answered 429 against the TTFT objective

    def __repr__(self) -> str:
        return f"<OpenAIService {self.model_id} adapters={self.adapters}>"

    @property
    def adapters(self) -> list[str]:
        """The LoRA adapters loaded now."""
        return self.loras.names() if self.loras is not None else []

    # -- models -------------------------------------------------------------------------

    def cards(self) -> list[dict[str, Any]]:
        cards = [model_card(self.model_id, self.created, root=self.config.loading.source,
                            max_model_len=self.info.max_model_len)]
        cards += [model_card(f"{self.model_id}:{name}", self.created, parent=self.model_id,
                             max_model_len=self.info.max_model_len)
                  for name in self.adapters]
        return cards

    def card(self, model_id: str) -> dict[str, Any]:
        for card in self.cards():
            if card["id"] == model_id:
                return card
        raise unknown_model(model_id)

    async def adapter_for(self, model: str | None) -> str | None:
        """The LoRA adapter a request's `model` names (None: the base model), loaded and
        held for the request (`release` it); 404 else."""
        if model is None or model == self.model_id:
            return None
        base, adapter = split_lora_id(model)
        if base != self.model_id or not adapter or self.loras is None:
            raise unknown_model(model)
        try:
            await self.loras.get(adapter)
        except (AdapterError, NotImplementedError, FileNotFoundError) as exc:
            raise OpenAIError(404, f"The adapter {model!r} could not be loaded: {exc}",
                              param="model", code="model_not_found") from None
        return adapter

    # -- generation ---------------------------------------------------------------------

    async def prepare_chat(self, body: bytes | ChatCompletionRequest) -> Run:
        started = self.clock()
        request = body if isinstance(body, ChatCompletionRequest) else \
            decode(body, ChatCompletionRequest)
        self._generation_only()
        adapter = await self.adapter_for(request.model)
        try:
            prompt = await self.engine.render_chat(
                request.messages, add_generation_prompt=request.add_generation_prompt,
                continue_final_message=request.continue_final_message, tools=request.tools,
                chat_template_kwargs=request.chat_template_kwargs)
            return self._run("chat", request, prompt, adapter, started,
                             body if isinstance(body, bytes) else None)
        except BaseException as exc:
            self.release(adapter)
            if isinstance(exc, Exception):
                raise engine_error(exc) from None
            raise

    async def prepare_completion(self, body: bytes | CompletionRequest) -> Run:
        started = self.clock()
        request = body if isinstance(body, CompletionRequest) else \
            decode(body, CompletionRequest)
        self._generation_only()
        adapter = await self.adapter_for(request.model)
        try:
            return await self._prepare_completion(request, adapter, started,
                                                  body if isinstance(body, bytes) else None)
        except BaseException:
            self.release(adapter)
            raise

    async def _prepare_completion(self, request: CompletionRequest, adapter: str | None,
                                  started: float, body: bytes | None) -> Run:
        source = request.prompt
        if isinstance(source, list) and source and isinstance(source[0], str | list):
            if len(source) != 1:
                raise OpenAIError(400, "several prompts in one request are not supported by "
                                       "surge's OpenAI server yet: send one per request",
                                  param="prompt")
            source = source[0]
        if isinstance(source, str):
            prompt = Prompt(text=source, token_ids=tuple(await self.engine.tokenize(source)))
        else:
            prompt = Prompt(token_ids=tuple(int(t) for t in source))
        return self._run("completion", request, prompt, adapter, started, body)

    def release(self, adapter: str | None) -> None:
        """The request that held `adapter` (adapter_for) ended: it may be unloaded."""
        if adapter is not None and self.loras is not None:
            self.loras.release(adapter)

    def _generation_only(self) -> None:
        if self.info.is_pooling:
            raise OpenAIError(400, f"The model {self.model_id!r} is an embedding model: it "
                                   "serves /v1/embeddings only")

    def _run(self, kind: str, request: ChatCompletionRequest | CompletionRequest,
             prompt: Prompt, adapter: str | None, started: float, body: bytes | None) -> Run:
        prompt_tokens = len(prompt.token_ids or ())
        # a request that can never succeed is told so (400) before any shed (429: retry)
        params = sampling_params(request, prompt_tokens, self.info.max_model_len)
        self._admit(prompt_tokens)
        run = Run(self, kind, request, prompt, params, adapter, started)
        if self.prefixes is not None:
            run.body = body  # its prompt is read once the engine computed it
        return run

    def _admit(self, prompt_tokens: int) -> None:
        """Shed (429) a request its TTFT objective cannot be met for behind the backlog."""
        objectives = self.objectives
        if objectives is None or not objectives.shed or objectives.ttft_s is None:
            return
        meter = self.capacity
        retry = shed_retry_after(meter.backlog_tokens, prompt_tokens,
                                 meter.prefill_tokens_per_s, objectives.ttft_s)
        if retry is None:
            return
        self.shed += 1
        raise OpenAIError(429, f"The model {self.model_id!r} is at capacity: "
                               f"{meter.backlog_tokens} prompt tokens are waiting, which "
                               f"misses its TTFT objective of {objectives.ttft_s * 1000:g} "
                               "ms; retry later", type="rate_limit_error",
                          code="rate_limit_exceeded", retry_after_s=retry)

    def prompt_served(self, run: Run) -> None:
        """The engine computed `run`'s prompt (its first token went out): its chunks, as
        the router read them from the same body, may now be held."""
        stream = prompt_stream(run.body) if run.body is not None else None
        if self.prefixes is None or stream is None or not run.prompt.token_ids:
            return
        lora = getattr(self.engine, "lora_id", None)
        lora_id = lora(run.adapter) if lora is not None and run.adapter else None
        self.prefixes.served(self.prompt_names.names(stream), len(stream),
                             run.prompt.token_ids, lora_id)

    def prefix_change(self) -> dict[str, Any] | None:
        """What the engine cached and evicted since the last call, in chunk names (the
        routing stats' `kv_prefix`); None for an engine without KV events."""
        if self.prefixes is None:
            return None
        for batch in self.engine.kv_events():  # type: ignore[attr-defined]
            replay(batch.events, self.prefixes)
        change = self.prefixes.take()
        return {"stored": change.stored, "removed": change.removed, "cleared": change.cleared}

    async def embeddings(self, body: bytes | EmbeddingRequest) -> dict[str, Any]:
        request = body if isinstance(body, EmbeddingRequest) else decode(body, EmbeddingRequest)
        if request.model is not None and request.model != self.model_id:
            raise unknown_model(request.model)
        if not self.info.is_pooling:
            raise OpenAIError(400, f"The model {self.model_id!r} does not support embeddings: "
                                   "serve a pooling model (an embedding model) for them")
        inputs = request.input
        if isinstance(inputs, str) or (inputs and isinstance(inputs[0], int)):
            inputs = [inputs]
        prompts = []
        for item in inputs:
            if isinstance(item, str):
                prompts.append(Prompt(text=item, token_ids=tuple(await self.engine.tokenize(item))))
            else:
                prompts.append(Prompt(token_ids=tuple(item)))
        tokens = sum(len(p.token_ids or ()) for p in prompts)
        for prompt in prompts:
            if len(prompt.token_ids or ()) > self.info.max_model_len:
                raise OpenAIError(400, f"This model's maximum context length is "
                                       f"{self.info.max_model_len} tokens; an input has "
                                       f"{len(prompt.token_ids or ())}.", param="input")
        try:
            vectors = await self.engine.embed(prompts, _new_id("embd"))
        except Exception as exc:
            raise engine_error(exc) from None
        if request.dimensions is not None:
            vectors = [v[: request.dimensions] for v in vectors]
        out: list[Any] = vectors
        if request.encoding_format == "base64":
            import base64
            import struct

            out = [base64.b64encode(struct.pack(f"<{len(v)}f", *v)).decode() for v in vectors]
        return embedding_response(self.model_id, out, tokens)


class Run:
    """One prepared generation: stream it, or complete it (once)."""

    __slots__ = ("adapter", "body", "created", "include_usage", "kind", "model", "params",
                 "prompt", "request", "request_id", "service", "started")

    def __init__(self, service: OpenAIService, kind: str,
                 request: ChatCompletionRequest | CompletionRequest, prompt: Prompt,
                 params: SamplingParams, adapter: str | None, started: float) -> None:
        self.service = service
        self.kind = kind
        self.request = request
        self.prompt = prompt
        self.params = params
        self.adapter = adapter
        self.started = started
        self.created = int(time.time())
        self.request_id = request.request_id or _new_id("chatcmpl" if kind == "chat" else "cmpl")
        self.model = request.model or service.model_id
        options = request.stream_options
        self.include_usage = bool(options and options.include_usage)
        self.body: bytes | None = None  # the HTTP body, kept to name its prompt's chunks

    @property
    def stream_requested(self) -> bool:
        return bool(self.request.stream)

    async def stream(self) -> AsyncGenerator[bytes, None]:
        """The SSE body, one part per engine step; ends with `data: [DONE]`."""
        rid, created, model, usage = self.request_id, self.created, self.model, Usage()
        chat, include = self.kind == "chat", self.include_usage
        roles_sent = not chat  # the first chat part carries each choice's role first
        async with aclosing(self._deltas(usage)) as deltas:
            async for delta in deltas:
                part = b""
                if not roles_sent:
                    roles_sent = True
                    part = self._role_chunks(include)
                if delta.text or delta.finish_reason or not chat:
                    chunk = chat_chunk(rid, created, model, delta.index,
                                       {"content": delta.text}, delta.finish_reason,
                                       include) if chat else \
                        completion_chunk(rid, created, model, delta.index, delta.text,
                                         delta.finish_reason, include)
                    part += sse(chunk)
                if part:
                    yield part
        tail = DONE
        if include:
            kind = "chat.completion.chunk" if chat else "text_completion"
            tail = sse(usage_chunk(kind, rid, created, model, usage)) + DONE
        yield tail

    def _role_chunks(self, include: bool) -> bytes:
        return b"".join(sse(chat_chunk(self.request_id, self.created, self.model, i,
                                       {"role": "assistant", "content": ""}, None, include))
                        for i in range(self.params.n))

    async def complete(self) -> dict[str, Any]:
        usage = Usage()
        n = self.params.n
        texts: list[list[str]] = [[] for _ in range(n)]
        reasons: list[str | None] = [None] * n
        async with aclosing(self._deltas(usage)) as deltas:
            async for delta in deltas:
                texts[delta.index].append(delta.text)
                if delta.finish_reason:
                    reasons[delta.index] = delta.finish_reason
        build = chat_response if self.kind == "chat" else completion_response
        return build(self.request_id, self.created, self.model, ["".join(t) for t in texts],
                     reasons, usage)

    async def _deltas(self, usage: Usage) -> AsyncGenerator[Delta, None]:
        """The engine's deltas, counted into `usage` and the metrics; aborted if not done.

        Metrics are recorded after a delta went on its way (its consumer asked for the
        next one), and inter-token gaps at the end: never between a token and its send.
        """
        service = self.service
        engine, metrics, clock, meter = (service.engine, service.metrics, service.clock,
                                         service.capacity)
        overhead = clock() - self.started
        finished, first, last = False, True, 0.0
        ttft: float | None = None
        gaps: list[float] = []
        prompt_tokens = len(self.prompt.token_ids or ())
        meter.admitted(prompt_tokens, clock())
        try:
            async for delta in engine.generate(self.prompt, self.params, self.request_id,
                                               adapter=self.adapter):
                now = clock()
                count = len(delta.token_ids)
                if first:
                    first = False
                    usage.prompt, usage.cached = delta.prompt_tokens, delta.cached_tokens
                    ttft = now - self.started
                    meter.first_token(prompt_tokens, now)
                elif count:
                    gap = (now - last) / count
                    gaps.append(gap)
                    meter.gap(gap, meter.decoding)
                last = now
                usage.completion += count
                yield delta
                if ttft is not None:
                    if metrics is not None:
                        metrics.overhead.observe(overhead)
                        metrics.ttft.observe(ttft)
                    if self.body is not None:
                        service.prompt_served(self)
                ttft = None
            finished = True
        except (EngineError, ValueError) as exc:
            raise engine_error(exc) from None
        finally:
            meter.ended(prompt_tokens, not first, clock())
            try:
                if not finished:  # cancelled (client gone), or failed: free its slot
                    service.aborted += 1
                    await engine.abort(self.request_id)
            finally:
                service.release(self.adapter)  # the adapter may be unloaded now
            if metrics is not None:
                for gap in gaps:
                    metrics.itl.observe(gap)
                metrics.request_done(usage.prompt, usage.completion, clock() - self.started)


def objectives_of(config: LLMConfig) -> Objectives | None:
    """The latency objectives a replica sheds against: in a replica, its deployment's
    (the spec's: those its controller sizes for, wherever they were set); elsewhere (an
    LLMServer in a test or a script) those in the LLMConfig's deployment_config, where
    Ray Serve LLM's users set autoscaling. None when they state none."""
    if replica_context_or_none() is not None:
        objectives = deployment_objectives()
    else:
        scaling = config.deployment_config.get("autoscaling_config")
        objectives = (scaling.get("objectives") if isinstance(scaling, Mapping)  # or an
                      else getattr(scaling, "objectives", None))  # AutoscalingConfig
    return parse_objectives(objectives) if objectives is not None else None


def unknown_model(model: str) -> OpenAIError:
    return OpenAIError(404, f"The model `{model}` does not exist.", param="model",
                       code="model_not_found")


def _new_id(prefix: str) -> str:
    return f"{prefix}-{os.urandom(16).hex()}"
