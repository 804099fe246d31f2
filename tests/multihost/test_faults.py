"""Faults between hosts under load, on a Ray cluster across network namespaces.

h0 runs the Ray head and surge's controller (and a proxy that routes to both workers'
replicas: the head has no CPU for one); h1 and h2 each run one replica and a proxy that
prefers it; h3 runs the clients. Each scenario starts from the whole service, puts a
fault between hosts while closed-loop clients run, and checks what a user of the
service would see: every request ends, the ones that fail say why, routing leaves what
cannot be reached, the service is whole again after the fault, and nothing is left
running where it should not be. The figures each prints are in docs/reliability.md.
"""

from __future__ import annotations

import os
import signal
import statistics
import time

import pytest

from surge.router.dial import UNACKED_TIMEOUT_S
from tests.eventually import eventually
from tests.multihost.cluster import HostsCluster
from tests.multihost.load import Load, Outcome
from tests.multihost.netns import Host

# The first test also waits for the cluster to start (~40-90 s on a busy 2-core machine).
pytestmark = [pytest.mark.multihost, pytest.mark.timeout(300)]

SLACK_S = 4.0  # scheduling on a loaded machine, above the timeouts each check names


def running_replicas(hosts: HostsCluster) -> set[str]:
    return {str(r["replica_id"]) for r in hosts.replicas() if r["state"] == "RUNNING"}


def only_pid(hosts: HostsCluster, host: Host, title: str) -> int:
    pids = [pid for pid, t in hosts.processes(host, title).items() if t == title]
    assert len(pids) == 1, (title, hosts.processes(host))
    return pids[0]


def median_s(outcomes: list[Outcome]) -> float:
    return statistics.median(o.seconds for o in outcomes) if outcomes else 0.0


def test_a_lossy_slow_host_loses_no_request(hosts: HostsCluster) -> None:
    """5% loss and 50 ms of delay on what h1 receives: TCP absorbs it, nothing fails, no
    replica is declared dead over the bad link, and requests that cross it are slower."""
    h0, (h1, _) = hosts.head, hosts.workers
    if reason := hosts.net.impairment_unavailable(h1):
        pytest.skip(reason)
    hosts.wait_serving()
    before = running_replicas(hosts)
    load = Load(hosts, [h0, h1], clients=2)
    with load.running():
        eventually(lambda: load.served(h0) >= 10 and load.served(h1) >= 10, 60,
                   interval_s=0.1, what="the load served")
        with hosts.net.impaired(h1, loss=0.05, delay_s=0.05) as how:
            began = time.monotonic()
            eventually(lambda: load.served(h1, began) >= 30
                       and load.served(h0, began, by=h1.ip) >= 15, 60, interval_s=0.2,
                       what="requests through the impaired host served")
            ended = time.monotonic()
    load.assert_accounted()
    assert not load.failures(), load.failures()[:3]
    assert running_replicas(hosts) == before
    through = load.to(h1, began, ended)
    crossing = [o for o in load.to(h0, began, ended) if o.served_by == h1.ip]
    assert median_s(through) >= 0.05 and median_s(crossing) >= 0.05
    print(f"\nmultihost lossy host ({how}): {load.summary()}; via h1's proxy "
          f"{len(through)} requests, median {median_s(through) * 1000:.0f} ms, max "
          f"{max(o.seconds for o in through) * 1000:.0f} ms; h0 -> h1's replica median "
          f"{median_s(crossing) * 1000:.0f} ms")


def test_the_head_hosts_controller_killed_under_load(hosts: HostsCluster) -> None:
    """SIGKILL the controller: its daemon restarts it, the new one re-attaches to every
    replica and proxy on every host, and the proxies serve throughout."""
    hosts.wait_serving()
    h0 = hosts.head
    before = running_replicas(hosts)
    controller = only_pid(hosts, h0, "surge:controller")
    load = Load(hosts, [h0, *hosts.workers], clients=2)
    with load.running():
        eventually(lambda: all(load.served(h) >= 5 for h in load.targets), 60,
                   interval_s=0.1, what="the load served by every proxy")
        killed = time.monotonic()
        os.kill(controller, signal.SIGKILL)
        eventually(lambda: hosts.processes(h0, "surge:controller").keys() - {controller},
                   60, interval_s=0.1, what="a new controller")
        eventually(lambda: running_replicas(hosts) == before, 60, interval_s=0.2,
                   what="the same replicas re-attached")
        back = time.monotonic() - killed
        after = time.monotonic()
        eventually(lambda: all(load.served(h, after) >= 5 for h in load.targets), 60,
                   interval_s=0.1, what="the load served after the restart")
    load.assert_accounted()
    assert not load.failures(), load.failures()[:3]
    print(f"\nmultihost controller killed: {load.summary()}; re-attached {back:.1f} s "
          "after the kill, no request failed")


def test_a_host_cut_off_and_rejoining(hosts: HostsCluster) -> None:
    """h2's link down (no FIN, no RST): requests in flight on its replica end with a
    500 that says so within the link's unacknowledged-data timeout, routing moves to h1
    once Ray declares h2 dead, h2's processes exit once it is reachable again, and after
    `ray start` there the replacement replica and proxy serve: the service is whole."""
    hosts.wait_serving()
    h0, (h1, h2) = hosts.head, hosts.workers
    old = hosts.processes(h2)
    load = Load(hosts, [h0, h1], clients=3)  # h0's proxy routes to h1's and h2's replicas
    lost = Load(hosts, [h2], clients=1)  # the cut host's own proxy
    with load.running(), lost.running():
        eventually(lambda: load.served(h0, by=h1.ip) >= 5 and load.served(h0, by=h2.ip) >= 5
                   and lost.served(h2) >= 5, 60, interval_s=0.1, what="the load served")
        cut = time.monotonic()
        hosts.net.link_down(h2)
        eventually(lambda: hosts.running_on() == [h1.ip], 60, interval_s=0.2,
                   what="h2's replica gone from the controller's view")
        declared = time.monotonic() - cut
        eventually(lambda: not load.in_flight(h0, started_before=cut + declared),
                   UNACKED_TIMEOUT_S + SLACK_S, interval_s=0.1,
                   what="every request sent before then ended")
        moved = time.monotonic()
        eventually(lambda: load.served(h0, moved, by=h1.ip) >= 10, 30, interval_s=0.1,
                   what="h0's proxy serving from h1 alone")
        healed = time.monotonic()
        hosts.net.link_up(h2)
        eventually(lambda: not old.keys() & hosts.processes(h2).keys(), 60, interval_s=0.2,
                   what="h2's old surge processes gone once it heard it was dead")
        gone = time.monotonic() - healed
        hosts.net.kill_all(h2)  # what is left of Ray there (`ray stop` on that host)
        hosts.ray_worker(h2)  # the host rejoins the cluster
        hosts.wait_serving()
        whole = time.monotonic()
        eventually(lambda: load.served(h0, whole, by=h2.ip) >= 5, 30, interval_s=0.1,
                   what="h0's proxy routing to h2's new replica")
    load.assert_accounted()
    lost.assert_accounted()
    failed = load.failures()
    assert all(o.status == 500 and "died" in o.body for o in failed), failed[:3]
    assert len(failed) <= 3, failed  # at most one per client: what was stuck on h2
    assert not load.failures(h1)  # h1's proxy had its own replica throughout
    slowest = max(o.seconds for o in load.outcomes)
    assert slowest <= UNACKED_TIMEOUT_S + SLACK_S, slowest
    alone = load.to(h0, moved, healed)
    assert alone and all(o.served_by == h1.ip for o in alone), alone[:3]
    after = load.to(h0, moved)
    assert after and all(o.status == 200 for o in after), [o for o in after
                                                            if o.status != 200][:3]
    print(f"\nmultihost host cut off: {load.summary()} (h2's own proxy: {lost.summary()}); "
          f"Ray declared h2 dead {declared:.1f} s after the cut; the slowest request "
          f"took {slowest:.1f} s; h2's processes left {gone:.1f} s after the link came "
          f"back; whole again {whole - healed:.1f} s after it (with `ray start` there)")


def test_shutdown_leaves_no_surge_process_on_any_host(hosts: HostsCluster) -> None:
    """`surge shutdown` on the head stops the replicas, proxies and weight stores on
    every host (Ray itself keeps running, as after Ray Serve's `serve shutdown`)."""
    hosts.wait_serving()
    every = [hosts.head, *hosts.workers]
    assert all(hosts.processes(h) for h in every)
    began = time.monotonic()
    hosts.surge("shutdown", "-y")
    eventually(lambda: not any(hosts.processes(h) for h in every), 60, interval_s=0.2,
               what="no surge process left on any host")
    print(f"\nmultihost shutdown: every surge process on 3 hosts gone "
          f"{time.monotonic() - began:.1f} s after `surge shutdown` began")
