"""Random, truncated, oversized and wrongly shaped frames, straight to a replica's Unix
socket and to the controller's TCP port.

Each attack uses its own connection. Afterwards: every surge process is alive, the
steady HTTP client (proxy -> replica) was served throughout, and the replica and the
controller still answer (a handle call goes driver -> controller -> replica).
"""

from __future__ import annotations

import socket
from pathlib import Path

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from surge import serve
from surge.api.instance import current
from surge.transport.framing import MAX_FRAME_BYTES
from surge.transport.messages import (
    Call,
    Cancel,
    HttpRequest,
    HttpStart,
    Push,
    Reply,
    Rpc,
)
from tests.fuzz.conftest import Target
from tests.fuzz.harness import TALLY, bystander_unharmed, examples

FUZZ = settings(max_examples=examples(20), deadline=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture,
                                       HealthCheck.too_slow])
READ_S = 0.3  # how long to listen for the peer's answer or close after an attack


def frame(payload: bytes) -> bytes:
    return len(payload).to_bytes(4, "big") + payload


def encoded(message: object) -> bytes:
    return frame(msgspec.msgpack.encode(message))


def replica_socket() -> str:
    instance = current()
    assert instance is not None
    replicas = instance.call("replicas", timeout=10)
    replica_id = next(r["replica_id"] for r in replicas if r["app"] == "echo")
    for line in Path("/proc/net/unix").read_text().splitlines()[1:]:
        path = line.split()[-1] if len(line.split()) >= 8 else ""
        if path.endswith(f"/{replica_id}.sock"):
            return path
    raise AssertionError(f"no socket for replica {replica_id}")


def attack(address: str | tuple[str, int], data: bytes) -> str:
    """Send `data` and say what the peer did: 'closed', 'answered' or 'waiting'."""
    family = socket.AF_UNIX if isinstance(address, str) else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.settimeout(5)
        sock.connect(address)
        try:
            sock.sendall(data)
        except (BrokenPipeError, ConnectionResetError):
            return "closed"
        sock.settimeout(READ_S)
        try:
            answer = sock.recv(65536)
        except TimeoutError:
            return "waiting"  # a frame still incomplete, or a message with no reply
        except ConnectionResetError:
            return "closed"
        return "answered" if answer else "closed"


INTS = st.integers(-(2**63), 2**64 - 1)  # what msgpack can carry
# Valid msgpack, wrong shapes: unknown tags, wrong field types, wrong arity, scalars.
wrong_shapes = st.one_of(
    st.builds(lambda tag, rest: msgspec.msgpack.encode([tag, *rest]),
              st.integers(-5, 300), st.lists(st.one_of(INTS, st.binary(max_size=20),
                                                       st.text(max_size=10), st.none()),
                                             max_size=6)),
    st.builds(msgspec.msgpack.encode, st.one_of(INTS, st.text(max_size=20),
                                                st.dictionaries(st.text(max_size=5),
                                                                INTS, max_size=3))),
    st.binary(max_size=200),
).map(frame)
truncated = st.builds(lambda payload, cut: frame(payload)[:cut],
                      st.binary(min_size=1, max_size=200), st.integers(1, 200))
oversized = st.integers(MAX_FRAME_BYTES + 1, 2**32 - 1).map(
    lambda size: size.to_bytes(4, "big") + b"x" * 64)
# Well-formed messages a peer should not get, or with nonsense inside.
misplaced = st.one_of(
    st.builds(lambda i, p: encoded(Call(id=i, method="ping", payload=p)),
              st.integers(-(2**63), 2**63 - 1), st.binary(max_size=64)),
    st.builds(lambda i: encoded(Cancel(id=i)), st.integers(-(2**63), 2**63 - 1)),
    st.builds(lambda i, p: encoded(Reply(id=i, ok=True, payload=p)), st.integers(0, 10),
              st.binary(max_size=64)),
    st.builds(lambda t, p: encoded(Push(topic=t, payload=p)),
              st.sampled_from(["load", "load_urgent", "routes", "x"]), st.binary(max_size=64)),
    st.builds(lambda m, p: encoded(Rpc(id=1, method=m, payload=p)),
              st.sampled_from(["status", "hello", "authenticate", "nope"]),
              st.binary(max_size=64)),
    st.builds(lambda s: encoded(HttpStart(id=1, status=s, headers=[], body=b"", more=False)),
              st.integers(0, 999)),
    st.builds(lambda path, headers: encoded(HttpRequest(
        id=7, method="GET", path=path, query=b"", headers=headers, body=b"", client="x",
        route_prefix="/echo", request_id="fuzz")),
        st.text(max_size=30), st.lists(st.tuples(st.binary(max_size=10),
                                                 st.binary(max_size=10)), max_size=3)),
)
FRAMES = {"random bytes": st.binary(min_size=1, max_size=512), "wrong shapes": wrong_shapes,
          "truncated frames": truncated, "oversized frames": oversized,
          "misplaced messages": misplaced}


def still_serving() -> None:
    assert serve.get_app_handle("echo").ping.remote(41).result(timeout_s=15) == 42


@pytest.mark.parametrize("peer", ["replica", "controller"])
@pytest.mark.parametrize("kind", list(FRAMES))
def test_hostile_frames(target: Target, peer: str, kind: str) -> None:
    if peer == "replica":
        address: str | tuple[str, int] = replica_socket()
    else:
        host, _, port = target.control_address.rpartition(":")
        address = (host, int(port))

    @FUZZ
    @given(data=FRAMES[kind])
    def run(data: bytes) -> None:
        TALLY.add(f"frames to the {peer}: {kind}", attack(address, data))

    with bystander_unharmed(target.steady, target.pids):
        run()
        still_serving()


def test_oversized_frame_is_refused_at_once(target: Target) -> None:
    # The declared size alone is enough: the peer closes without buffering anything.
    for address in (replica_socket(), tuple(target.control_address.rsplit(":", 1))):
        if isinstance(address, tuple):
            address = (address[0], int(address[1]))
        # "closed", not "waiting": the peer hung up within attack()'s short read
        assert attack(address, (MAX_FRAME_BYTES + 1).to_bytes(4, "big")) == "closed"
    still_serving()


def test_replica_closes_a_connection_that_sends_what_routers_never_send(target: Target
                                                                        ) -> None:
    # Found by fuzzing: a replica ignored such frames and kept the connection open,
    # so a confused or hostile peer could sit on it unnoticed.
    socket_path = replica_socket()
    for message in (Reply(id=1, ok=True, payload=b""), Push(topic="load", payload=b"x"),
                    HttpStart(id=1, status=200, headers=[], body=b"", more=False)):
        assert attack(socket_path, encoded(message)) == "closed"
    still_serving()
