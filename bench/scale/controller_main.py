"""The controller process of the scale bench: `python bench/scale/controller_main.py
SOCKET...`, its ControllerProcessSpec on stdin, as surge starts `surge.controller`.

It runs surge's own controller entry point (surge.controller.main.main) with one
difference: the backend is bench/scale/backend.py's HostBackend, whose replicas are
fakes inside the replica hosts listening on the SOCKETs.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent.parent))

from bench.scale.backend import HostBackend
from surge.controller.main import main
from surge.launch import ControllerProcessSpec, Membership


def hosts(spec: ControllerProcessSpec, membership: Membership) -> HostBackend:
    return HostBackend(sys.argv[1:])


if __name__ == "__main__":
    sys.exit(main(hosts))
