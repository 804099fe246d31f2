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
                "total": float(self.weights["x"].sum()), "store_pid": stats.pid,
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


DRIVER = """
import sys
import numpy as np
from safetensors.numpy import save_file
from surge import serve
from tests.e2e.test_weights import Holder
save_file({"x": np.ones(1 << 16, dtype=np.float32)}, sys.argv[2])
serve.start(http_options={"host": "127.0.0.1", "port": int(sys.argv[3])},
            weight_store={"directory": sys.argv[1]})
handle = serve.run(Holder.options(num_replicas=1).bind(sys.argv[2]), name="doomed",
                   route_prefix=None)
print("READY", handle.info.remote().result(timeout_s=30)["key"], flush=True)
sys.stdin.read()
"""


def test_an_instance_killed_whole_is_swept_by_the_next_store(store_dir: str,
                                                             tmp_path: Path) -> None:
    import subprocess
    import sys

    from tests.e2e.procs import alive, descendants
    from tests.ports import free_port
    from tests.weights.conftest import env

    driver = subprocess.Popen(
        [sys.executable, "-c", DRIVER, store_dir, str(tmp_path / "m.safetensors"),
         str(free_port())], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        env={**env(), "SURGE_ADDRESS": f"127.0.0.1:{free_port()}",
             "PYTHONPATH": os.pathsep.join([str(Path(__file__).parents[2]),
                                            env()["PYTHONPATH"]])})
    assert driver.stdout is not None and driver.stdin is not None
    try:
        line = driver.stdout.readline()
        assert line.startswith("READY"), line
        key = line.split()[1]
        doomed = [driver.pid, *descendants(driver.pid)]  # guardian included: nobody is left
        for pid in doomed:
            os.kill(pid, signal.SIGKILL)
        driver.wait()
        eventually(lambda: not any(alive(pid) for pid in doomed), 10,
                   what="every process of the instance gone")
        assert [n for n in os.listdir(store_dir) if key[:32] in n]  # left behind
        source = tmp_path / "other.safetensors"
        save_file({"y": np.zeros(16, dtype=np.float32)}, str(source))
        with running_instance({"weight_store": {"directory": store_dir}}):
            serve.run(Holder.options(num_replicas=1).bind(str(source)), name="next",
                      route_prefix=None)  # its store started (and swept) before
            assert not [n for n in os.listdir(store_dir) if key[:32] in n]  # swept at start
    finally:
        driver.stdin.close()
        driver.stdout.close()
        if driver.poll() is None:
            driver.kill()
            driver.wait()


def test_a_restarted_controller_adopts_the_running_store(store_dir: str,
                                                         tmp_path: Path) -> None:
    from tests.e2e.test_controller_restart import kill_controller

    source = tmp_path / "m.safetensors"
    save_file({"x": np.ones(1 << 12, dtype=np.float32)}, str(source))

    with running_instance({"weight_store": {"directory": store_dir}}):
        handle = serve.run(Holder.options(num_replicas=1).bind(str(source)), name="adopt",
                           route_prefix=None)
        first = handle.info.remote().result(timeout_s=30)
        kill_controller()
        handle = serve.run(Holder.options(num_replicas=2).bind(str(source)), name="adopt",
                           route_prefix=None)  # the new replica loads through the same store
        seen = answers(handle, 2)
        assert {a["store_pid"] for a in seen.values()} == {first["store_pid"]}  # adopted
        assert {a["key"] for a in seen.values()} == {first["key"]}
        assert sorted(seen) == sorted(handle.info.remote().result()["holders"][first["key"]])
    eventually(lambda: os.listdir(store_dir) == [], 10, what="the adopted store stopped too")


@serve.deployment(num_replicas=1)
class Adapters:
    """@serve.multiplexed loading from the store: one model held at a time."""

    def __init__(self, directory: str) -> None:
        self.directory = directory
        self.hits: list[tuple[str, bool]] = []

    @serve.multiplexed(max_num_models_per_replica=1)
    async def get_model(self, model_id: str) -> Any:
        loaded = await weights.load_async(model_id, f"{self.directory}/{model_id}.safetensors")
        self.hits.append((model_id, loaded.info.hit))
        return loaded

    async def __call__(self) -> float:
        model = await self.get_model(serve.get_multiplexed_model_id())
        return float(model["w"][0])

    def loads(self) -> list[tuple[str, bool]]:
        return list(self.hits)


def test_a_multiplexed_model_evicted_and_loaded_again_comes_from_the_store(
        store_dir: str, tmp_path: Path) -> None:
    for index, name in enumerate(("a", "b")):
        save_file({"w": np.full(1 << 12, index, dtype=np.float32)},
                  str(tmp_path / f"{name}.safetensors"))
    with running_instance({"weight_store": {"directory": store_dir}}):
        handle = serve.run(Adapters.bind(str(tmp_path)), name="adapters", route_prefix=None)
        for model, value in (("a", 0.0), ("b", 1.0), ("a", 0.0)):  # "a" is evicted by "b"
            assert handle.options(multiplexed_model_id=model).remote().result(
                timeout_s=30) == value
        assert handle.loads.remote().result(timeout_s=10) == [
            ("a", False), ("b", False), ("a", True)]  # the second "a": nothing read again
