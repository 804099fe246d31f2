"""Where a serving process's CPU goes: py-spy samples it while a benchmark loads it.

`Profiler(pids, seconds)` starts `py-spy record --format raw` on each process (a
sampling profiler in its own process: the profiled ones run unchanged) for the given
time; `report()` prints each process's top functions by own time (the leaf of each
sampled stack) and by total time (anywhere on the stack). py-spy is installed into this
Python's environment on first use.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

__all__ = ["Profiler", "ensure_py_spy", "top_functions"]

SAMPLE_RATE = 250  # per second: enough for a 10 s run, little enough to stay out of the way


def ensure_py_spy() -> str:
    found = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    if Path(found).exists():
        return found
    print("installing py-spy with pip ...", flush=True)
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "py-spy"], check=True)
    return str(Path(sys.executable).parent / "py-spy")


def top_functions(raw: str, limit: int = 12) -> tuple[int, list[tuple[str, int, int]]]:
    """(samples, [(function, own samples, total samples)]) from py-spy's raw output."""
    own: Counter[str] = Counter()
    total: Counter[str] = Counter()
    samples = 0
    for line in raw.splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n = int(count)
        frames = [f.split(" (", 1)[0] + _where(f) for f in stack.split(";")]
        samples += n
        own[frames[-1]] += n
        for frame in set(frames):
            total[frame] += n
    return samples, [(name, n, total[name]) for name, n in own.most_common(limit)]


def _where(frame: str) -> str:
    """' (file.py)' of a py-spy frame 'function (path/file.py:line)'."""
    if " (" not in frame:
        return ""
    location = frame.split(" (", 1)[1].rstrip(")")
    return f" ({Path(location.rsplit(':', 1)[0]).name})"


class Profiler:
    def __init__(self, pids: dict[str, int], seconds: float) -> None:
        spy = ensure_py_spy()
        self.folder = Path(tempfile.mkdtemp(prefix="surge-profile-"))
        self.pids = pids
        self.runs = {
            name: subprocess.Popen(
                [spy, "record", "--pid", str(pid), "--duration", str(max(1, round(seconds))),
                 "--rate", str(SAMPLE_RATE), "--format", "raw", "--nonblocking",
                 "--output", str(self.folder / f"{name}.txt")],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            for name, pid in pids.items()}

    def report(self, limit: int = 12) -> str:
        lines = []
        for name, run in self.runs.items():
            run.wait(timeout=120)
            path = self.folder / f"{name}.txt"
            if not path.exists():
                lines.append(f"{name} (pid {self.pids[name]}): no profile (py-spy failed)")
                continue
            samples, top = top_functions(path.read_text(), limit)
            lines.append(f"{name} (pid {self.pids[name]}): {samples} samples; top functions "
                         "by own time (own% / total%)")
            for function, mine, overall in top:
                lines.append(f"  {mine / samples:6.1%} {overall / samples:6.1%}  {function}")
        shutil.rmtree(self.folder, ignore_errors=True)
        return "\n".join(lines)
