"""The chaos scenarios, shared by the short suite (tests/chaos) and the long bench
(bench/chaos.py): the same code, with a `Profile` saying how long and how hard.

Each scenario deploys its application on a fresh instance, runs steady open-loop load,
takes the baseline memory at the end of the warm-up, injects its fault, and says what
must be true afterwards. What every scenario must satisfy (DESIGN.md §4):

* every request ends: unanswered == 0, and none hangs until the generator's timeout;
* before the fault, everything succeeds; in the last `tail_s` of load, everything
  succeeds again (the instance recovered by itself);
* each surviving surge process's RSS at the end is within 20% of its warm-up RSS.

Then each scenario adds which error classes its fault may cause, and how many.
"""

from __future__ import annotations

import os
import shutil
import signal
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import httpx

from surge import serve
from surge.config import DEFAULT_MAX_CONSTRUCTOR_RETRY_COUNT as MAX_CONSTRUCTOR_FAILURES
from surge.errors import DeployFailedError
from surge.loadtest.options import PulseOptions
from surge.loadtest.runner import build_report
from surge.loadtest.stats import Record
from tests.chaos.apps import (
    BROKEN_MESSAGE,
    CAPPED_MAX_ONGOING,
    CAPPED_MAX_QUEUED,
    CAPPED_MAX_REPLICAS,
    CAPPED_SERVICE_MS,
    Broken,
    Capped,
    Work,
    capped_capacity_rps,
)
from tests.chaos.harness import (
    RSS_TOLERANCE,
    Counts,
    Instance,
    Outcome,
    Proc,
    compare_memory,
    error_points,
    run_load,
    seconds,
    steady,
    surge_instance,
)
from tests.eventually import eventually

APP = "chaos"
WORK_REPLICAS = 2
WORK_MAX_ONGOING = 8  # Work's max_ongoing_requests: at most this many die with a replica
# The restarted instance must show its new state within this long after the load.
SETTLE_TIMEOUT_S = 20.0


@dataclass(frozen=True)
class Profile:
    """How long and how hard: the short suite and the long bench differ only here."""

    name: str
    rps: float  # steady load of the fault scenarios
    warmup_s: float  # load before the baseline memory and the fault
    after_s: float  # load after the fault
    overload_s: float  # load of an overload scenario after its warm-up
    timeout_s: float  # a request unanswered this long has hung
    tail_s: float  # requests sent in the last tail_s must all succeed
    connections: int = 256


SHORT = Profile("short", rps=200, warmup_s=2.0, after_s=4.5, overload_s=4.5, timeout_s=5.0,
                tail_s=1.5)
LONG = Profile("long", rps=400, warmup_s=10.0, after_s=30.0, overload_s=60.0, timeout_s=10.0,
               tail_s=5.0)


class Run:
    """One scenario's run: the instance, what the scenario noted, what went wrong."""

    def __init__(self, scenario: Scenario, profile: Profile, instance: Instance) -> None:
        self.scenario = scenario
        self.profile = profile
        self.instance = instance
        self.notes: list[str] = []
        self.problems: list[str] = []
        self.before: dict[Proc, int] = {}
        self.after: dict[Proc, int] = {}
        self.state: dict[str, Any] = {}

    def check(self, ok: Any, problem: str) -> None:
        if not ok:
            self.problems.append(problem)

    def eventually(self, predicate: Callable[[], Any], timeout_s: float, what: str,
                   interval_s: float = 0.1) -> Any:
        """`eventually`, but a timeout is one more problem of the run (and None), not a
        raise: a scenario goes on checking, and reports every check that failed."""
        try:
            return eventually(predicate, timeout_s, interval_s=interval_s, what=what)
        except AssertionError as exc:
            self.problems.append(str(exc))
            return None

    def replicas(self) -> list[dict[str, Any]]:
        found: list[dict[str, Any]] = self.instance.call("replicas")
        return [r for r in found if r["app"] == APP]

    def running_pids(self) -> set[int]:
        return {r["pid"] for r in self.replicas() if r["state"] == "RUNNING"}


class Scenario:
    name = ""
    fault = True  # False: nothing is injected; every request is judged alike
    http_options: dict[str, Any] = {}

    def rate(self, profile: Profile) -> float:
        return profile.rps

    def phases(self, profile: Profile) -> tuple[float, float]:
        return profile.warmup_s, profile.after_s

    def deploy(self, run: Run) -> str:
        """Deploy the application; return the path the load goes to."""
        serve.run(Work.bind(), name=APP, route_prefix="/work")
        return "/work"

    def inject(self, run: Run) -> None:
        """The fault, at the end of the warm-up (on the timeline's thread)."""

    def settle(self, run: Run) -> None:
        """After the load: wait for the aftermath and check it."""

    def judge(self, run: Run, counts: Counts) -> None:
        """Which failed requests the fault may cause."""

    def cleanup(self, run: Run) -> None:
        pass


def _only(run: Run, counts: Counts, allowed: set[str]) -> None:
    """Every failed request is of an allowed class ("503", "500", "connection", ...)."""
    extra = {kind: n for kind, n in counts.by_kind.items() if kind not in allowed}
    run.check(not extra, f"failed requests of unexpected classes: {extra}")


class KillReplica(Scenario):
    name = "SIGKILL a replica"

    def inject(self, run: Run) -> None:
        victim = run.instance.processes.of_kind(f"replica:{APP}:Work")[0]
        os.kill(victim.pid, signal.SIGKILL)
        run.state["victim"] = victim
        run.notes.append(f"killed replica pid {victim.pid}")

    def settle(self, run: Run) -> None:
        victim = run.state["victim"]
        running = run.eventually(
            lambda: (pids := run.running_pids()) and len(pids) == WORK_REPLICAS
            and victim.pid not in pids and pids, SETTLE_TIMEOUT_S,
            what=f"the killed replica (pid {victim.pid}) replaced: {WORK_REPLICAS} RUNNING")
        run.notes.append(f"running replicas after: {sorted(running or [])}")

    def judge(self, run: Run, counts: Counts) -> None:
        # only the requests in flight on the victim may fail, with a 500 that says so
        _only(run, counts, {"500"})
        run.check(counts.s5xx <= WORK_MAX_ONGOING,
                  f"{counts.s5xx} requests failed; at most {WORK_MAX_ONGOING} were in flight "
                  "on the killed replica")


class KillProxy(Scenario):
    name = "SIGKILL the proxy"

    def inject(self, run: Run) -> None:
        [victim] = run.instance.processes.of_kind("proxy")
        os.kill(victim.pid, signal.SIGKILL)
        run.state["victim"] = victim
        run.notes.append(f"killed proxy pid {victim.pid}")

    def settle(self, run: Run) -> None:
        victim = run.state["victim"]
        new = run.eventually(lambda: [p for p in run.instance.processes.of_kind("proxy")
                                      if p != victim], SETTLE_TIMEOUT_S,
                             what="a restarted proxy")
        run.check(not victim.alive(), "the killed proxy is still alive")
        with httpx.Client(timeout=5) as client:
            healthy = client.get(f"{run.instance.url}/-/healthz").status_code
        run.check(healthy == 200, f"the restarted proxy answers /-/healthz with {healthy}")
        run.notes.append(f"new proxy: {[p.pid for p in new or []]}")

    def judge(self, run: Run, counts: Counts) -> None:
        # requests on the killed connections, and connects while no proxy listens, fail
        # as connection errors; none may be answered wrongly or hang
        _only(run, counts, {"connection"})


class KillController(Scenario):
    name = "SIGKILL the controller"

    def inject(self, run: Run) -> None:
        [victim] = run.instance.processes.of_kind("controller")
        run.state["victim"] = victim
        run.state["replicas"] = {r["pid"] for r in run.replicas()}
        os.kill(victim.pid, signal.SIGKILL)
        run.notes.append(f"killed controller pid {victim.pid}")

    def settle(self, run: Run) -> None:
        victim = run.state["victim"]

        def restarted() -> Any:
            new = [p for p in run.instance.processes.of_kind("controller") if p != victim]
            return new and serve.status().applications[APP].status.value == "RUNNING" and new

        new = run.eventually(restarted, SETTLE_TIMEOUT_S, interval_s=0.25,
                             what="a restarted controller serving status() with the "
                                  "application RUNNING")
        if new:
            live = run.state["replicas"]
            pids = run.eventually(lambda: (p := run.running_pids()) == live and p,
                                  SETTLE_TIMEOUT_S,
                                  what=f"the restarted controller re-attaching the live "
                                       f"replicas {sorted(live)}")
            if not pids:
                run.notes.append(f"the restarted controller sees {run.running_pids()}")
            run.notes.append(f"new controller pid {new[0].pid}")
        # proxies and replicas must live on; the fork server is only how new replicas
        # start, and the new controller may start a fresh one
        lost = [f"{p.kind} (pid {p.pid})" for p in run.before
                if p.kind.startswith(("proxy", "replica")) and not p.alive()]
        run.check(not lost, f"processes died with the controller: {lost}")
        others = [f"{p.kind} (pid {p.pid})" for p in run.before
                  if not p.kind.startswith(("proxy", "replica", "controller")) and not p.alive()]
        if others:
            run.notes.append(f"replaced with the controller: {', '.join(others)}")

    def judge(self, run: Run, counts: Counts) -> None:
        # the controller is not on the request path: nothing may fail at all
        _only(run, counts, set())


class HangReplica(Scenario):
    name = "a replica hangs"

    def inject(self, run: Run) -> None:
        with httpx.Client(timeout=5) as client:
            victim = client.get(f"{run.instance.url}/work", params={"hang": "1"}).json()["pid"]
        run.state["victim"] = victim
        run.notes.append(f"replica pid {victim} hangs (its event loop is blocked)")

    def settle(self, run: Run) -> None:
        victim = run.state["victim"]
        run.eventually(lambda: (pids := run.running_pids()) and len(pids) == WORK_REPLICAS
                       and victim not in pids and pids, SETTLE_TIMEOUT_S,
                       what=f"the hung replica (pid {victim}) replaced: {WORK_REPLICAS} RUNNING")
        run.eventually(lambda: not [p for p in run.instance.processes.scan()
                                    if p.pid == victim], 5.0,
                       what=f"the hung replica (pid {victim}) gone")

    def judge(self, run: Run, counts: Counts) -> None:
        # the requests stuck on the hung replica end with a 500 when it is killed
        _only(run, counts, {"500"})
        run.check(counts.s5xx <= WORK_MAX_ONGOING,
                  f"{counts.s5xx} requests failed; at most {WORK_MAX_ONGOING} could be stuck "
                  "on the hung replica")


class InitRaises(Scenario):
    name = "__init__ raises"
    fault = False

    def deploy(self, run: Run) -> str:
        folder = run.state["folder"] = tempfile.mkdtemp(prefix="surge-chaos-")
        attempts = run.state["attempts_file"] = os.path.join(folder, "attempts")
        try:
            serve.run(Broken.bind(attempts), name=APP, route_prefix="/broken")
            run.problems.append("serve.run did not raise for a constructor that raises")
        except DeployFailedError as exc:
            run.check(BROKEN_MESSAGE in str(exc),
                      f"the deploy error lacks the user's message: {str(exc)[:300]!r}")
        run.state["attempts"] = self.attempts(run)
        run.notes.append(f"constructor attempts before DEPLOY_FAILED: {run.state['attempts']}")
        return "/broken"

    def attempts(self, run: Run) -> int:
        try:
            with open(run.state["attempts_file"]) as lines:
                return sum(1 for _ in lines)
        except OSError:
            return 0

    def settle(self, run: Run) -> None:
        app = serve.status().applications[APP]
        run.check(app.status.value == "DEPLOY_FAILED",
                  f"the application is {app.status.value}, not DEPLOY_FAILED")
        run.check(BROKEN_MESSAGE in app.message, "status() lacks the user's error message")
        before, after = run.state["attempts"], self.attempts(run)
        run.check(before == MAX_CONSTRUCTOR_FAILURES,
                  f"{before} constructor attempts before DEPLOY_FAILED; expected "
                  f"{MAX_CONSTRUCTOR_FAILURES}")
        run.check(after == before, f"restart storm: {after - before} more constructor attempts "
                                   "after the deployment failed")
        left = run.instance.processes.of_kind(f"replica:{APP}:")
        run.check(not left, f"replica processes still alive: {left}")

    def judge(self, run: Run, counts: Counts) -> None:
        # nothing can serve: every request is answered 503 at once (never a timeout)
        _only(run, counts, {"503"})
        run.check(counts.s503 == counts.sent, f"{counts.s503} of {counts.sent} answered 503")

    def cleanup(self, run: Run) -> None:
        if "folder" in run.state:
            shutil.rmtree(run.state["folder"], ignore_errors=True)


class Overload(Scenario):
    """Offered `factor` x the capacity of a deployment bounded in every dimension."""

    fault = False

    def __init__(self, factor: float) -> None:
        self.factor = factor
        self.name = f"{factor:g}x overload"

    def rate(self, profile: Profile) -> float:
        return self.factor * capped_capacity_rps()

    def phases(self, profile: Profile) -> tuple[float, float]:
        return profile.warmup_s, profile.overload_s

    def deploy(self, run: Run) -> str:
        serve.run(Capped.bind(), name=APP, route_prefix="/capped")
        return "/capped"

    def settle(self, run: Run) -> None:
        live = [r for r in run.replicas() if r["state"] in ("RUNNING", "STARTING", "STANDBY")]
        run.check(len(live) <= CAPPED_MAX_REPLICAS,
                  f"{len(live)} replicas; max_replicas is {CAPPED_MAX_REPLICAS}")
        # the longest an accepted request can wait: the queue budget and a full set of
        # slots ahead of it, drained at capacity, then its own service time
        bound = ((CAPPED_MAX_QUEUED + CAPPED_MAX_REPLICAS * CAPPED_MAX_ONGOING)
                 / capped_capacity_rps() + CAPPED_SERVICE_MS / 1000)
        run.notes.append(f"offered {self.rate(run.profile):.0f}/s against a capacity of "
                         f"{capped_capacity_rps():.0f}/s; an accepted request waits at most "
                         f"~{bound * 1000:.0f} ms in theory")

    def judge(self, run: Run, counts: Counts) -> None:
        # over capacity: 503 at once; accepted: served
        _only(run, counts, {"503"})
        run.check(counts.ok > 0, "nothing was served")
        run.check(counts.s503 > 0, "nothing was rejected although offered load > capacity")


def all_scenarios() -> list[Scenario]:
    return [KillReplica(), KillProxy(), KillController(), HangReplica(), InitRaises(),
            Overload(2), Overload(10)]


# -- the run ------------------------------------------------------------------------------


def run_scenario(scenario: Scenario, profile: Profile) -> Outcome:
    with surge_instance(**scenario.http_options) as instance:
        run = Run(scenario, profile, instance)
        try:
            return _run(run)
        finally:
            scenario.cleanup(run)


def _run(run: Run) -> Outcome:
    scenario, profile, instance = run.scenario, run.profile, run.instance
    path = scenario.deploy(run)
    warm, after = scenario.phases(profile)
    duration = warm + after
    schedule = steady(scenario.rate(profile), duration)
    options = PulseOptions(url=f"{instance.url}{path}", schedule=schedule,
                           timeout_s=profile.timeout_s, connections=profile.connections,
                           max_time_s=duration + profile.timeout_s + 5)

    def baseline() -> None:
        run.before = instance.processes.memory()

    def final() -> None:
        run.after = instance.processes.memory()

    actions = [(warm, "baseline", baseline), (warm, "fault", lambda: scenario.inject(run)),
               (duration - 0.5, "final", final)]
    record, timeline = run_load(options, actions)
    run.problems += timeline.errors
    fault_at = timeline.started_at.get("fault", warm)
    counts = Counts.of(record)
    try:
        scenario.settle(run)
    except Exception as exc:
        run.problems.append(f"checking the aftermath failed: {exc!r}")
    _judge_common(run, counts, record, expected=round(schedule.total), fault_at=fault_at,
                  duration=duration)
    scenario.judge(run, counts)
    ended = error_points(record, by="completion")
    until = None
    if scenario.fault and ended:
        until = round(max(seconds(ended[-1] + 1) - fault_at, 0.0), 1)
    report = build_report(options, record, None, started_at=time.time())
    memory = compare_memory(run.before, run.after)
    new = sorted({p.kind for p in instance.processes.scan() if p not in run.before})
    return Outcome(scenario=scenario.name, counts=counts,
                   p99_ms=report["summary"]["p99_ms"], served_rps=counts.ok / duration,
                   errors_until_s=until, memory=memory, replaced=new, notes=run.notes,
                   problems=run.problems, report=report)


def _judge_common(run: Run, counts: Counts, record: Record, expected: int, fault_at: float,
                  duration: float) -> None:
    run.check(counts.sent == expected, f"sent {counts.sent} of the {expected} scheduled")
    run.check(counts.unanswered == 0, f"{counts.unanswered} requests unanswered")
    run.check(counts.timeout == 0,
              f"{counts.timeout} requests hung (no answer within {run.profile.timeout_s:g} s)")
    run.check(counts.other == 0, f"unexpected outcomes: {counts.by_kind}")
    if run.scenario.fault:
        # a request in flight when the fault hits was sent before it: judge by when
        # failures ended, not when they were sent
        early = [seconds(p) for p in error_points(record, by="completion")
                 if seconds(p + 1) <= fault_at]
        run.check(not early, f"requests failed before the fault (at t={early[:1]} s)")
        tail_from = duration - run.profile.tail_s
        late = [seconds(p) - fault_at for p in error_points(record)
                if seconds(p) >= tail_from]
        run.check(not late, f"not recovered: requests sent {late[:1]} s after the fault "
                            f"still failed (the last {run.profile.tail_s:g} s must all succeed)")
    run.check(run.before, "no baseline memory (the warm-up snapshot did not run)")
    for change in compare_memory(run.before, run.after):
        run.check(abs(change.change) <= RSS_TOLERANCE, f"RSS moved more than "
                                                       f"{RSS_TOLERANCE:.0%}: {change}")
    survivors = [p for p in run.before if p in run.after]
    run.check(survivors or not run.before, "no process survived to compare memory")
