"""The test network itself: the faults it injects are the real thing, and it leaves
nothing behind. A few seconds; no Ray."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from tests.multihost.cluster import in_host
from tests.multihost.conftest import skip_without_namespaces
from tests.multihost.netns import Network

pytestmark = [pytest.mark.multihost, pytest.mark.timeout(60)]

ECHO = """
import socket, threading
server = socket.create_server(("0.0.0.0", 7000))
udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
udp.bind(("0.0.0.0", 7001))
def echo(conn):
    with conn:
        while data := conn.recv(65536):
            conn.sendall(data)
def udp_echo():
    while True:
        data, peer = udp.recvfrom(100)
        udp.sendto(data, peer)
threading.Thread(target=udp_echo, daemon=True).start()
print("ready", flush=True)
while True:
    threading.Thread(target=echo, args=(server.accept()[0],), daemon=True).start()
"""


@pytest.fixture
def net() -> Iterator[Network]:
    skip_without_namespaces()
    with Network(hosts=2) as network:
        server = network.popen(network.hosts[1], [sys.executable, "-c", ECHO],
                               stdout=subprocess.PIPE, text=True)
        assert server.stdout is not None and server.stdout.readline().strip() == "ready"
        yield network


def names(prefix: str) -> str:
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    spaces = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    return "\n".join(line for line in (links + spaces).splitlines() if prefix in line)


def test_a_network_removes_what_it_made_even_when_its_body_fails() -> None:
    skip_without_namespaces()
    with pytest.raises(RuntimeError, match="boom"), Network(hosts=2) as network:
        sleeper = network.popen(network.hosts[0], ["sleep", "600"])
        assert names(network.run_id)
        raise RuntimeError("boom")
    assert sleeper.poll() is not None  # killed with its namespace
    assert names(network.run_id) == ""


def test_a_link_down_is_silence_and_heals_without_a_reset(net: Network) -> None:
    client, server = net.hosts

    def connect() -> socket.socket:
        return socket.create_connection((server.ip, 7000), timeout=1.0)

    with in_host(client, connect) as conn:  # a socket stays in the namespace it was made in
        conn.sendall(b"before")
        assert conn.recv(100) == b"before"
        net.link_down(server)
        conn.sendall(b"during")  # no RST, no FIN: the kernel only retransmits
        with pytest.raises(TimeoutError):
            conn.recv(100)
        with pytest.raises(TimeoutError):  # not refused: nobody answers
            in_host(client, connect)
        net.link_up(server)
        conn.settimeout(10.0)
        assert conn.recv(100) == b"during"  # a retransmission got through


def test_an_impaired_host_gets_its_delay_and_loss(net: Network) -> None:
    client, server = net.hosts
    if reason := net.impairment_unavailable(server):
        pytest.skip(reason)

    def udp_answered(count: int) -> int:
        """Send `count` numbered datagrams at once; how many distinct ones came back."""
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as udp:
            for seq in range(count):
                udp.sendto(str(seq).encode(), (server.ip, 7001))
            udp.settimeout(1.0)
            answers: set[bytes] = set()
            try:
                while len(answers) < count:
                    answers.add(udp.recvfrom(100)[0])
            except TimeoutError:
                pass
            return len(answers)

    def round_trip() -> float:
        """The median of 5 exchanges on one connection."""
        with socket.create_connection((server.ip, 7000), timeout=5) as conn:
            times = []
            for _ in range(5):
                began = time.monotonic()
                conn.sendall(b"x")
                conn.recv(10)
                times.append(time.monotonic() - began)
            return sorted(times)[2]

    assert in_host(client, lambda: udp_answered(50)) == 50
    with net.impaired(server, loss=0.2, delay_s=0.2):
        answered = in_host(client, lambda: udp_answered(200))
        impaired = in_host(client, round_trip)
    assert 120 <= answered <= 185, answered  # 20% of what the server receives is lost
    assert impaired >= 0.2
    assert in_host(client, round_trip) < 0.2  # and nothing of it stays behind
