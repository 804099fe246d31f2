"""Torch tensors over an entry's pages (torch is optional: skipped without it)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import save_file

from surge import weights
from surge.weights.node import NodeStore

torch = pytest.importorskip("torch")


def test_torch_tensors_share_the_entry_and_bfloat16_works(store: NodeStore,
                                                          tmp_path: Path) -> None:
    from safetensors.torch import save_file as save_torch

    source = tmp_path / "m.safetensors"
    expected = {"w": torch.arange(12, dtype=torch.float32).reshape(3, 4),
                "h": torch.ones(5, dtype=torch.bfloat16), "e": torch.zeros(0, 2)}
    save_torch(expected, str(source))
    loaded = weights.load("t", source)
    tensors = loaded.torch()
    for name, tensor in expected.items():
        assert torch.equal(tensors[name], tensor) and tensors[name].dtype == tensor.dtype
    # zero-copy: the tensor's memory is inside the entry's mapping, as numpy's array is
    assert tensors["w"].data_ptr() == loaded["w"].ctypes.data
    with pytest.raises(TypeError, match=r"numpy has no type for: use \.torch"):
        loaded["h"]
    assert loaded.dtype("h") == "BF16"


def test_private_loads_give_tensors_too(tmp_path: Path) -> None:
    save_file({"x": np.arange(4, dtype=np.int64)}, str(tmp_path / "m.safetensors"))
    tensor = weights.load("p", tmp_path / "m.safetensors").tensor("x")
    assert tensor.tolist() == [0, 1, 2, 3] and tensor.dtype == torch.int64
