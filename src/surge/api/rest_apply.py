"""Build and deploy one config for Ray's REST API: `python -m surge.api.rest_apply`.

The controller starts it for each `PUT /api/serve/applications/` (controller/rest.py),
with an `ApplySpec` on stdin: the instance's address and token, and the config. It does
what `surge deploy` does (surge.api.config_apply), without waiting for the applications
to run: Ray's PUT answers once the deploy is accepted, and clients follow the status.
Exit 0 when everything was deployed; else 1 and the reason on stderr, nothing changed
when the config or the code was at fault.
"""

from __future__ import annotations

import json
import os
import sys

from surge.api.config_apply import apply_config
from surge.api.config_file import parse_config
from surge.api.instance import disconnect
from surge.control_auth import TOKEN_ENV
from surge.errors import RayServeException
from surge.launch import ApplySpec, read_spec

SOURCE = "PUT /api/serve/applications/"


def main() -> int:
    try:
        spec = read_spec(ApplySpec)
    except RayServeException as exc:
        print(exc, file=sys.stderr)
        return 2
    os.environ["SURGE_ADDRESS"] = spec.controller  # the instance that asked: connect to it
    if spec.token:
        os.environ[TOKEN_ENV] = spec.token
    try:
        config = parse_config(json.loads(spec.config), source=SOURCE)
        for warning in config.warnings:
            print(f"warning: {warning}", file=sys.stderr)
        apply_config(config, start=False, progress=lambda line: None, wait=False)
    except RayServeException as exc:
        print(exc, file=sys.stderr)
        return 1
    finally:
        disconnect(shutdown=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
