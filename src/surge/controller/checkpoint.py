"""What a restarted controller needs to take over: desired state and live members.

Two files in the instance's state directory (private to its user, named in the
controller's spec):
`apps.pickle` holds every deployed AppSpec with its deployments' version counters,
written on each deploy and delete; `members.json` lists the ready replicas and proxy
workers (id, pid, ...), rewritten at most once per control-loop tick, and only in a
tick in which a member came, went or changed state (`MembersText` renders it from one
cached fragment per member, so a rewrite is a join, not an encoding of every member).
A restarted controller loads both, waits for those members to reconnect and
re-register (they keep serving meanwhile), adopts them, and only then reconciles.
Writes go to a temporary file and are renamed, so a crash never leaves half a file.
"""

from __future__ import annotations

import json
import logging
import os
import pickle
from dataclasses import dataclass, field
from typing import Any

import cloudpickle

from surge.config import AppSpec
from surge.process import start_time

__all__ = ["Checkpoint", "Members", "MembersText", "SavedApp"]

log = logging.getLogger("surge.controller")

APPS_FILE = "apps.pickle"
MEMBERS_FILE = "members.json"


@dataclass(frozen=True)
class SavedApp:
    spec: AppSpec
    versions: dict[str, int]  # deployment name -> version counter


@dataclass
class Members:
    replicas: dict[str, dict[str, Any]] = field(default_factory=dict)  # id -> pid, app, ...
    proxies: dict[str, int] = field(default_factory=dict)  # proxy id -> pid
    # pid -> its start time (process.start_time): a recycled pid is not a member.
    started: dict[int, int] = field(default_factory=dict)

    def is_member(self, pid: int) -> bool:
        """Whether `pid` is still the process that was saved (alive, not recycled)."""
        recorded = self.started.get(pid)
        return recorded is not None and recorded == start_time(pid)


class MembersText:
    """Renders `members.json` from fragments kept per member: what `load` reads."""

    def __init__(self) -> None:
        self._replicas: dict[tuple[str, int, str, str], str] = {}
        self._started: dict[tuple[int, int], str] = {}
        self._where: dict[tuple[str, str], str] = {}  # (app, deployment) -> its JSON

    def render(self, replicas: list[tuple[str, int, str, str]], proxies: dict[str, int],
               started: dict[int, int]) -> str:
        """(id, pid, app, deployment) per replica, proxy id -> pid, pid -> start time."""
        fragments = {key: self._replicas.get(key) or self._replica(key) for key in replicas}
        times = {key: self._started.get(key) or f'"{key[0]}": {key[1]}'
                 for key in started.items()}
        self._replicas, self._started = fragments, times  # forget the departed
        return ('{"proxies": ' + json.dumps(proxies, sort_keys=True)
                + ', "replicas": {' + ", ".join(fragments.values())
                + '}, "started": {' + ", ".join(times.values()) + "}}")

    def _replica(self, key: tuple[str, int, str, str]) -> str:
        replica_id, pid, app, deployment = key
        where = self._where.get((app, deployment))
        if where is None:
            where = self._where[(app, deployment)] = (
                f'"app": {json.dumps(app)}, "deployment": {json.dumps(deployment)}')
        return f'{json.dumps(replica_id)}: {{{where}, "pid": {pid}}}'



class Checkpoint:
    """Saves and loads the controller's state; a no-op without a state directory."""

    def __init__(self, directory: str | None) -> None:
        self.directory = directory
        self._members_written = ""

    def __repr__(self) -> str:
        return f"<Checkpoint {self.directory or 'off'}>"

    def _write(self, name: str, data: bytes) -> None:
        assert self.directory is not None
        path = os.path.join(self.directory, name)
        fd = os.open(path + ".tmp", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as file:
            file.write(data)
        os.replace(path + ".tmp", path)

    def save_apps(self, apps: list[SavedApp]) -> None:
        if self.directory is not None:
            self._write(APPS_FILE, cloudpickle.dumps(apps))  # policies may be closures

    def save_members(self, members: Members) -> None:
        if self.directory is None:
            return
        self.save_members_text(json.dumps(
            {"replicas": members.replicas, "proxies": members.proxies,
             "started": {str(p): t for p, t in members.started.items()}}, sort_keys=True))

    def save_members_text(self, text: str) -> None:
        """`members.json` as MembersText rendered it (written only if it changed)."""
        if self.directory is None:
            return
        if text != self._members_written:
            self._write(MEMBERS_FILE, text.encode())
            self._members_written = text

    def load(self) -> tuple[list[SavedApp], Members]:
        """What the previous controller saved; nothing if it saved nothing or it is corrupt."""
        if self.directory is None:
            return [], Members()
        apps: list[SavedApp] = []
        members = Members()
        try:
            with open(os.path.join(self.directory, APPS_FILE), "rb") as file:
                apps = pickle.load(file)
        except FileNotFoundError:
            pass
        except Exception as exc:  # a corrupt checkpoint must not stop the restart
            log.error("cannot read the saved applications (%r); starting without them", exc)
        try:
            with open(os.path.join(self.directory, MEMBERS_FILE)) as file:
                saved = json.load(file)
            members = Members(dict(saved["replicas"]), dict(saved["proxies"]),
                              {int(p): int(t) for p, t in saved.get("started", {}).items()})
        except FileNotFoundError:
            pass
        except Exception as exc:
            log.error("cannot read the saved members (%r); they will not be adopted", exc)
        return apps, members
