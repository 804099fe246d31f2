"""Build and deploy one config for Ray's REST API: `python -m surge.api.rest_apply`.

The controller starts one for each `PUT /api/serve/applications/` (controller/rest.py,
controller/rest_builds.py) and speaks to it in lines, its ApplySpec first:

    controller → builder            builder → controller
    ApplySpec (the config)          VALID | INVALID <reason as JSON>
    GO | DROP (a newer PUT won)     BUILT | FAILED <{app: reason} as JSON>
    after FAILED: RECORD | DISCARD

VALID comes from the schema alone (no user code), fast, so the PUT never waits on a
previous build. On GO every application is imported and built, one by one; when all
built they are deployed, and the applications an earlier config deployed that this one
lacks are deleted (`surge deploy`'s meaning), then BUILT. FAILED: when the controller
still holds the PUT it answers 400 and says DISCARD (nothing changes); when it answered
already (the build outlived the answer's budget) it says RECORD: the applications that
built are deployed and each failed one is DEPLOY_FAILED with its reason, as Ray
reports it.
"""

from __future__ import annotations

import json
import os
import sys

from surge.api.config_apply import build_app, deploy_specs, entry_of
from surge.api.config_file import ServeConfig, parse_config
from surge.api.instance import connect_or_start, disconnect
from surge.config import AppSpec
from surge.control_auth import TOKEN_ENV
from surge.errors import RayServeException
from surge.launch import ApplySpec, read_spec

SOURCE = "PUT /api/serve/applications/"


def _say(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def _heard() -> str:
    return sys.stdin.readline().strip()  # "" when the controller went away


def main() -> int:
    try:
        spec = read_spec(ApplySpec)
        config = parse_config(json.loads(spec.config), source=SOURCE)
    except (RayServeException, ValueError) as exc:
        _say(f"INVALID {json.dumps(str(exc))}")
        return 1
    for warning in config.warnings:
        print(f"warning: {warning}", file=sys.stderr)
    _say("VALID")
    if _heard() != "GO":
        return 0
    os.environ["SURGE_ADDRESS"] = spec.controller  # the instance that asked: connect to it
    if spec.token:
        os.environ[TOKEN_ENV] = spec.token
    built, failed = _build(config)
    try:
        if not failed:
            try:
                _deploy(config, built, failed)
            except RayServeException as exc:  # refused by the controller: say why
                _say(f"FAILED {json.dumps({'(deploy)': str(exc)})}")
                return 1
            _say("BUILT")
            return 0
        _say(f"FAILED {json.dumps(failed)}")
        if _heard() != "RECORD":
            return 1
        _deploy(config, built, failed)
    except RayServeException as exc:
        print(f"deploying {SOURCE}: {exc}", file=sys.stderr)
        return 1
    finally:
        disconnect(shutdown=False)
    return 0


def _build(config: ServeConfig) -> tuple[list[AppSpec], dict[str, str]]:
    built, failed = [], {}
    for app in config.applications:
        try:
            built.append(build_app(config, app))
        except RayServeException as exc:
            failed[app.name] = str(exc)
    return built, failed


def _deploy(config: ServeConfig, built: list[AppSpec], failed: dict[str, str]) -> None:
    instance = connect_or_start(start=False)
    deploy_specs(instance, built, {app.name for app in config.applications},
                 progress=lambda line: None)
    for app in config.applications:
        if app.name in failed:
            instance.call("build_failed", timeout=10, name=app.name, message=failed[app.name],
                          source_config=entry_of(config, app), route_prefix=app.route_prefix)


if __name__ == "__main__":
    sys.exit(main())
