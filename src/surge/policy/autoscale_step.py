"""One autoscaling step of one deployment: what the controller and the simulator both run.

The step, in order: the daily schedule's floors in force at the local time of day
(policy.schedule) raise `min_replicas` and the standby count; the deployment's policy
(policy.resolve: built-in or the user's) decides on the load samples with those floors
applied (and, for engines that report their queues, the replicas those ask for:
policy.engine_load, and for an LLM deployment with latency objectives the engines'
measured capacity: policy.llm_objectives); a policy that raises is itself a decision
(kind POLICY_FAILED, the target stays), never an exception that stops a control loop.
Last, when the node's CPU is saturated and the replicas added last did not raise
throughput (policy.saturation), a decision to add more keeps the target instead (kind
NODE_SATURATED).

The start-up lead the policy projects over is the measured cold start's, or, while
standbys are ready, a standby's activation (`standby_lead_s`): those come within
milliseconds, so sizing for the load a cold start away would buy replicas early; a
decision that wants more than the standbys give is taken again over the cold lead.

Cadence, shared by both callers: the control loop closes a load sample every `TICK_S`;
a router whose queue starts to grow, or an LLM deployment's router whose arrivals jump
(policy/arrival_jump.py), reports after `URGENT_REPORT_DELAY_S`, and the controller then
decides at once on the open bucket (and, on a jump, at least the rate it implies:
`jump_rate`), at most once per `URGENT_DECISION_INTERVAL_S` per
deployment (`urgent_decision_due`). Such an `urgent` step only ever scales up: anything
else it would decide (a hold, and the state it carries: the wait before a scale-down and
the most demand seen during it) is left to the ticks. Urgent reports come at the peaks
of bursty load (an LLM router's jumps, about one a second on a BurstGPT-shaped replay),
and holds decided there raised the peak a scale-down keeps to: 1-4% more
replica-seconds on bench/llm_sim_targets.py's replay.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from surge.config import AutoscalingConfig
from surge.policy.autoscaling import (
    Decision,
    DecisionKind,
    LoadSample,
    PolicyState,
    ScalingInputs,
)
from surge.policy.cadence import TICK_S, URGENT_DECISION_INTERVAL_S, URGENT_REPORT_DELAY_S
from surge.policy.engine_load import EngineLoad, engine_demand
from surge.policy.resolve import Policy
from surge.policy.saturation import SaturationState, hold_on_saturation, observe
from surge.policy.schedule import floors_at, with_floors

__all__ = [
    "STANDBY_LEAD_S",
    "TICK_S",
    "URGENT_DECISION_INTERVAL_S",
    "URGENT_REPORT_DELAY_S",
    "Step",
    "StepInputs",
    "autoscale_step",
    "urgent_decision_due",
    "urgent_decision_wait",
]


# A standby serves this soon after it is asked for: its activation is a route-table push
# (docs/llm.md: 10 ms with mock engines), plus a tick's margin.
STANDBY_LEAD_S = 0.05


@dataclass(frozen=True)
class StepInputs:
    now: float  # the policy's clock (monotonic seconds)
    second_of_day: float  # local time of day, for schedule floors
    running: int  # RUNNING replicas of the current version
    target: int
    samples: Sequence[LoadSample]  # oldest first; may end with the open bucket
    startup_lead_s: float = 1.0  # measured: asking for a replica -> it serves (cold)
    standbys: int = 0  # STANDBY replicas ready to activate
    standby_lead_s: float = STANDBY_LEAD_S  # ... and how soon one serves once asked
    engine: EngineLoad | None = None  # the engines' fresh reports (policy/engine_load.py)
    node_cpu: float | None = None  # busy share of its node's cores; None: not known
    saturation: SaturationState = field(default_factory=SaturationState)  # the last step's
    urgent: bool = False  # between ticks, on an urgent report: only a scale-up counts
    jump_rate: float = 0.0  # ... an LLM router's jump: the rate it implies (urgent only)


@dataclass(frozen=True)
class Step:
    decision: Decision
    standby_replicas: int  # standbys wanted now (the schedule's floor or the config's)
    saturation: SaturationState = field(default_factory=SaturationState)  # the next step's input

    @property
    def target(self) -> int:
        return self.decision.target

    @property
    def failed(self) -> bool:
        """The policy raised: the target stays, and its state is not updated."""
        return self.decision.kind is DecisionKind.POLICY_FAILED

    @property
    def saturated(self) -> bool:
        """The node's CPU is saturated (whether or not this decision wanted more)."""
        return self.saturation.saturated


def autoscale_step(policy: Policy, config: AutoscalingConfig, state: PolicyState,
                   inputs: StepInputs) -> Step:
    floors = floors_at(config.schedule_windows, inputs.second_of_day, config.min_replicas,
                       config.standby_replicas)
    lead = (min(inputs.startup_lead_s, inputs.standby_lead_s) if inputs.standbys > 0
            else inputs.startup_lead_s)
    scaling = ScalingInputs(now=inputs.now, running=inputs.running, target=inputs.target,
                            samples=inputs.samples, startup_lead_s=lead,
                            engine_demand=engine_demand(inputs.engine,
                                                        config.target_ongoing_requests),
                            engine=inputs.engine,
                            jump_rate=inputs.jump_rate if inputs.urgent else 0.0)
    bounded = with_floors(config, floors)
    try:
        decision = policy(scaling, bounded, state)
        if lead < inputs.startup_lead_s and decision.target > inputs.target + inputs.standbys:
            # more than the standbys give: the rest start cold, so look that far ahead
            decision = policy(replace(scaling, startup_lead_s=inputs.startup_lead_s),
                              bounded, state)
    except Exception as exc:  # a user policy must not stop the control loop
        decision = Decision(inputs.target, DecisionKind.POLICY_FAILED,
                            f"policy failed: {exc!r}; keeping {inputs.target} replicas", state)
        return Step(decision, floors.standby_replicas, inputs.saturation)
    if inputs.urgent and decision.target <= inputs.target:
        decision = Decision(inputs.target, DecisionKind.HOLD,
                            f"hold (between ticks only a scale-up is decided): "
                            f"{decision.reason}", state, decision.signals)
        return Step(decision, floors.standby_replicas, inputs.saturation)
    saturation = observe(inputs.saturation, inputs.now, inputs.running, inputs.node_cpu,
                         inputs.samples)
    decision = hold_on_saturation(decision, saturation, inputs.target, inputs.node_cpu,
                                  floor=floors.min_replicas)
    return Step(decision, floors.standby_replicas, saturation)


def urgent_decision_due(last_at: float, now: float) -> bool:
    """Whether an out-of-tick decision may run now (the last one was at `last_at`)."""
    return now - last_at >= URGENT_DECISION_INTERVAL_S


def urgent_decision_wait(last_at: float, now: float) -> float:
    """How long after `now` an out-of-tick decision becomes due (0.0: it is due now)."""
    return max(0.0, last_at + URGENT_DECISION_INTERVAL_S - now)
