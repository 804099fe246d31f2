"""surge.weights formats and hashes: sources in, one checked layout out, keyed by content."""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path

import numpy as np
import pytest
from safetensors import safe_open
from safetensors.numpy import save_file

from surge import weights
from surge.errors import WeightSourceError
from surge.weights.formats import HEADER_ALIGN, plan, read_header
from surge.weights.materialise import Sink, copy_and_hash, fingerprint


def tensors() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(7)
    return {"w.f16": rng.standard_normal((33, 7)).astype(np.float16),
            "w.f32": rng.standard_normal(100).astype(np.float32),
            "b.i64": np.arange(5, dtype=np.int64), "m.u8": np.arange(3, dtype=np.uint8),
            "empty": np.zeros((0, 4), dtype=np.float32)}


def materialise(source: Path, out: Path, chunk_bytes: int = 1 << 20) -> str:
    layout = plan(str(source))
    fd = os.open(out, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        os.ftruncate(fd, layout.nbytes)
        return copy_and_hash(layout, Sink(fd, layout.nbytes), 2, chunk_bytes)
    finally:
        os.close(fd)


@pytest.mark.parametrize("chunk_bytes", [64, 1000, 1 << 20])
def test_an_entry_is_a_safetensors_file_with_the_same_tensors(tmp_path: Path,
                                                              chunk_bytes: int) -> None:
    save_file(tensors(), str(tmp_path / "m.safetensors"), metadata={"format": "np"})
    materialise(tmp_path / "m.safetensors", tmp_path / "entry", chunk_bytes)
    with safe_open(str(tmp_path / "entry"), framework="numpy") as entry:
        assert entry.metadata() == {"format": "np"}
        assert sorted(entry.keys()) == sorted(tensors())
        for name, expected in tensors().items():
            np.testing.assert_array_equal(entry.get_tensor(name), expected)


def test_the_data_is_aligned_and_each_tensor_to_its_item_size(tmp_path: Path) -> None:
    save_file(tensors(), str(tmp_path / "m.safetensors"))
    layout = plan(str(tmp_path / "m.safetensors"))
    assert len(layout.header) % HEADER_ALIGN == 0
    for tensor in layout.tensors:
        item = {"F16": 2, "F32": 4, "I64": 8, "U8": 1}[tensor.dtype]
        assert (len(layout.header) + tensor.begin) % item == 0
    assert layout.tensors[0].dtype == "I64"  # largest item size first


def test_a_directory_of_shards_and_an_npz_give_the_same_tensors(tmp_path: Path) -> None:
    everything = tensors()
    names = sorted(everything)
    (tmp_path / "shards").mkdir()
    save_file({n: everything[n] for n in names[:2]}, str(tmp_path / "shards" / "a.safetensors"))
    save_file({n: everything[n] for n in names[2:]}, str(tmp_path / "shards" / "b.safetensors"))
    np.savez(tmp_path / "m.npz", **everything)
    np.savez_compressed(tmp_path / "c.npz", **everything)
    for source in ("shards", "m.npz", "c.npz"):
        loaded = weights.load(source, tmp_path / source)
        assert sorted(loaded) == names
        for name in names:
            np.testing.assert_array_equal(loaded[name], everything[name])
            assert not loaded[name].flags.writeable


def test_the_key_is_the_content_not_the_path_and_a_byte_changes_it(tmp_path: Path) -> None:
    save_file(tensors(), str(tmp_path / "a.safetensors"))
    (tmp_path / "copy").mkdir()
    (tmp_path / "copy" / "a.safetensors").write_bytes((tmp_path / "a.safetensors").read_bytes())
    first = materialise(tmp_path / "a.safetensors", tmp_path / "e1")
    assert materialise(tmp_path / "copy" / "a.safetensors", tmp_path / "e2") == first
    data = bytearray((tmp_path / "a.safetensors").read_bytes())
    data[-1] ^= 0xFF
    (tmp_path / "copy" / "a.safetensors").write_bytes(bytes(data))
    assert materialise(tmp_path / "copy" / "a.safetensors", tmp_path / "e3") != first


def test_a_rewritten_file_has_a_new_fingerprint(tmp_path: Path) -> None:
    path = tmp_path / "a.safetensors"
    save_file(tensors(), str(path))
    before = fingerprint(str(path))
    assert fingerprint(str(path)) == before
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF
    stat = path.stat()
    path.write_bytes(bytes(data))
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))  # same size, same mtime
    assert fingerprint(str(path)) != before  # the change time still moved


def header(entries: dict[str, object]) -> bytes:
    text = json.dumps(entries).encode()
    return struct.pack("<Q", len(text)) + text


@pytest.mark.parametrize(("data", "message"), [
    (b"abc", "too short for a safetensors file"),
    (struct.pack("<Q", 1 << 40) + b"{}", "does not fit the file"),
    (struct.pack("<Q", 4) + b"nope", "the header is not a JSON object"),
    (header({"x": {"dtype": "F99", "shape": [1], "data_offsets": [0, 4]}}) + b"\0" * 4,
     "has dtype 'F99'"),
    (header({"x": {"dtype": "F32", "shape": [2], "data_offsets": [0, 4]}}) + b"\0" * 4,
     r"do not hold a F32 tensor of shape \[2\]"),
    (header({"x": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}),
     "it is truncated"),
    (header({"x": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
             "y": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}}) + b"\0" * 8,
     "overlaps"),
    (header({"x": {"dtype": "F32", "shape": "big", "data_offsets": [0, 4]}}) + b"\0" * 4,
     "shape as a list of sizes"),
])
def test_a_malformed_file_is_a_clear_error(tmp_path: Path, data: bytes, message: str) -> None:
    path = tmp_path / "bad.safetensors"
    path.write_bytes(data)
    with pytest.raises(WeightSourceError, match=message) as caught:
        weights.load("bad", path)
    assert str(path) in str(caught.value)


def test_missing_sources_and_unsupported_arrays_are_clear_errors(tmp_path: Path) -> None:
    with pytest.raises(WeightSourceError, match="no such file or directory"):
        weights.load("gone", tmp_path / "gone.safetensors")
    (tmp_path / "empty").mkdir()
    with pytest.raises(WeightSourceError, match=r"holds no \.safetensors files"):
        weights.load("empty", tmp_path / "empty")
    np.savez(tmp_path / "f.npz", x=np.asfortranarray(np.ones((2, 3))))
    with pytest.raises(WeightSourceError, match="Fortran-ordered"):
        weights.load("f", tmp_path / "f.npz")
    np.savez(tmp_path / "o.npz", x=np.array([1.0], dtype=">f4"))
    with pytest.raises(WeightSourceError, match="little-endian"):
        weights.load("o", tmp_path / "o.npz")
    (tmp_path / "z.npz").write_bytes(b"PK not a zip")
    with pytest.raises(WeightSourceError, match=r"not a readable \.npz"):
        weights.load("z", tmp_path / "z.npz")


def test_a_private_load_is_read_only_and_says_so(tmp_path: Path) -> None:
    save_file(tensors(), str(tmp_path / "m.safetensors"))
    loaded = weights.load("m", tmp_path / "m.safetensors")
    assert not loaded.info.shared and loaded.info.path is None and not loaded.info.hit
    assert len(loaded.info.key) == 64 and "private" in repr(loaded)
    with pytest.raises(ValueError, match="read-only"):
        loaded["w.f32"][0] = 1.0
    start, _, found = read_header(loaded._segment, len(loaded._segment), "entry")
    assert start % HEADER_ALIGN == 0 and {t.name for t in found} == set(tensors())
