"""What Ray's `serve status`, `serve config` and `serve build` print, in their YAML.

A script written against Ray's CLI loads these outputs with `yaml.safe_load` and reads
their keys, so surge prints the same documents: `serve status` is Ray's `ServeStatus`
(proxies, applications with their deployments' status, trigger, replica counts and
message, target_capacity), computed from the instance's REST details exactly as Ray
computes it from its own; every document is written as Ray's `ServeDeploySchemaDumper`
writes it (a blank line between top-level keys, multi-line strings such as tracebacks
as literal blocks, terminal colour codes removed, keys in their schema's order).
"""

from __future__ import annotations

import re
from collections import Counter
from typing import Any

import yaml

__all__ = ["dump", "serve_status"]

_ANSI = re.compile(r"\x1B(?:[@-Z\\-_]|\[[0-?]*[ -/]*[@-~])")


class _Dumper(yaml.SafeDumper):
    def write_line_break(self, data: str | None = None) -> None:
        super().write_line_break(data)
        if len(self.indents) == 1:  # a blank line after each top-level entry
            super().write_line_break()


def _str(dumper: yaml.SafeDumper, data: str) -> yaml.ScalarNode:
    style = "|" if len(data.splitlines()) > 1 else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", data, style=style)


_Dumper.add_representer(str, _str)


def _plain(data: Any) -> Any:
    """`data` with colour codes taken out of every string (they break YAML's blocks)."""
    if isinstance(data, dict):
        return {key: _plain(value) for key, value in data.items()}
    if isinstance(data, list):
        return [_plain(item) for item in data]
    return _ANSI.sub("", data) if isinstance(data, str) else data


def dump(data: Any, width: int | None = None) -> str:
    """One YAML document, as Ray's CLI writes it."""
    text: str = yaml.dump(_plain(data), Dumper=_Dumper, default_flow_style=False,
                          sort_keys=False, width=width, indent=2 if width else None)
    return text


def serve_status(details: dict[str, Any]) -> dict[str, Any]:
    """Ray's `ServeStatus` of an instance, from its `ServeInstanceDetails` (REST shape)."""
    applications = {}
    for name, app in (details.get("applications") or {}).items():
        deployments = {}
        for dname, dep in (app.get("deployments") or {}).items():
            states = Counter(replica["state"] for replica in dep.get("replicas") or ())
            deployments[dname] = {"status": dep["status"],
                                  "status_trigger": dep.get("status_trigger", "UNSPECIFIED"),
                                  "replica_states": dict(states),
                                  "message": dep.get("message", "")}
        applications[name] = {"status": app["status"], "message": app.get("message", ""),
                              "last_deployed_time_s": app.get("last_deployed_time_s"),
                              "deployments": deployments}
    proxies = {name: proxy.get("status", "HEALTHY")
               for name, proxy in (details.get("proxies") or {}).items()}
    return {"proxies": proxies, "applications": applications,
            "target_capacity": details.get("target_capacity")}
