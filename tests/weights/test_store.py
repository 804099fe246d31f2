"""The weight store with real processes: sharing, references, eviction, crashes."""

from __future__ import annotations

import gc
import os
import signal
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from surge import weights
from surge.errors import WeightBudgetError, WeightSourceError, WeightStoreUnavailableError
from surge.weights.node import NodeStore
from tests.eventually import eventually
from tests.weights.conftest import MiB, entry_files, holder, model, start_store, stats

pytestmark = pytest.mark.e2e  # a real store process (tests/tiers.py)


def test_two_processes_share_one_read_only_entry(store: NodeStore, shm_dir: str,
                                                 tmp_path: Path) -> None:
    source = model(tmp_path / "m.safetensors", mib=2)
    mine = weights.load("m", source)
    with holder(store, "m", source) as (process, key, hit):
        assert key == mine.info.key and hit and mine.info.shared
        assert entry_files(shm_dir) == [os.path.basename(str(mine.info.path))]
        with open(f"/proc/{process.pid}/maps") as maps:  # the same pages, mapped read-only
            lines = [line for line in maps if str(mine.info.path) in line]
        assert lines and all(line.split()[1].startswith("r--s") for line in lines)
        (entry,) = stats().entries
        assert entry.refs == 2 and entry.holders == sorted([os.getpid(), process.pid])
        expected = load_file(str(source))
        for name, array in mine.items():
            np.testing.assert_array_equal(array, expected[name])
        with pytest.raises(ValueError, match="read-only"):
            mine["layer0.weight"][0, 0] = 1


def test_a_sigkilled_holder_gives_its_reference_back(store: NodeStore, tmp_path: Path) -> None:
    source = model(tmp_path / "m.safetensors")
    held = weights.load("m", source)
    with holder(store, "m", source) as (process, _, _):
        assert stats().entries[0].refs == 2
        os.kill(process.pid, signal.SIGKILL)
        process.wait()
        eventually(lambda: stats().entries[0].holders == [os.getpid()], 10,
                   what="the killed process's reference dropped")
    assert stats().entries[0].refs == 1 and held.info.key


def test_the_reference_lives_as_long_as_any_array(store: NodeStore, tmp_path: Path) -> None:
    held = weights.load("m", model(tmp_path / "m.safetensors"))
    array = held["layer0.weight"]
    del held
    gc.collect()
    assert stats().entries[0].refs == 1  # the array still maps the entry
    del array
    gc.collect()
    eventually(lambda: stats().entries[0].refs == 0, 10, what="the reference given back")


def test_unreferenced_entries_are_evicted_least_recently_used_first(
        shm_dir: str, short_dir: str, tmp_path: Path) -> None:
    from surge.weights.client import set_store

    node = start_store(shm_dir, short_dir, budget=5 * MiB)
    set_store(node.socket_path)
    try:
        a, b, c = (model(tmp_path / f"{n}.safetensors", mib=2, seed=i)
                   for i, n in enumerate("abc"))
        held_a = weights.load("a", a)
        held_b = weights.load("b", b)
        with pytest.raises(WeightBudgetError, match="held by live replicas"):
            weights.load("c", c)  # a and b are held: nothing may go
        path_a = held_a.info.path
        del held_a
        gc.collect()
        eventually(lambda: {e.name: e.refs for e in stats().entries} == {"a": 0, "b": 1}, 10,
                   what="a unreferenced")
        held_c = weights.load("c", c)  # a goes, b stays
        assert {e.name for e in stats().entries} == {"b", "c"} and stats().evicted == 1
        assert path_a is not None and not os.path.exists(path_a)
        assert len(entry_files(shm_dir)) == 2
        del held_b
        gc.collect()
        eventually(lambda: {e.name: e.refs for e in stats().entries}["b"] == 0, 10)
        again = weights.load("c", c)  # still there: a hit, nothing read
        assert again.info.hit and again.info.key == held_c.info.key
    finally:
        set_store(None)
        node.close()


def test_a_changed_file_is_a_new_entry_and_the_old_one_is_untouched(
        store: NodeStore, tmp_path: Path) -> None:
    source = tmp_path / "m.safetensors"
    save_file({"x": np.zeros(1000, dtype=np.float32)}, str(source))
    first = weights.load("m", source)
    save_file({"x": np.ones(1000, dtype=np.float32)}, str(source))  # same size, new bytes
    second = weights.load("m", source)
    assert second.info.key != first.info.key and not second.info.hit
    assert first["x"].sum() == 0 and second["x"].sum() == 1000
    assert len(stats().entries) == 2
    assert weights.load("m", source).info.hit  # and unchanged again, it is a hit


def test_a_malformed_or_missing_source_is_a_clear_error(store: NodeStore,
                                                        tmp_path: Path) -> None:
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json at all")
    with pytest.raises(WeightSourceError, match=f"{bad}: the header is not a JSON object"):
        weights.load("bad", bad)
    with pytest.raises(WeightSourceError, match="No such file"):
        weights.load("gone", tmp_path / "gone.safetensors")
    assert stats().entries == []


def test_a_killed_store_leaves_no_file_and_is_replaced(store: NodeStore, shm_dir: str,
                                                       tmp_path: Path) -> None:
    source = model(tmp_path / "m.safetensors")
    held = weights.load("m", source)
    assert entry_files(shm_dir)
    old = store.pid
    os.kill(old, signal.SIGKILL)
    eventually(lambda: entry_files(shm_dir) == [], 10, what="the guardian unlinked the entry")
    assert float(held["layer0.weight"].astype(np.float32).sum()) == pytest.approx(
        float(load_file(str(source))["layer0.weight"].astype(np.float32).sum()))  # still mapped
    with pytest.raises(WeightStoreUnavailableError):
        weights.load("m", source)

    def reloaded() -> weights.Weights:
        store.poll()  # the backend's tick: restarts a store that died
        return weights.load("m", source)

    again = eventually(reloaded, 20, what="a new store serving")
    assert store.pid != old and not again.info.hit and again.info.key == held.info.key


def test_a_store_killed_with_its_guardian_is_swept_by_the_next(
        shm_dir: str, short_dir: str, tmp_path: Path) -> None:
    from surge.weights.client import set_store
    from tests.e2e.procs import descendants, title

    node = start_store(shm_dir, short_dir)
    set_store(node.socket_path)
    try:
        held = weights.load("m", model(tmp_path / "m.safetensors"))
        guardians = [pid for pid in descendants(node.pid)
                     if title(pid).startswith("surge:weights-guard ")]
        assert len(guardians) == 1
        os.kill(guardians[0], signal.SIGKILL)  # the whole instance at once
        os.kill(node.pid, signal.SIGKILL)
        node.close()
        assert entry_files(shm_dir)  # nobody left to unlink it
        (Path(shm_dir) / "not-ours").write_bytes(b"x")
        (Path(shm_dir) / "surge-weights.x.y.z").write_bytes(b"x")
        node = start_store(shm_dir, short_dir)
        set_store(node.socket_path)
        assert weights.stats() is not None  # the new store answers: its sweep is done
        assert entry_files(shm_dir) == ["surge-weights.x.y.z"]  # not named by a store
        assert (Path(shm_dir) / "not-ours").exists() and held.info.key
    finally:
        set_store(None)
        node.close()
