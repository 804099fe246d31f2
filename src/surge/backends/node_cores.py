"""The local node's cores, as the local backend counts them: how many its replicas can
keep busy, how many they hold, and the nice each one runs at.

CPUs are not reserved (processes may share cores), but counted: a replica starts nicer
than the proxy only once the node's replicas can keep all its cores busy
(policy/threads.replica_nice), and those that started below that are reniced then, every
thread (a nice is per thread on Linux). The decisions are policy/threads.py's; this
module does their I/O: it reads the affinity and the cgroup CPU quota (v2 `cpu.max`, v1
`cpu.cfs_quota_us`) and sets priorities. `NodeCores` keeps the cores held as a running
total, exact (a Fraction of the floats added), so that starts and exits in any order
leave no rounding behind.
"""

from __future__ import annotations

import os
from fractions import Fraction

from surge.policy.threads import (
    cfs_quota_cores,
    cpu_max_cores,
    replica_nice,
    to_renice,
    usable_cores,
)

__all__ = ["NodeCores", "nicer_than_this", "node_cores", "raise_nice"]


def node_cores(cgroup_root: str = "/sys/fs/cgroup", own: str = "/proc/self/cgroup") -> int:
    """The cores this process's replicas can keep busy: its affinity (a container's
    cpuset), less a cgroup CPU quota (v2 `cpu.max`, v1 `cpu.cfs_quota_us`) on its group
    or one above it (policy/threads.usable_cores)."""
    if hasattr(os, "sched_getaffinity"):
        affinity = len(os.sched_getaffinity(0))
    else:
        affinity = os.cpu_count() or 1
    groups = _own_groups(_read(own) or "")
    quotas = [cpu_max_cores(text) for text in _read_each(
        cgroup_root, groups.get("", "/"), "cpu.max")]
    v1 = os.path.join(cgroup_root, "cpu")
    for quota, period in zip(_read_each(v1, groups.get("cpu", "/"), "cpu.cfs_quota_us"),
                             _read_each(v1, groups.get("cpu", "/"), "cpu.cfs_period_us"),
                             strict=False):
        quotas.append(cfs_quota_cores(quota, period))
    return usable_cores(affinity, quotas)


def _own_groups(text: str) -> dict[str, str]:
    """/proc/self/cgroup's group by controller: "" for v2's, "cpu" for v1's CPU one."""
    groups: dict[str, str] = {}
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) == 3:
            for controller in parts[1].split(","):
                if controller in ("", "cpu"):
                    groups[controller] = parts[2]
    return groups


def _read_each(mount: str, group: str, name: str) -> list[str]:
    """`name` in `group` and each group above it up to `mount` (a container's namespace
    shows its own group at the mount, where the path it is told may not exist)."""
    texts, relative = [], group.strip("/")
    while True:
        text = _read(os.path.join(mount, relative, name))
        if text is not None:
            texts.append(text)
        if not relative:
            return texts
        relative = os.path.dirname(relative)


def _read(path: str) -> str | None:
    try:
        with open(path) as file:
            return file.read()
    except OSError:
        return None


def raise_nice(pid: int, increment: int) -> None:
    """Make every thread of `pid` at least `increment` nicer than this process (raising
    a nice needs no privilege; each thread has its own, and one it starts inherits it)."""
    target = min(19, os.getpriority(os.PRIO_PROCESS, 0) + increment)
    try:
        tids = [int(tid) for tid in os.listdir(f"/proc/{pid}/task")]
    except OSError:
        return  # gone
    for tid in tids:
        try:
            if os.getpriority(os.PRIO_PROCESS, tid) < target:
                os.setpriority(os.PRIO_PROCESS, tid, target)
        except OSError:
            pass  # the thread is gone, or not ours


def nicer_than_this(pid: int) -> int:
    """How much nicer than this process `pid` runs (0 if it is gone)."""
    try:
        return max(0, os.getpriority(os.PRIO_PROCESS, pid) - os.getpriority(os.PRIO_PROCESS, 0))
    except OSError:
        return 0  # gone: its exit comes with the next poll


class NodeCores:
    """The cores this node's replicas can keep busy (policy/threads.replica_cores) and
    the nice each runs at, by replica: the priority each new one starts at, and the
    earlier ones to renice once they can keep every core busy (policy/threads)."""

    def __init__(self, cores: int) -> None:
        self.cores = cores
        self.held: dict[str, float] = {}
        self.nices: dict[str, int] = {}
        self._total = Fraction(0)  # of held's values, exact: no drift as they come and go

    def __repr__(self) -> str:
        nicer = sum(1 for n in self.nices.values() if n)
        return (f"<NodeCores {self.wanted:g} of {self.cores} held by "
                f"{len(self.held)}, {nicer} nicer>")

    @property
    def wanted(self) -> float:
        """The cores the held replicas can keep busy, together (the nearest float to the
        exact sum, whatever the order they came and went in)."""
        return float(self._total)

    def take(self, owner: str, cores: float, nice: int | None = None) -> int:
        """Count `owner` (a replica that can keep `cores` busy) in, once however often
        it is taken; the nice it starts at (`nice`: the one it runs at already, an
        adopted replica's)."""
        self._total += Fraction(cores) - Fraction(self.held.get(owner, 0.0))
        self.held[owner] = cores
        self.nices[owner] = replica_nice(self.wanted, self.cores) if nice is None else nice
        return self.nices[owner]

    def renice(self) -> list[str]:
        """The replicas to make nicer now (policy/threads.to_renice), counted as nicer."""
        wanted = self.wanted
        owners = to_renice(self.nices, wanted, self.cores)
        for owner in owners:
            self.nices[owner] = replica_nice(wanted, self.cores)
        return owners

    def give_back(self, owner: str) -> None:
        if owner in self.held:
            self._total -= Fraction(self.held.pop(owner))
        self.nices.pop(owner, None)
