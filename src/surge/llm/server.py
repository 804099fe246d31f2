"""`LLMServer`: the deployment that runs one model's engine and speaks OpenAI.

Its replica is the HTTP ingress of a one-model app (`serve.ingress()`, late-bound: the
ASGI app is built around the engine once it started), so a request goes proxy →
replica → engine, one hop. The constructor is async, as Ray's: it starts the engine
before the replica reports ready. Handle calls (`chat`, `completions`, `embeddings`)
take Ray's request objects or plain dicts, and `openai_http` serves the multi-model
ingress. `record_routing_stats` and `record_autoscaling_stats` report the engine's load
(Ray's hooks), sampled with the engine gauges every `SAMPLE_S`.
"""

from __future__ import annotations

import asyncio
import copy
import importlib
import logging
from collections.abc import AsyncIterator
from typing import Any

import msgspec

from surge.llm.asgi import OpenAIApp, answer
from surge.llm.config import LLMConfig
from surge.llm.engine import EngineStats, LLMEngine, ModelInfo
from surge.llm.metrics import SAMPLE_S, LLMMetrics
from surge.llm.responses import encode
from surge.llm.service import OpenAIService, engine_error
from surge.replica.ingress import ingress

__all__ = ["DEFAULT_MAX_NUM_SEQS", "LLMServer", "engine_class", "load_class"]

log = logging.getLogger("surge.llm")

# vLLM's default batch size (max_num_seqs) where engine_kwargs do not say.
DEFAULT_MAX_NUM_SEQS = 256
# Ray Serve LLM's health check defaults (ray/llm/_internal/serve/constants.py).
HEALTH_CHECK_PERIOD_S = 10
HEALTH_CHECK_TIMEOUT_S = 10
# How often the replica reports its engine's queue to the routers and the controller
# (request_router_config, where the user sets none): Ray's 10 s would route on a queue
# long gone; reading the engine's stats costs microseconds.
ROUTING_STATS_PERIOD_S = 0.25
ROUTING_STATS_TIMEOUT_S = 1.0


def engine_class(config: LLMConfig) -> type[LLMEngine]:
    """The engine an LLMConfig names: vLLM, or an import path ("module:Class")."""
    if config.llm_engine == "vLLM":
        from surge.llm.vllm_engine import VLLMEngine

        return VLLMEngine
    engine: type[LLMEngine] = load_class(config.llm_engine)
    return engine


def load_class(path: str) -> Any:
    """`module:Attr` or `module.Attr`."""
    module_name, _, attr = path.rpartition(":" if ":" in path else ".")
    found: Any = importlib.import_module(module_name)
    for part in attr.split("."):
        found = getattr(found, part)
    return found


def _as_body(request: Any) -> bytes:
    if isinstance(request, bytes | bytearray):
        return bytes(request)
    if isinstance(request, msgspec.Struct):
        return encode(request)
    if hasattr(request, "model_dump"):  # a pydantic request object, as Ray's
        request = request.model_dump(exclude_none=True)
    return encode(request)


class _Server:
    """The engine, the OpenAI service over it, and the load sampler."""

    _default_engine_cls: type[LLMEngine] | None = None
    # The engine sizes its own thread pools (replica/threads.py leaves them alone): vLLM
    # on CPU binds its OpenMP threads to the cores VLLM_CPU_OMP_THREADS_BIND gives each
    # worker, and unbound it runs as many as torch's pool (which OMP_NUM_THREADS sizes);
    # LLMServer's num_cpus (1 by default) would leave it one thread. env_vars still apply.
    __surge_own_thread_pools__ = True

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self._llm_config.model_id} engine={self.engine!r}>"

    def _init_shared(self, llm_config: LLMConfig | dict[str, Any],
                     engine_cls: type[LLMEngine] | None = None) -> None:
        self._llm_config = LLMConfig.from_dict(llm_config)
        self._engine_cls = engine_cls or self._default_engine_cls or \
            engine_class(self._llm_config)
        self.engine: LLMEngine | None = None
        self.service: OpenAIService | None = None
        self._stats = EngineStats()
        self._sampler: asyncio.Task[None] | None = None

    async def start(self) -> None:
        """Start the engine (load the model); the replica is ready when this returns."""
        config = self._llm_config
        engine = self.engine = self._engine_cls(config)  # type: ignore[call-arg]
        info: ModelInfo = await engine.start()
        metrics = LLMMetrics(config.model_id) if config.log_engine_metrics else None
        self.service = OpenAIService(config, engine, info, metrics)
        self._sampler = asyncio.get_running_loop().create_task(self._sample(metrics))
        log.info("LLMServer %s: engine %s started (max_model_len %d)", config.model_id,
                 type(engine).__name__, info.max_model_len)

    async def _sample(self, metrics: LLMMetrics | None) -> None:
        while self.engine is not None:
            try:
                self._stats = self.engine.stats()
                if metrics is not None:
                    metrics.engine(self._stats)
            except Exception:  # a sampler must never die: the next sample may work
                log.exception("engine stats failed")
            await asyncio.sleep(SAMPLE_S)

    def _service(self) -> OpenAIService:
        if self.service is None:
            raise RuntimeError("the LLMServer's engine is not started (call start())")
        return self.service

    async def __serve_build_asgi_app__(self) -> OpenAIApp:
        return OpenAIApp(self._service())

    # -- handle calls, as Ray's LLMServer -------------------------------------------------

    async def _run(self, kind: str, request: Any) -> AsyncIterator[Any]:
        service = self._service()
        try:
            run = await (service.prepare_chat(_as_body(request)) if kind == "chat"
                         else service.prepare_completion(_as_body(request)))
            if run.stream_requested:
                async for part in run.stream():
                    yield part.decode()
            else:
                yield await run.complete()
        except Exception as exc:
            yield engine_error(exc).body()

    def chat(self, request: Any, raw_request_info: Any = None) -> AsyncIterator[Any]:
        """Stream SSE strings (`stream: true`) or yield the response (or error) object."""
        return self._run("chat", request)

    def completions(self, request: Any, raw_request_info: Any = None) -> AsyncIterator[Any]:
        return self._run("completion", request)

    async def embeddings(self, request: Any, raw_request_info: Any = None,
                         ) -> AsyncIterator[Any]:
        try:
            yield await self._service().embeddings(_as_body(request))
        except Exception as exc:
            yield engine_error(exc).body()

    async def openai_http(self, method: str, path: str, body: bytes) -> AsyncIterator[Any]:
        """For the multi-model ingress: the head (status, headers, body), then parts."""
        head, parts = await answer(self._service(), method, path, body)
        yield head
        if parts is not None:
            async for part in parts:
                yield part

    async def llm_config(self) -> LLMConfig:
        return self._llm_config

    async def check_health(self) -> None:
        if self.engine is not None:
            await self.engine.check_health()

    def _fresh_stats(self) -> EngineStats:
        if self.engine is not None:
            self._stats = self.engine.stats()
        return self._stats

    async def record_routing_stats(self) -> dict[str, Any]:
        """The engine's load (waiting, running, KV cache), for LLM-aware routing, the
        requests aborted so far (their clients went away, or they failed mid-way) and,
        for an engine with KV events, what it cached and evicted since the last call
        (`kv_prefix`, in the routers' chunk names: policy/kv_chunks.py)."""
        aborted = self.service.aborted if self.service is not None else 0
        stats: dict[str, Any] = {**self._fresh_stats().to_dict(), "aborted": aborted}
        change = self.service.prefix_change() if self.service is not None else None
        if change is not None:
            stats["kv_prefix"] = change  # what the engine cached and evicted since
        return stats

    async def record_autoscaling_stats(self) -> dict[str, float]:
        """Ray's custom autoscaling metrics hook: the engine's queue and KV-cache use, and
        what it sustains as the replica measured it (policy/llm_capacity.py: the prefill
        backlog and rate, the mean prompt, the decode step's cost), for latency
        objectives."""
        stats = self._fresh_stats()
        measured = self.service.capacity.report(self.service.clock()) \
            if self.service is not None else {}
        return {"engine_waiting": float(stats.waiting), "engine_running": float(stats.running),
                "kv_cache_usage": stats.kv_cache_usage, **measured}

    async def shutdown(self) -> None:
        engine, self.engine = self.engine, None
        if self._sampler is not None:
            self._sampler.cancel()
        if engine is not None:
            await engine.shutdown()

    @classmethod
    def get_deployment_options(cls, llm_config: LLMConfig) -> dict[str, Any]:
        """The deployment's options: the config's, plus the hardware its engine needs."""
        options = copy.deepcopy(dict(llm_config.deployment_config))
        actor = dict(options.get("ray_actor_options") or {})
        gpus = llm_config.engine_gpus()
        if gpus and "num_gpus" not in actor:
            actor["num_gpus"] = gpus
        if llm_config.accelerator_type:
            resources = dict(actor.get("resources") or {})
            resources.setdefault(f"accelerator_type:{llm_config.accelerator_type}", 0.001)
            actor["resources"] = resources
        env = dict((llm_config.runtime_env or {}).get("env_vars") or {})
        if env:
            runtime_env = dict(actor.get("runtime_env") or {})
            runtime_env["env_vars"] = {**(runtime_env.get("env_vars") or {}), **env}
            actor["runtime_env"] = runtime_env
        if actor:
            options["ray_actor_options"] = actor
        return options

    @staticmethod
    def default_options(llm_config: LLMConfig) -> dict[str, Any]:
        """Defaults where the config says nothing (surge's, where Ray's are unbounded).

        Ray admits 1e9 requests per replica and targets 1e9 ongoing ones, so its queue
        lives unbounded in the engine and autoscaling never sees it. surge admits twice
        the engine's batch (a full batch plus as many waiting), so beyond that requests
        wait in the router's bounded queue or are answered 503 at once, and it targets
        one full batch per replica. Its engine reports its queue every
        ROUTING_STATS_PERIOD_S (Ray: every 10 s).
        """
        seqs = int(llm_config.engine_kwargs.get("max_num_seqs", DEFAULT_MAX_NUM_SEQS))
        return {"max_ongoing_requests": 2 * seqs,
                "health_check_period_s": HEALTH_CHECK_PERIOD_S,
                "health_check_timeout_s": HEALTH_CHECK_TIMEOUT_S,
                "request_router_config": {
                    "request_routing_stats_period_s": ROUTING_STATS_PERIOD_S,
                    "request_routing_stats_timeout_s": ROUTING_STATS_TIMEOUT_S},
                "autoscaling_config": {"target_ongoing_requests": seqs}}


@ingress()
class LLMServer(_Server):
    """Ray Serve LLM's `LLMServer`: `await LLMServer(llm_config)` is a started server."""

    async def __init__(self, llm_config: LLMConfig | dict[str, Any], *,  # type: ignore[misc]
                       engine_cls: type[LLMEngine] | None = None,
                       model_downloader: Any = None) -> None:
        self._init_shared(llm_config, engine_cls)
        await self.start()

    @classmethod
    def sync_init(cls, llm_config: LLMConfig | dict[str, Any], *,
                  engine_cls: type[LLMEngine] | None = None,
                  model_downloader: Any = None) -> LLMServer:
        """An unstarted server (await `start()`), as Ray's."""
        instance = cls.__new__(cls)
        instance._init_shared(llm_config, engine_cls)
        return instance


