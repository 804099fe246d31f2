"""The builds behind Ray's REST PUTs: validated at once, built one at a time, newest wins.

Each PUT starts a builder process (`python -m surge.api.rest_apply`, whose line
protocol its docstring gives): the controller never imports user code. The PUT's
answer:
- 400 at once when the config does not validate (the schema alone, no user code);
- otherwise its build waits its turn (one at a time; a PUT superseded by a newer one
  while it waits is dropped: the newest config is what should run), and the answer is
  the build's outcome when it comes within `ANSWER_BUDGET_S` of the PUT (400 with the
  reasons and nothing changed, or 200 once deployed);
- 200 when the build takes longer (a model's module imports slowly): KubeRay's client
  gives up after 2 s and would otherwise re-PUT forever. A failure after that is
  reported as Ray reports it: the application is DEPLOY_FAILED with the reason.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import logging
import sys
from dataclasses import dataclass, field

from surge.launch import ApplySpec, encode

__all__ = ["ANSWER_BUDGET_S", "Builds", "Outcome"]

log = logging.getLogger("surge.rest")

ANSWER_BUDGET_S = 1.5  # under KubeRay's 2 s HTTP timeout
VALIDATE_TIMEOUT_S = 30.0  # a Python start and the schema check: seconds at worst
BUILD_TIMEOUT_S = 300.0  # importing user code (models, frameworks): minutes at worst
MAX_ERROR_BYTES = 16 * 1024  # of the builder's reasons, in a 400's body


@dataclass(frozen=True)
class Outcome:
    ok: bool
    reason: str = ""


@dataclass(eq=False)
class _Build:
    process: asyncio.subprocess.Process
    outcome: asyncio.Future[Outcome] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future())
    answered: bool = False  # the PUT was answered before the outcome: record failures


class Builds:
    def __init__(self) -> None:
        self._queue: collections.deque[_Build] = collections.deque()
        self._worker: asyncio.Task[None] | None = None

    def __repr__(self) -> str:
        running = self._worker is not None and not self._worker.done()
        return f"<Builds waiting={len(self._queue)} running={running}>"

    async def submit(self, spec: ApplySpec) -> Outcome:
        """Validate, queue and (within the budget) build `spec`'s config."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + ANSWER_BUDGET_S
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "surge.api.rest_apply", stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE, stderr=None)  # stderr: the instance's log
        assert process.stdin is not None and process.stdout is not None
        process.stdin.write(encode(spec))
        try:
            line = await asyncio.wait_for(process.stdout.readline(), VALIDATE_TIMEOUT_S)
        except TimeoutError:
            line = b""
        if not line.startswith(b"VALID"):
            await _end(process)
            return Outcome(False, _reason(line, "the config could not be checked"))
        build = _Build(process)
        self._queue.append(build)
        if self._worker is None or self._worker.done():
            self._worker = loop.create_task(self._run())
        try:
            return await asyncio.wait_for(asyncio.shield(build.outcome),
                                          max(0.0, deadline - loop.time()))
        except TimeoutError:
            if build.outcome.done():
                return build.outcome.result()
            build.answered = True
            return Outcome(True, "accepted; the applications are being built")

    async def _run(self) -> None:
        while self._queue:
            build = self._queue.popleft()
            if self._queue:  # a newer config arrived while this one waited
                _settle(build, Outcome(True, "superseded by a newer config"))
                await _tell(build.process, b"DROP\n")
                await _end(build.process)
                continue
            try:
                await self._build(build)
            except Exception:  # never leave the queue stuck behind one build
                log.exception("a REST build failed unexpectedly")
                _settle(build, Outcome(False, "the build failed unexpectedly; see the log"))
                await _end(build.process)

    async def _build(self, build: _Build) -> None:
        process = build.process
        assert process.stdout is not None
        await _tell(process, b"GO\n")
        try:
            line = await asyncio.wait_for(process.stdout.readline(), BUILD_TIMEOUT_S)
        except TimeoutError:
            line = b""
            log.error("building the applications of a PUT took over %.0f s; stopped",
                      BUILD_TIMEOUT_S)
        if line.startswith(b"BUILT"):
            _settle(build, Outcome(True))
        else:
            reason = _reason(line, "the builder exited without saying why (see the log)")
            _settle(build, Outcome(False, reason))
            if line.startswith(b"FAILED"):
                await _tell(process, b"RECORD\n" if build.answered else b"DISCARD\n")
            if build.answered:
                log.warning("a config PUT earlier failed to build: %s", reason)
        await _end(process, BUILD_TIMEOUT_S)


def _settle(build: _Build, outcome: Outcome) -> None:
    if not build.outcome.done():
        build.outcome.set_result(outcome)


def _reason(line: bytes, otherwise: str) -> str:
    _, _, rest = line.decode(errors="replace").strip().partition(" ")
    if not rest:
        return otherwise
    try:
        said = json.loads(rest)
    except ValueError:
        return rest[-MAX_ERROR_BYTES:]
    if isinstance(said, dict):  # FAILED: a reason per application
        text = "\n".join(f"application {name!r}: {why}" for name, why in said.items())
    else:
        text = str(said)
    return text[-MAX_ERROR_BYTES:]


async def _tell(process: asyncio.subprocess.Process, line: bytes) -> None:
    assert process.stdin is not None
    with contextlib.suppress(ConnectionError):
        process.stdin.write(line)
        await process.stdin.drain()


async def _end(process: asyncio.subprocess.Process, timeout: float = 10.0) -> None:
    """Close its stdin and wait for it to exit (killed past `timeout`)."""
    assert process.stdin is not None
    with contextlib.suppress(ConnectionError):
        process.stdin.close()
    try:
        await asyncio.wait_for(process.wait(), timeout)
    except TimeoutError:
        process.kill()
        await process.wait()
