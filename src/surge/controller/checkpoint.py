"""What a restarted controller needs to take over: desired state and live members.

Two files in the instance's state directory (private to its user, named in the
controller's spec):
`apps.pickle` holds every deployed AppSpec with its deployments' version counters,
written on each deploy and delete; `members.json` lists the ready replicas and proxy
workers (id, pid, ...), rewritten at most once per control-loop tick when it changed.
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

__all__ = ["Checkpoint", "Members", "SavedApp"]

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
        text = json.dumps({"replicas": members.replicas, "proxies": members.proxies,
                           "started": {str(p): t for p, t in members.started.items()}},
                          sort_keys=True)
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
