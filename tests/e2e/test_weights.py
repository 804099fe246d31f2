"""surge.weights in a real instance: replicas share one entry; a SIGKILLed replica's
reference goes with it; the instance leaves no file behind."""

from __future__ import annotations

import os
import shutil
import signal
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from safetensors.numpy import save_file

from surge import serve, weights
from tests.e2e.conftest import running_instance
from tests.e2e.procs import surge_processes
from tests.eventually import eventually

pytestmark = pytest.mark.e2e


@serve.deployment(num_replicas=2)
class Holder:
    def __init__(self, source: str) -> None:
        self.weights = weights.load("e2e", source)

    def info(self) -> dict[str, Any]:
        stats = weights.stats()
        assert stats is not None
        info = self.weights.info
        return {"pid": os.getpid(), "key": info.key, "shared": info.shared, "path": info.path,
                "total": float(self.weights["x"].sum()),
                "holders": {e.key: e.holders for e in stats.entries}}


@pytest.fixture
def store_dir() -> Iterator[str]:
    directory = tempfile.mkdtemp(prefix="surge-e2e-", dir="/dev/shm")
    yield directory
    shutil.rmtree(directory, ignore_errors=True)


def answers(handle: Any, pids: int) -> dict[int, dict[str, Any]]:
    """Ask until `pids` different replicas answered; pid -> answer."""
    seen: dict[int, dict[str, Any]] = {}

    def enough() -> bool:
        answer = handle.info.remote().result(timeout_s=10)
        seen[answer["pid"]] = answer
        return len(seen) >= pids

    eventually(enough, 30, what=f"{pids} replicas answering")
    return seen


def test_replicas_share_one_entry_a_killed_one_lets_go_and_nothing_is_left(
        store_dir: str, tmp_path: Path) -> None:
    source = tmp_path / "m.safetensors"
    save_file({"x": np.arange(1 << 18, dtype=np.float32)}, str(source))
    with running_instance({"weight_store": {"directory": store_dir}}):
        key = replicas_share_one_entry_and_a_killed_one_lets_go(store_dir, source)
        assert any(key[:32] in name for name in os.listdir(store_dir))
    eventually(lambda: os.listdir(store_dir) == [], 10, what="the store's files unlinked")


def replicas_share_one_entry_and_a_killed_one_lets_go(store_dir: str, source: Path) -> str:
    handle = serve.run(Holder.bind(str(source)), name="weights", route_prefix=None)
    seen = answers(handle, 2)
    keys = {a["key"] for a in seen.values()}
    assert len(keys) == 1 and all(a["shared"] for a in seen.values())
    assert {a["total"] for a in seen.values()} == {float(np.arange(1 << 18).sum())}
    (key,) = keys
    assert eventually(lambda: sorted(handle.info.remote().result()["holders"][key]) ==
                      sorted(seen), 10, what="both replicas hold the entry")
    assert [n for n in os.listdir(store_dir) if key[:32] in n] == [
        os.path.basename(next(iter(seen.values()))["path"])]
    assert "surge:weights" in surge_processes(os.getpid()).values()

    victim = next(iter(seen))
    os.kill(victim, signal.SIGKILL)

    def holders_are_the_live_replicas() -> bool:
        holders = handle.info.remote().result(timeout_s=10)["holders"][key]
        live = [pid for pid, name in surge_processes(os.getpid()).items()
                if name == "surge:replica:weights:Holder"]
        return victim not in holders and sorted(holders) == sorted(live) and len(live) == 2

    eventually(holders_are_the_live_replicas, 30,
               what="the killed replica's reference dropped, its replacement's taken")
    return key
