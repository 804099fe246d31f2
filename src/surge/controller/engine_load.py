"""The engines' reports (`record_autoscaling_stats`), kept per deployment for autoscaling.

A replica whose class defines the hook pushes an `EngineReport` every routing-stats
period (replica/stats_hooks.py); the latest of each replica is kept, stamped with the
controller's clock, and each autoscaling step gets the fresh ones summed
(policy.engine_load.fresh_load): a replica that stopped reporting (gone, stuck) drops
out after two of its periods, and is forgotten after FORGET_S.
"""

from __future__ import annotations

import dataclasses

from surge.model import DeploymentId
from surge.policy.engine_load import EngineLoad, EngineReport, fresh_load

__all__ = ["FORGET_S", "EngineTracker"]

# A replica silent this long is forgotten (the reports of replicas long gone stay bounded).
FORGET_S = 60.0


class EngineTracker:
    def __init__(self) -> None:
        self._reports: dict[DeploymentId, dict[str, EngineReport]] = {}

    def __repr__(self) -> str:
        return f"<EngineTracker deployments={len(self._reports)}>"

    def report(self, deployment: DeploymentId, report: EngineReport, now: float) -> None:
        self._reports.setdefault(deployment, {})[report.replica_id] = dataclasses.replace(
            report, at=now)

    def load(self, deployment: DeploymentId, now: float) -> EngineLoad | None:
        """The deployment's fresh reports summed; None when none is fresh."""
        reports = self._reports.get(deployment)
        if not reports:
            return None
        for replica_id in [r for r, rep in reports.items() if now - rep.at > FORGET_S]:
            del reports[replica_id]
        return fresh_load(reports.values(), now)

    def drop(self, deployment: DeploymentId) -> None:
        self._reports.pop(deployment, None)
