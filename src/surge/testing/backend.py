"""A backend that starts nothing and records everything it is asked."""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from dataclasses import dataclass, field

from surge.backends.base import (
    LOCAL_PLACEMENT,
    Exit,
    Placement,
    PlacementError,
    ProxyLaunch,
    ReplicaLaunch,
)
from surge.config import ReplicaResources

__all__ = ["FakeBackend", "FakeProcess"]


@dataclass
class FakeProcess:
    process_id: str
    pid: int
    kind: str  # "replica" | "proxy" | "adopted"
    placement: Placement | None = None
    signals: list[str] = field(default_factory=list)  # "TERM" | "KILL", in order


class FakeBackend:
    """`calls` lists every request in order, e.g. ("start_replica", "Model-1").

    Processes never exit by themselves: `exit(process_id, code)` makes one exit (seen at
    the next `poll_exits`), or `exit_on_signal` makes TERM and KILL end them at once;
    `fail_placement` makes replica starts raise PlacementError.
    """

    name = "fake"

    def __init__(self, head: Placement = LOCAL_PLACEMENT, *,
                 deaths_visible_at_once: bool = True, first_pid: int = 1000,
                 exit_on_signal: bool = False) -> None:
        self.head = head
        self.exit_on_signal = exit_on_signal  # TERM and KILL end a process at once
        self.deaths_visible_at_once = deaths_visible_at_once
        self.processes: dict[str, FakeProcess] = {}
        self.calls: list[tuple[str, str]] = []
        self.fail_placement = ""
        self.closed = False
        self._pids = itertools.count(first_pid)
        self._exits: list[Exit] = []

    def __repr__(self) -> str:
        return f"<FakeBackend processes={len(self.processes)} calls={len(self.calls)}>"

    def start_replica(self, launch: ReplicaLaunch) -> int:
        self.calls.append(("start_replica", launch.replica_id))
        if self.fail_placement:
            raise PlacementError(self.fail_placement)
        return self._start(launch.replica_id, "replica")

    def start_proxy(self, launch: ProxyLaunch) -> int:
        self.calls.append(("start_proxy", launch.proxy_id))
        return self._start(launch.proxy_id, "proxy")

    def _start(self, process_id: str, kind: str) -> int:
        pid = next(self._pids)
        self.processes[process_id] = FakeProcess(process_id, pid, kind)
        return pid

    def adopt(self, process_id: str, pid: int, gpus: list[str] | None = None,
              num_gpus: float = 0.0, resources: ReplicaResources | None = None) -> None:
        self.calls.append(("adopt", process_id))
        self.processes.setdefault(process_id, FakeProcess(process_id, pid, "adopted"))

    def terminate(self, process_id: str) -> None:
        self._signal(process_id, "TERM")

    def kill(self, process_id: str) -> None:
        self._signal(process_id, "KILL")

    def _signal(self, process_id: str, signal: str) -> None:
        self.calls.append((signal.lower(), process_id))
        process = self.processes.get(process_id)
        if process is not None:
            process.signals.append(signal)
            if self.exit_on_signal:
                self.exit(process_id, -15 if signal == "TERM" else -9)

    def poll_exits(self) -> list[Exit]:
        exits, self._exits = self._exits, []
        return exits

    def alive(self) -> list[str]:
        return list(self.processes)

    def placements(self) -> Mapping[str, Placement]:
        return {p.process_id: p.placement for p in self.processes.values() if p.placement}

    def close(self) -> None:
        self.closed = True

    # -- what tests do ---------------------------------------------------------------

    def exit(self, process_id: str, returncode: int | None = 0) -> None:
        """The process exits now (the controller sees it at its next poll)."""
        del self.processes[process_id]
        self._exits.append(Exit(process_id, returncode))

    def place(self, process_id: str, node_id: str, node_ip: str) -> None:
        self.processes[process_id].placement = Placement(node_id, node_ip)

    def started(self, kind: str = "replica") -> list[str]:
        """Ids of the processes of `kind` it was asked to start, in order."""
        return [pid for call, pid in self.calls if call == f"start_{kind}"]
