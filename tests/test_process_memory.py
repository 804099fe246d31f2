"""keep_freed_memory: large buffers freed and made again reuse the same pages (glibc)."""

from __future__ import annotations

import subprocess
import sys

import pytest

pytestmark = pytest.mark.e2e  # runs its program in a child (tests/tiers.py)

PROGRAM = """
import resource, sys
from surge.process import keep_freed_memory
if sys.argv[1] == "keep":
    assert keep_freed_memory()
def messages():  # what a 10 MB call passes through: five live buffers, then none
    buffers = [bytearray(10 * 1024 * 1024) for _ in range(5)]
    del buffers
messages()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(10):
    messages()
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_large_buffers_reuse_their_pages_instead_of_faulting_new_ones() -> None:
    def faults(mode: str) -> int:
        done = subprocess.run([sys.executable, "-c", PROGRAM, mode], capture_output=True,
                              text=True, check=True, timeout=60)
        return int(done.stdout)

    pages = 10 * 5 * 10 * 1024 * 1024 // 4096
    assert faults("default") > pages // 2  # the kernel zeroes fresh pages every time
    assert faults("keep") < pages // 100
