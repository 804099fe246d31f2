"""Desired state: what a deploy or a delete changes in the controller's state.

`deploy` checks the application against the others (a route prefix belongs to one
application), then creates or updates one record per deployment: a new code version
bumps the version (policy.reconcile rolls the replicas), a new user_config alone is
sent to the running replicas (the returned `Reconfigure` actions), an autoscaled target
carries over within the new bounds. Deployments the new version no longer has are
deleted: target 0, drained, forgotten once their last replica is gone. `delete` does the
same to every deployment of the application and takes its route away at once.
"""

from __future__ import annotations

from surge.config import AppSpec, DeploymentSpec
from surge.controller.actions import Reconfigure
from surge.controller.state import AppRecord, ControllerState, DeploymentRecord
from surge.errors import ConfigError
from surge.model import DeploymentId

__all__ = ["build_failed", "delete", "deploy"]


def deploy(state: ControllerState, app: AppSpec, wall: float) -> list[Reconfigure]:
    for other in state.apps.values():
        if (other.name != app.name and app.route_prefix is not None
                and other.route_prefix == app.route_prefix):
            raise ConfigError(f"route_prefix {app.route_prefix!r} is already used by "
                              f"application {other.name!r}; choose another route_prefix")
    previous = state.apps.get(app.name)
    actions: list[Reconfigure] = []
    names = []
    for spec in app.deployments:
        did = DeploymentId(app.name, spec.config.name)
        record = state.deployments.get(did)
        if record is None:
            state.deployments[did] = DeploymentRecord(did, spec, 1, spec.code_version,
                                                      spec.config.initial_replicas,
                                                      app.sys_path)
        else:
            actions += _update(state, record, spec, app.sys_path)
        names.append(spec.config.name)
    if previous is not None:
        for did in previous.ids():
            if did.name not in names and did in state.deployments:
                _delete_deployment(state.deployments[did])
    state.apps[app.name] = AppRecord(app.name, app.route_prefix, app.ingress, tuple(names),
                                     wall, auth=app.auth, source_config=app.source_config,
                                     model_routes=app.model_routes)
    return actions


def build_failed(state: ControllerState, name: str, message: str,
                 source_config: dict[str, object], route_prefix: str | None,
                 wall: float) -> None:
    """A config's application could not be built: it is DEPLOY_FAILED with the reason,
    as Ray reports it. An application that ran keeps its deployments; a new one is a
    record with none (no route)."""
    app = state.apps.get(name)
    if app is None:
        state.apps[name] = AppRecord(name, route_prefix, "", (), wall,
                                     source_config=source_config, build_error=message)
        return
    app.build_error = message or "the application could not be built"
    app.source_config = source_config
    app.deployed_at = wall


def _update(state: ControllerState, record: DeploymentRecord, spec: DeploymentSpec,
            sys_path: tuple[str, ...]) -> list[Reconfigure]:
    target = spec.config.initial_replicas
    scaling = spec.config.autoscaling_config
    if scaling is not None and not record.deleting:  # keep the autoscaled size
        target = min(max(record.target, scaling.min_replicas), scaling.max_replicas)
    actions = []
    if record.code_version != spec.code_version:
        record.version += 1
        record.code_version = spec.code_version
        record.version_ran = False
    elif record.config.user_config != spec.config.user_config:
        actions = [Reconfigure(r.replica_id, spec.config.user_config)
                   for r in state.running(record.id)]
    record.spec, record.target, record.sys_path = spec, target, sys_path
    record.constructor_failures, record.last_error, record.deleting = 0, "", False
    record.health_failed = ""  # a new deploy starts over, as Ray's CONFIG_UPDATE
    return actions


def _delete_deployment(record: DeploymentRecord) -> None:
    record.deleting, record.target = True, 0


def delete(state: ControllerState, name: str) -> bool:
    """Start deleting an application; False if there is none of that name."""
    app = state.apps.get(name)
    if app is None:
        return False
    live = [did for did in app.ids() if did in state.deployments]
    if not live:  # nothing to drain (an application that never built): gone at once
        del state.apps[name]
        return True
    for did in live:
        _delete_deployment(state.deployments[did])
    app.route_prefix, app.deleting = None, True
    return True
