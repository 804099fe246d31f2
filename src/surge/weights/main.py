"""The weight store's process (`surge:weights`, `python -m surge.weights`), spec on stdin.

It reads its `WeightStoreProcessSpec` (surge.launch), sweeps its directory of entry
files whose owner no longer runs (an instance killed whole), forks its guardian, and
serves on the socket its starter bound. It leaves like a replica: with the supervisor
(outliving a controller that crashes, which re-attaches to it by its socket), or,
unsupervised, with its parent; placed on a cluster node, with its host actor or after
the orphan timeout with no replica connected. On SIGTERM it unlinks its entries and
its socket.

The guardian (`surge:weights-guard`) is a bare interpreter (`python -S`, a few lines,
a few MiB) in its own session (a kill of the instance's process group misses it),
holding the read end of a pipe whose write end only the store has. When the store dies,
however it dies, the pipe reads EOF and the guardian unlinks the store's files (the
names that start with its owner's stem); then it exits.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
import subprocess
import sys

from surge.config.weights import WeightStoreOptions
from surge.errors import ConfigError
from surge.launch import WeightStoreProcessSpec, read_spec
from surge.observability.logs import configure_logging
from surge.process import die_with_parent, set_title, watch_supervisor
from surge.weights.segments import Owner, sweep
from surge.weights.server import WeightStore

__all__ = ["check_directory", "main", "start_guardian"]

log = logging.getLogger("surge.weights")

LISTEN_BACKLOG = 1024


def check_directory(options: WeightStoreOptions) -> tuple[str, int]:
    """(directory, budget in bytes), made and checked; ConfigError if unusable."""
    directory = options.directory
    try:
        os.makedirs(directory, mode=0o700, exist_ok=True)
        info = os.statvfs(directory)
    except OSError as exc:
        raise ConfigError(f"weight_store.directory {directory!r}: {exc.strerror or exc}") \
            from None
    if not os.access(directory, os.W_OK | os.X_OK):
        raise ConfigError(f"weight_store.directory {directory!r} is not writable by this user")
    return directory, options.budget_for(info.f_blocks * info.f_frsize)


GUARDIAN = """
import os, sys
directory, stem, pipe = sys.argv[1], sys.argv[2], int(sys.argv[3])
while os.read(pipe, 1):
    pass
for name in os.listdir(directory):
    if name.startswith(stem):
        try:
            os.unlink(os.path.join(directory, name))
        except OSError:
            pass
"""


def start_guardian(directory: str, owner: Owner) -> int:
    """Start the guardian; returns the pipe's write end, which the store keeps open."""
    read_end, write_end = os.pipe()
    try:
        subprocess.Popen(["surge:weights-guard", "-S", "-c", GUARDIAN, directory,
                          owner.stem, str(read_end)], executable=sys.executable,
                         pass_fds=(read_end,), start_new_session=True,
                         stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
    finally:
        os.close(read_end)
    return write_end


def _listener(spec: WeightStoreProcessSpec) -> socket.socket:
    if spec.listen_fd is not None:
        return socket.socket(fileno=spec.listen_fd)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(spec.socket_path)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(spec.socket_path)
    listener.listen(LISTEN_BACKLOG)
    return listener


async def serve(spec: WeightStoreProcessSpec, store: WeightStore,
                listener: socket.socket) -> int:
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    server = await asyncio.start_unix_server(store.serve_connection, sock=listener)
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    watch_supervisor(loop, spec.lifetime.supervisor_pid, stop.set)
    orphan = spec.lifetime.orphan_timeout_s
    if orphan is not None:  # on a cluster node: leave once no replica used us for that long
        timer: list[asyncio.TimerHandle] = [loop.call_later(orphan, stop.set)]

        def idle() -> None:
            timer[0] = loop.call_later(orphan, stop.set)

        store.on_idle, store.on_busy = idle, lambda: timer[0].cancel()
    log.info("weight store on %s: %s, budget %s MiB", spec.socket_path, store.directory,
             f"{store.budget / 2**20:,.0f}")
    try:
        await stop.wait()
    finally:
        server.close()
        store.close()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(spec.socket_path)
    return 0


def main() -> int:
    set_title("surge:weights")
    try:
        spec = read_spec(WeightStoreProcessSpec)
    except ConfigError as exc:
        print(f"surge:weights: {exc}", file=sys.stderr)
        return 2
    if not spec.lifetime.supervisor_pid:
        die_with_parent(spec.lifetime.parent_pid)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the driver's to handle
    configure_logging("weights", spec.node_id, spec.logging)
    try:
        directory, budget = check_directory(spec.options)
    except ConfigError as exc:
        log.error("the weight store cannot start: %s", exc)
        return 1
    for name in sweep(directory):
        log.info("removed %s, left by a weight store that no longer runs", name)
    owner = Owner.this_process()
    guardian = start_guardian(directory, owner)
    listener = _listener(spec)
    import uvloop

    code: int = uvloop.run(serve(spec, WeightStore(directory, budget, owner), listener))
    os.close(guardian)
    return code
