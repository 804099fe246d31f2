"""A replica's LoRA adapters: multiplexed models, so routers send adapters where they are.

An adapter `base:adapter` is a multiplexed model of the LLM server (Ray Serve LLM's
`serve.multiplexed` on its loader): the replica's `ModelCache` loads it on first use
(single flight: concurrent requests for one adapter await one load), holds at most
`lora_config.max_num_adapters_per_replica`, and to make room unloads the least recently
used one from the engine. The cache tells this replica's routers what it holds (the
`Models` frame, with `lora_base` = the model id, so the proxy routes a body's
`model: base:adapter` by adapter: policy/llm_models.py), and the router sends an
adapter's requests to a replica holding it, spreads a hot one, and places a cold one by
the multiplexing policy (policy/model_routing.py).

An adapter is not unloaded under a running request: the unload waits until its requests
ended (`get` holds it, `release` lets go), at most UNLOAD_GRACE_S; asked for again
meanwhile, it loads again once the unload is done.

Where an adapter comes from: `dynamic_lora_loading_path/adapter`, a local path or
`file://` as it is, `s3://`/`gs://` downloaded once per node (lora_cloud.py).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from surge.errors import ConfigError
from surge.llm.config import LoraConfig
from surge.llm.engine import AdapterError, LLMEngine
from surge.llm.lora_cloud import CLOUD_SCHEMES, NodeCache, store_for
from surge.policy.llm_models import split_lora_id
from surge.replica.multiplex import ModelCache, RoutingSettings

__all__ = ["Adapters", "adapter_location"]

log = logging.getLogger("surge.llm")

# How long an unload waits for the adapter's running requests (a stream never consumed
# must not pin an adapter forever).
UNLOAD_GRACE_S = 30.0


def adapter_location(base: str | None, adapter: str) -> str:
    """Where `adapter` lives under `dynamic_lora_loading_path` (a URL or a local path)."""
    parts = adapter.replace("\\", "/").split("/")
    if adapter.startswith("/") or any(p in ("", ".", "..") for p in parts):
        raise AdapterError(f"{adapter!r} is not an adapter name (a relative path without "
                           "'.' or '..' parts)")
    if base is None:
        return adapter
    return f"{base}/{adapter}".removeprefix("file://")


class Adapters:
    """The adapters loaded into one engine, as a multiplexed model cache."""

    def __init__(self, model_id: str, lora: LoraConfig, engine: LLMEngine,
                 node_cache: NodeCache | None = None) -> None:
        self.model_id = model_id
        self.lora = lora
        self.engine = engine
        path = lora.dynamic_lora_loading_path
        self.cloud = path is not None and path.startswith(CLOUD_SCHEMES)
        if self.cloud:
            assert path is not None
            store_for(path)  # a missing client fails the deploy, naming the package
        elif path is not None and "://" in path and not path.startswith("file://"):
            raise ConfigError(f"lora_config.dynamic_lora_loading_path {path}: surge loads "
                              "adapters from s3://, gs://, file:// and local paths (Ray's "
                              "Azure schemes are not supported yet)")
        self.node_cache = node_cache or NodeCache(tries=lora.max_download_tries,
                                                  timeout_s=lora.download_timeout_s)
        settings = RoutingSettings(capacity=lora.max_num_adapters_per_replica,
                                   lora_base=model_id)
        self.cache = ModelCache(self._load, lora.max_num_adapters_per_replica, settings,
                                unload=self._unload)
        self.in_use: dict[str, int] = {}  # adapter -> requests using it now
        self._idle: dict[str, asyncio.Event] = {}  # set when an unloading adapter's last
        # running request ends
        self._unloading: dict[str, asyncio.Event] = {}  # set when its unload is done

    def __repr__(self) -> str:
        return f"<Adapters {self.model_id} {self.cache!r} leaving={self.leaving()}>"

    def names(self) -> list[str]:
        """The adapters loaded now (names, without the base's prefix)."""
        return sorted(split_lora_id(model)[1] for model in self.cache.models)

    def leaving(self) -> list[str]:
        """The adapters being unloaded now (waiting for their running requests first)."""
        return sorted(self._unloading)

    async def get(self, adapter: str) -> None:
        """Load `adapter` into the engine unless it is there (the LRU one may leave), and
        hold it for the caller's request (`release` when it ends)."""
        await self.cache.get(f"{self.model_id}:{adapter}")
        self.in_use[adapter] = self.in_use.get(adapter, 0) + 1

    def release(self, adapter: str) -> None:
        left = self.in_use.get(adapter, 0) - 1
        if left > 0:
            self.in_use[adapter] = left
            return
        self.in_use.pop(adapter, None)
        idle = self._idle.pop(adapter, None)
        if idle is not None:
            idle.set()

    async def _load(self, model: str) -> str:
        adapter = split_lora_id(model)[1]
        unloading = self._unloading.get(adapter)
        if unloading is not None:  # asked for again while it leaves: load it after
            await unloading.wait()
        where = adapter_location(self.lora.dynamic_lora_loading_path, adapter)
        path = await self.node_cache.fetch(where) if self.cloud else where
        await self.engine.load_adapter(adapter, path)
        log.info("LoRA adapter %s loaded from %s", model, where)
        return adapter

    async def _unload(self, model: str, adapter: Any) -> None:
        name = str(adapter)
        done = self._unloading[name] = asyncio.Event()
        try:
            if name in self.in_use:
                idle = self._idle.setdefault(name, asyncio.Event())
                try:
                    await asyncio.wait_for(idle.wait(), UNLOAD_GRACE_S)
                except TimeoutError:
                    log.warning("unloading the adapter %s under %d running requests",
                                model, self.in_use.get(name, 0))
            await self.engine.unload_adapter(name)
            log.info("LoRA adapter %s unloaded (least recently used)", model)
        finally:
            del self._unloading[name]
            done.set()

    async def shutdown(self) -> None:
        await self.cache.shutdown()
