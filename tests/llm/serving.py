"""Serving for the vLLM tests: `python ARGV` (surge run, or a user's script) in a process
group of its own, ready when /v1/models answers; stopped with its whole group."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx

from tests.ports import free_port

ROOT = Path(__file__).resolve().parents[2]
START_TIMEOUT_S = 420  # vLLM's imports and engine start on a busy 2-core machine
ENV = {"VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1", "HF_HUB_OFFLINE": "1",
       "TOKENIZERS_PARALLELISM": "false"}


class Served:
    def __init__(self, url: str, process: subprocess.Popen[bytes], log: Path,
                 control: str) -> None:
        self.url, self.process, self.log, self.control = url, process, log, control

    def stop(self) -> None:
        """Stop the process group this test started (surge, its replicas, vLLM's core)."""
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(10)


def serve_script(argv: list[str], log: Path, port: int) -> Served:
    """`python ARGV` in its own process group (cwd: the log's folder), ready on /v1/models."""
    control = f"127.0.0.1:{free_port()}"
    env = {**os.environ, **ENV, "SURGE_ADDRESS": control,
           "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT)])}
    with open(log, "wb") as out:
        process = subprocess.Popen([sys.executable, *argv], stdout=out,
                                   stderr=subprocess.STDOUT, env=env,
                                   start_new_session=True, cwd=log.parent)
    served = Served(f"http://127.0.0.1:{port}", process, log, control)
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise AssertionError(f"{argv} exited ({process.returncode}):\n"
                                 f"{log.read_text()[-4000:]}")
        try:
            if httpx.get(f"{served.url}/v1/models", timeout=2).status_code == 200:
                return served
        except httpx.HTTPError:
            pass
        time.sleep(1)
    served.stop()
    raise AssertionError(f"not ready in {START_TIMEOUT_S}s:\n{log.read_text()[-4000:]}")
