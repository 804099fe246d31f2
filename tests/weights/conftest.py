"""A real weight store process (as the local backend starts it) on a private directory
in /dev/shm, and processes that hold its entries."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import save_file

from surge.config.weights import WeightStoreOptions
from surge.launch import Lifetime
from surge.observability.config import LoggingConfig
from surge.weights.client import set_store
from surge.weights.node import NodeStore
from surge.weights.protocol import StoreStats

ROOT = Path(__file__).resolve().parents[2]
MiB = 1 << 20

HOLDER = """
import sys
from surge import weights
from surge.weights.client import set_store
set_store(sys.argv[1])
held = weights.load(sys.argv[2], sys.argv[3])
print(held.info.key, held.info.hit, flush=True)
sys.stdin.read()
"""


@pytest.fixture
def shm_dir() -> Iterator[str]:
    """A directory of its own in /dev/shm, so listing it sees only this test's files."""
    directory = tempfile.mkdtemp(prefix="surge-test-", dir="/dev/shm")
    yield directory
    shutil.rmtree(directory, ignore_errors=True)


@pytest.fixture
def short_dir() -> Iterator[str]:
    """For sockets: a Unix socket's path must stay under 108 bytes."""
    directory = tempfile.mkdtemp(prefix="sw-")
    yield directory
    shutil.rmtree(directory, ignore_errors=True)


def env() -> dict[str, str]:
    environment = dict(os.environ)
    paths = [str(ROOT / "src"), environment.get("PYTHONPATH", "")]
    environment["PYTHONPATH"] = os.pathsep.join(p for p in paths if p)
    environment.setdefault("SURGE_LOG_LEVEL", "WARNING")
    return environment


def start_store(directory: str, socket_dir: str, budget: int | None = None) -> NodeStore:
    node = NodeStore(WeightStoreOptions(directory=directory, budget_bytes=budget),
                     os.path.join(socket_dir, "weights.sock"),
                     Lifetime(parent_pid=os.getpid()), LoggingConfig(), env())
    node.start_or_adopt()
    return node


@pytest.fixture
def store(shm_dir: str, short_dir: str) -> Iterator[NodeStore]:
    """A store this test process uses through weights.load."""
    node = start_store(shm_dir, short_dir)
    set_store(node.socket_path)
    try:
        yield node
    finally:
        set_store(None)
        node.close()


def stats() -> StoreStats:
    from surge import weights

    found = weights.stats()
    assert found is not None
    return found


def model(path: Path, mib: float = 1.0, seed: int = 0) -> Path:
    """A safetensors file of about `mib` MiB of float16 tensors."""
    rng = np.random.default_rng(seed)
    count = max(1, int(mib * MiB) // (2 * 64 * 1024))
    save_file({f"layer{i}.weight": rng.standard_normal((64, 1024)).astype(np.float16)
               for i in range(count)}, str(path))
    return path


@contextlib.contextmanager
def holder(node: NodeStore, name: str,
           source: Path) -> Iterator[tuple[subprocess.Popen[str], str, bool]]:
    """Another process holding `source` from the store: (process, key, hit); killed after."""
    process = subprocess.Popen([sys.executable, "-c", HOLDER, node.socket_path, name,
                                str(source)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                               text=True, env=env())
    assert process.stdout is not None and process.stdin is not None
    try:
        key, hit = process.stdout.readline().split()
        yield process, key, hit == "True"
    finally:
        process.kill()
        process.wait()
        process.stdout.close()
        process.stdin.close()


def entry_files(directory: str) -> list[str]:
    return sorted(name for name in os.listdir(directory) if name.startswith("surge-weights."))
