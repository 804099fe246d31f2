"""`surge simulate`: a pulse on a simulated cluster, driven by the production policies.

scenario (YAML -> validated Scenario)  distributions  traffic (schedules, the oracle)
flow (requests in aggregate)  cluster (replicas one by one)  engine (the 0.1 s loop)
report (the `surge pulse` report format)  sweep (runs side by side)

    from surge.sim import simulate
    run = simulate("examples/scenarios/pulse-1m-qps.yaml", {"variant": "proactive"})
    run.summary["slo_ok_fraction"], run.summary["oracle_ratio"]
"""

from surge.sim.engine import Simulation
from surge.sim.report import build_report, write_sim_report
from surge.sim.scenario import Scenario, ScenarioError, load_scenario
from surge.sim.sweep import Run, SweepAxis, parse_sweep, run_sweep, simulate, sweep_table

__all__ = ["Run", "Scenario", "ScenarioError", "Simulation", "SweepAxis", "build_report",
           "load_scenario", "parse_sweep", "run_sweep", "simulate", "sweep_table",
           "write_sim_report"]
