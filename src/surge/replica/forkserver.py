"""A pre-imported template process that forks replicas (`surge:forkserver`).

A cold `python -m surge.replica` spends most of its start-up importing (uvloop,
starlette, msgspec, cloudpickle, surge itself). The fork server imports all that once,
then forks a child per replica, so a replica with a trivial model serves in well under
300 ms. It is single-threaded and runs no event loop, so forking is safe.

Protocol, one JSON object per line: the controller writes
`{"spawn": ID, "spec": "<the replica's surge.launch line>", "env": {...}}`, the fork
server answers `{"spawned": ID, "pid": N}` (or `{"failed": ID, "error": ...}`) and later
`{"exited": ID, "code": C}` when it reaps the child. It leaves with the controller
whose pid is its only argument.
"""

from __future__ import annotations

import gc
import importlib
import importlib.util
import json
import os
import select
import signal
import sys
from typing import Any

__all__ = ["PRELOAD", "PRELOAD_LATER", "main"]

# Imported once here, shared copy-on-write by every replica, before it says it is ready.
# surge.serve too (and the batch decorator it loads on first use): the user's code,
# unpickled in the replica, imports it.
PRELOAD = ("surge.serve", "surge.replica.main", "surge.launch", "surge.replica.batching",
           "starlette.responses", "starlette.requests", "fastapi")
# Imported after it said it is ready, one at a time while no fork is asked for, then
# frozen too: what only some replicas use (weights.load: numpy, ~0.25 s of CPU), so the
# first replica does not wait for it. A replica forked before shares a little less with
# the template (the import writes to pages they shared: +1.8 MiB of its own, measured
# with bench/memory.py) and imports numpy itself if it loads weights. Only what imports
# quickly belongs here: a fork asked for during the import waits for its end (fastapi,
# ~0.4 s, was tried here: the first replica came 0.3 s sooner, the second 0.4 s later).
PRELOAD_LATER = ("surge.weights.api",)
POLL_S = 0.05
# ... and only after a second without a fork asked for: replicas come in bursts (a
# deploy, a scale-up), and one asked for during the import waits for its end.
LATER_AFTER_QUIET_POLLS = 20


def _send(out: int, message: dict[str, Any]) -> None:
    os.write(out, (json.dumps(message) + "\n").encode())


def _child(spec_line: str, env: dict[str, str]) -> None:
    """In the forked child: become a replica process and never return."""
    code = 1
    try:
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        os.dup2(2, 1)  # our stdout is the fork server's pipe to the controller
        os.environ.clear()
        os.environ.update(env)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        import msgspec

        from surge.launch import ReplicaProcessSpec, decode
        from surge.replica.main import main as replica_main

        spec = decode(ReplicaProcessSpec, spec_line.encode())
        # Unsupervised, we die with the fork server; supervised, we outlive it.
        lifetime = msgspec.structs.replace(spec.lifetime, parent_pid=os.getppid())
        code = replica_main(msgspec.structs.replace(spec, lifetime=lifetime))
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    except BaseException:
        import traceback

        traceback.print_exc()
    finally:
        from surge.process import run_exit_hooks

        run_exit_hooks()  # e.g. an engine's processes (surge.llm); atexit would not run
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def _spawn(request: dict[str, Any], out: int, children: dict[int, str]) -> None:
    try:
        pid = os.fork()
    except OSError as exc:
        _send(out, {"failed": request["spawn"], "error": str(exc)})
        return
    if pid == 0:
        _child(request["spec"], request["env"])
    children[pid] = request["spawn"]
    _send(out, {"spawned": request["spawn"], "pid": pid})


def _reap(out: int, children: dict[int, str]) -> None:
    while children:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        process_id = children.pop(pid, None)
        if process_id is not None:
            _send(out, {"exited": process_id, "code": os.waitstatus_to_exitcode(status)})


def serve(inp: int, out: int, later: tuple[str, ...] = ()) -> None:
    children: dict[int, str] = {}
    buffer = b""
    pending = list(later)
    quiet = 0  # polls in a row without a request
    while True:
        ready, _, _ = select.select([inp], [], [], POLL_S)
        _reap(out, children)
        if not ready:
            quiet += 1
            if pending and quiet >= LATER_AFTER_QUIET_POLLS:
                _preload(pending.pop(0))
                gc.freeze()
            continue
        quiet = 0
        data = os.read(inp, 65536)
        if not data:  # the controller is gone: so are we (children get SIGTERM)
            return
        buffer += data
        while b"\n" in buffer:
            line, buffer = buffer.split(b"\n", 1)
            if line.strip():
                _spawn(json.loads(line), out, children)


def main() -> None:
    from surge.process import die_with_parent, set_title

    set_title("surge:forkserver")
    die_with_parent(int(sys.argv[1]) if len(sys.argv) > 1 else 0)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    for module in PRELOAD:
        _preload(module)
    # What it imported stays out of the garbage collector's passes (in the template and
    # in every replica), which would otherwise write to each object's header and copy
    # the shared pages into every replica.
    gc.freeze()
    out = os.dup(1)
    os.dup2(2, 1)  # stray prints must not corrupt the protocol
    _send(out, {"ready": os.getpid()})
    serve(0, out, PRELOAD_LATER)


def _preload(module: str) -> None:
    if importlib.util.find_spec(module.split(".")[0]) is not None:
        importlib.import_module(module)


if __name__ == "__main__":
    main()
