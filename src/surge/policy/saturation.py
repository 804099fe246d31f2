"""Node CPU saturation: replicas were added, the node's CPU is busy, throughput stayed flat.

More replicas on a node whose cores are all busy add no capacity: they share the same
CPU (and each costs a fork and memory). The autoscaling step (policy/autoscale_step.py)
asks this module each decision, and while an episode of saturation lasts it does not
raise the target: the decision becomes kind NODE_SATURATED, with the numbers.

An episode begins when all of these hold:

* the node's CPU (busy share of all its cores, read by the controller's shell) is at
  least `SATURATED_CPU`; no reading (another node, no /proc) means no verdict;
* replicas were added within the last `RECENT_S`;
* the replicas that have served for a whole `RATE_WINDOW_S` since the first addition
  of this run did not raise the deployment's completions by `MIN_GAIN_SHARE` of what
  they would add at the per-replica rate measured before the run;
* demand is unmet: requests offered exceed completions by `UNMET_SHARE`.

It ends when the node's CPU falls below `CLEAR_CPU` (or its reading goes away); the
state then forgets the run. `observe` is pure: time is the `now` it is given.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from surge.policy.autoscaling import Decision, DecisionKind
from surge.policy.load_signals import LoadSample

__all__ = [
    "CLEAR_CPU",
    "MIN_GAIN_SHARE",
    "RATE_WINDOW_S",
    "RECENT_S",
    "SATURATED_CPU",
    "UNMET_SHARE",
    "SaturationState",
    "hold_on_saturation",
    "observe",
    "rates",
]

# Busy share of all the node's cores from which it counts as saturated (a scheduler
# rarely shows 100 %: interrupts, the odd idle tick between bursts).
SATURATED_CPU = 0.9
# An episode ends below this share: hysteresis, so a node hovering at 90 % does not
# flip between adding replicas and refusing to every second.
CLEAR_CPU = 0.8
# Replicas added within this long are "added recently": the run whose effect is judged.
RECENT_S = 5.0
# Throughput is measured over this window; an addition counts once it is this old.
RATE_WINDOW_S = 1.0
# Added replicas "raised throughput" if it rose by at least this share of what they
# would add at the per-replica rate before: a quarter tolerates replicas still warming.
MIN_GAIN_SHARE = 0.25
# Demand is unmet (more replicas were wanted) when offered exceeds completed by this.
UNMET_SHARE = 0.1
# At most this many additions are remembered per run (a 0.1 s tick over RECENT_S).
MAX_RISES = 64
_EPS = 1e-9


@dataclass(frozen=True)
class SaturationState:
    """What the verdict remembers between decisions of one deployment."""

    running: int = 0  # RUNNING replicas at the last decision
    base_at: float | None = None  # the first addition of the current run
    base_running: int = 0  # RUNNING replicas just before it
    base_rate: float = 0.0  # completions/s just before it
    rises: tuple[tuple[float, int], ...] = ()  # (when, RUNNING after) since base_at
    since: float | None = None  # when the episode began; None: not saturated
    reason: str = ""  # the numbers that began it

    @property
    def saturated(self) -> bool:
        return self.since is not None


def rates(samples: Sequence[LoadSample], now: float,
          seconds: float = RATE_WINDOW_S) -> tuple[float, float]:
    """(offered, completed) per second over the samples ending within `seconds`."""
    recent = [s for s in samples if s.t > now - seconds + _EPS]
    span = sum(s.duration_s for s in recent)
    if span <= 0:
        return 0.0, 0.0
    return sum(s.arrivals for s in recent) / span, sum(s.completions for s in recent) / span


def _track(state: SaturationState, now: float, running: int,
           completed: float) -> SaturationState:
    """Note an addition (a new run, or one more in the current run) or a removal."""
    if running < state.running:  # a removal ends the run: nothing was added lately
        return replace(state, running=running, base_at=None, base_running=0, base_rate=0.0,
                       rises=())
    if running == state.running:
        return state
    # A run that began with nothing to compare with (no replica, or none served) is
    # replaced by this addition's.
    fresh = (state.base_at is None or now - state.base_at > RECENT_S
             or state.base_rate <= 0 or state.base_running <= 0)
    if fresh:
        return replace(state, running=running, base_at=now, base_running=state.running,
                       base_rate=completed, rises=((now, running),))
    return replace(state, running=running, rises=(*state.rises, (now, running))[-MAX_RISES:])


def _verdict(state: SaturationState, now: float, cpu: float, offered: float,
             completed: float) -> str:
    """The reason an episode begins now, or "" if it does not."""
    if cpu < SATURATED_CPU or not state.rises or now - state.rises[-1][0] > RECENT_S + _EPS:
        return ""
    served = [n for at, n in state.rises if now - at >= RATE_WINDOW_S - _EPS]
    if not served or state.base_running <= 0 or state.base_rate <= 0:
        return ""
    added = served[-1] - state.base_running
    expected = state.base_rate * added / state.base_running
    if completed - state.base_rate >= MIN_GAIN_SHARE * expected:
        return ""
    if offered <= completed * (1 + UNMET_SHARE):
        return ""
    return (f"node CPU {cpu:.0%} busy: {state.base_running} -> {served[-1]} replicas "
            f"served {state.base_rate:.0f} -> {completed:.0f} req/s of {offered:.0f} offered")


def observe(state: SaturationState, now: float, running: int, node_cpu: float | None,
            samples: Sequence[LoadSample]) -> SaturationState:
    """The state after this decision's observation: additions tracked, episode begun,
    held or ended."""
    offered, completed = rates(samples, now)
    state = _track(state, now, running, completed)
    if node_cpu is None or (state.saturated and node_cpu < CLEAR_CPU):
        return SaturationState(running=running)
    if state.saturated:
        return state
    reason = _verdict(state, now, node_cpu, offered, completed)
    if not reason:
        return state
    return replace(state, since=now, reason=reason)


def hold_on_saturation(decision: Decision, state: SaturationState, target: int,
                       node_cpu: float | None, floor: int = 0) -> Decision:
    """While saturated, a decision to add replicas keeps the current `target` instead;
    never one below `floor` (min_replicas, a schedule's floor) nor at 0 (a cold start:
    a deployment with no replica would leave its requests waiting for ever)."""
    signals = dict(decision.signals)
    if node_cpu is not None:
        signals["node_cpu"] = node_cpu
    if not state.saturated or decision.target <= target or target == 0 or target < floor:
        return replace(decision, signals=signals)
    return Decision(target, DecisionKind.NODE_SATURATED,
                    f"hold: {state.reason}; not adding replicas on this node (the policy "
                    f"asked for {decision.target})", decision.state, signals)
