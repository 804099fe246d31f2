"""Standby replicas in the controller, on a fake clock and backend: a standby is
activated by the scale-up decision's own step, the pool refills in the same step, and
a standby's idle engine counts in no autoscaling signal until it serves."""

from __future__ import annotations

import pytest

from surge.config import AutoscalingConfig, DeploymentConfig
from surge.model import LoadReport
from surge.policy.engine_load import EngineReport
from tests.shells.test_controller import DID, Harness, app, routable, run


def _standby_app() -> DeploymentConfig:
    scaling = AutoscalingConfig(min_replicas=1, max_replicas=4, upscale_delay_s=0.0,
                                target_ongoing_requests=16, standby_replicas=1)
    return DeploymentConfig(name="Model", autoscaling_config=scaling)


def test_a_standby_engines_idle_report_does_not_dilute_the_running_ones() -> None:
    async def main() -> None:
        h = Harness()
        await h.deploy(app(_standby_app()))
        proxy = await h.watcher()
        await h.tick()
        running = await h.ready("Model-1")
        standby = await h.ready("Model-2")
        assert h.states() == {"Model-1": "RUNNING", "Model-2": "STANDBY"}
        h.controller.on_push(proxy, "load", [LoadReport(DID, 1, 1, 0, 0, 12)])
        # The running engine runs 6 and 6 wait; the standby's engine is idle.
        h.controller.on_push(standby, "engine_load", EngineReport("Model-2", 0, 0, 0.0, 0.25))
        h.controller.on_push(running, "engine_load", EngineReport("Model-1", 6, 6, 1.0, 0.25))
        load = h.controller.engines.load(DID, h.clock.monotonic())
        assert load is not None and load.replicas == 1  # the standby's report is not load
        await h.tick()
        # Two replicas' worth (12 / 6 x 1), not four (12 / 6 x 2) nor a mean KV use of 0.5.
        assert h.controller.autoscaler.last[DID].signals["engine_demand"] == pytest.approx(2.0)
        assert h.state.deployments[DID].target == 2
        # The decision's step activated the standby and started its replacement.
        assert h.states() == {"Model-1": "RUNNING", "Model-2": "RUNNING", "Model-3": "STARTING"}
        assert routable(proxy)[-1] == ["Model-1", "Model-2"]
        h.controller.on_push(standby, "engine_load", EngineReport("Model-2", 1, 2, 0.1, 0.25))
        load = h.controller.engines.load(DID, h.clock.monotonic())
        assert load is not None and load.replicas == 2  # activated: its load counts
        await h.ready("Model-3")
        assert h.states()["Model-3"] == "STANDBY"  # the pool is whole again
        assert routable(proxy)[-1] == ["Model-1", "Model-2"]

    run(main)
