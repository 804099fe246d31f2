"""vLLM reading its checkpoint through the node's weight store, for bench/llm_standby.py.

`StoreVLLMEngine` gives vLLM the checkpoint's folder with its weights file replaced by
the weight store's entry (a safetensors file in /dev/shm, surge.weights.formats): vLLM
reads the weights from shared memory (one copy per node, made by the first replica)
instead of the checkpoint's files. vLLM on CPU still copies them into its own tensors,
so the store saves the read, not the memory.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import Any

from surge import weights
from surge.llm.engine import ModelInfo
from surge.llm.vllm_engine import VLLMEngine

__all__ = ["StoreVLLMEngine"]


class StoreVLLMEngine(VLLMEngine):
    """vLLM on a copy of the checkpoint's folder whose weights file is the store's entry."""

    held: Any = None  # the store's entry, mapped while the engine lives
    folder: Path | None = None

    async def start(self) -> ModelInfo:
        source = Path(self.config.loading.source)
        self.held = await weights.load_async(self.config.model_id, str(source))
        folder = self.folder = Path(tempfile.mkdtemp(prefix="surge-store-model-"))
        for item in source.iterdir():
            if not item.name.endswith((".safetensors", ".safetensors.index.json")):
                (folder / item.name).symlink_to(item)
        (folder / "model.safetensors").symlink_to(self.held.info.path)
        self.args.model = str(folder)
        if self.args.tokenizer in (None, str(source)):
            self.args.tokenizer = str(folder)
        info: ModelInfo = await super().start()
        return info

    async def shutdown(self) -> None:
        await super().shutdown()
        if self.folder is not None:
            shutil.rmtree(self.folder, ignore_errors=True)
