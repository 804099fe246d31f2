"""The store's shell in this process (no sockets): one copy for concurrent requests,
a full directory, pinned entries."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from surge.errors import WeightStoreFullError
from surge.testing import FakeClock
from surge.weights.server import WeightStore
from tests.weights.conftest import MiB, entry_files, model


def test_concurrent_requests_for_one_source_share_one_copy(shm_dir: str,
                                                           tmp_path: Path) -> None:
    source = str(model(tmp_path / "m.safetensors"))
    store = WeightStore(shm_dir, 64 * MiB, clock=FakeClock())

    async def three() -> list[tuple[object, bool]]:
        return list(await asyncio.gather(*(store.load("m", source) for _ in range(3))))

    try:
        answers = asyncio.run(three())
        assert len({id(entry) for entry, _ in answers}) == 1
        assert [hit for _, hit in answers] == [False, False, False]  # all waited for it
        assert store.materialised == 1 and len(entry_files(shm_dir)) == 1
        assert store.entries[answers[0][0].key].pins == 0  # type: ignore[attr-defined]
        assert "entries=1" in repr(store)
    finally:
        store.close()
    assert entry_files(shm_dir) == []  # close unlinks


def test_a_full_directory_is_a_clear_error_and_leaves_nothing(shm_dir: str,
                                                              tmp_path: Path) -> None:
    source = str(model(tmp_path / "m.safetensors"))
    store = WeightStore(shm_dir, 64 * MiB, free_space=lambda _: (1000, 4096))
    try:
        with pytest.raises(WeightStoreFullError, match=f"{shm_dir} has 1,000 bytes free"):
            asyncio.run(store.load("m", source))
        assert entry_files(shm_dir) == [] and store.entries == {} and store.reserved == {}
    finally:
        store.close()
