"""The mock vLLM engine with weights to load, for bench/llm_standby.py.

`WeightedMockEngine` (engine_kwargs `weights_path`, `weights_via`: "copy" or "store")
loads a safetensors file before it starts, as a real engine loads its model: "copy"
reads it into the process (what a framework's loader does), "store" maps the node's
copy (`surge.weights.load_async`: the first replica on the node pays the copy, every
later one maps it).

vLLM's counterpart is bench/apps/llm_store_vllm.py (it imports vLLM).
"""

from __future__ import annotations

import os
from typing import Any

from surge import weights
from surge.llm.config import LLMConfig
from surge.llm.engine import ModelInfo
from surge.testing.mock_vllm import MockVLLMEngine

__all__ = ["WeightedMockEngine"]


class WeightedMockEngine(MockVLLMEngine):
    def __init__(self, llm_config: LLMConfig) -> None:
        super().__init__(llm_config)
        kwargs = llm_config.engine_kwargs
        self.weights_path = str(kwargs.get("weights_path") or "")
        self.weights_via = str(kwargs.get("weights_via", "copy"))
        self.held: Any = None  # the weights, resident while the engine lives

    async def start(self) -> ModelInfo:
        if self.weights_path and self.weights_via == "store":
            self.held = await weights.load_async("standby-bench", self.weights_path)
        elif self.weights_path:
            self.held = _read(self.weights_path)
        return await super().start()


def _read(path: str) -> bytearray:
    """The whole file in this process's memory (one read, as a loader's)."""
    buffer = bytearray(os.path.getsize(path))
    with open(path, "rb", buffering=0) as file:
        view, done = memoryview(buffer), 0
        while done < len(buffer):
            done += file.readinto(view[done:]) or 0
    return buffer
