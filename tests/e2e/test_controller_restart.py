"""The controller dies; the data path keeps serving and the restarted one re-attaches.

Also the control API's token: nothing a connection sends is unpickled before it
presents the instance's token.
"""

from __future__ import annotations

import asyncio
import os
import pickle
import signal
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from surge import serve
from surge.api.instance import current
from surge.control_auth import find_token, token_path
from surge.controller.checkpoint import Checkpoint
from surge.errors import ControlAuthError
from surge.serve.config import AuthConfig
from surge.serve.handle import DeploymentHandle
from surge.transport.framing import FrameDecoder, FrameEncoder
from surge.transport.messages import Reply, Rpc
from surge.transport.rpc import connect_rpc
from tests.e2e.conftest import Running, running_instance
from tests.e2e.load import Load
from tests.eventually import eventually

pytestmark = pytest.mark.e2e


@serve.deployment(num_replicas=2)
class Echo:
    def __call__(self, request: object) -> dict[str, int]:
        return {"pid": os.getpid()}

    def double(self, value: int) -> int:
        return value * 2

    def rank(self) -> tuple[str, int]:
        context = serve.get_replica_context()
        return context.replica_id.unique_id, context.rank.rank


@pytest.fixture
def instance() -> Iterator[Running]:
    """A fresh instance per test: each may use up some of its 5 restarts a minute."""
    with running_instance() as running:
        yield running


def replica_pids() -> dict[str, int]:
    instance = current()
    assert instance is not None
    return {r["replica_id"]: r["pid"] for r in instance.call("replicas", timeout=10)
            if r["state"] == "RUNNING"}


def kill_controller() -> int:
    instance = current()
    assert instance is not None and instance.process is not None
    old = instance.process.pid
    os.kill(old, signal.SIGKILL)
    new: int = eventually(lambda: (process := instance.process) is not None
                          and process.pid != old and process.pid, 30,
                          what=f"a controller restarted after pid {old}")
    return new


def serving_after_reattach(load: Load, before: dict[str, int]) -> None:
    """The restarted controller re-attached the live replicas (not restarted them), and
    the load goes on being served after that."""
    eventually(lambda: replica_pids() == before, 10,
               what=f"the live replicas {before} re-attached")
    served = load.outcomes["200"]
    eventually(lambda: load.outcomes["200"] > served, 10,
               what="the load served after the re-attachment")


def test_killed_controller_restarts_and_reattaches_under_load(instance: Running) -> None:
    handle = serve.run(Echo.bind(), name="echo", route_prefix="/echo")
    before = replica_pids()
    assert len(before) == 2
    calls, failures, stop = [0], [], threading.Event()

    def sequential_calls() -> None:  # the blocking fast path, on this thread's own links
        while not stop.is_set():
            try:
                assert handle.double.remote(calls[0]).result(timeout_s=15) == 2 * calls[0]
            except BaseException as exc:
                failures.append(exc)
                return
            calls[0] += 1

    caller = threading.Thread(target=sequential_calls)
    caller.start()
    try:
        with Load(f"{instance.url}/echo") as load:
            eventually(lambda: load.outcomes["200"] > 0, 10, what="the load served")
            kill_controller()
            serving_after_reattach(load, before)  # serving across the restart and re-attachment
            made = calls[0]
            eventually(lambda: calls[0] > made or failures, 10, what="handle calls go on")
    finally:
        stop.set()
        caller.join(30)
    assert not failures and not caller.is_alive(), failures
    assert set(load.outcomes) == {"200"}, load.outcomes
    assert handle.double.remote(21).result(timeout_s=15) == 42
    status = serve.status()
    assert status.applications["echo"].status == "RUNNING"


def test_restarted_controller_keeps_desired_state_and_accepts_deploys(
        instance: Running) -> None:
    serve.run(Echo.bind(), name="echo", route_prefix="/echo")
    kill_controller()
    # The restored deployment is reconciled as before: a changed target applies.
    serve.run(Echo.options(num_replicas=3).bind(), name="echo", route_prefix="/echo")
    assert len(replica_pids()) == 3
    with httpx.Client(timeout=10) as client:
        assert client.get(f"{instance.url}/echo").status_code == 200
    serve.delete("echo")
    assert "echo" not in serve.status().applications


def test_a_restarted_controller_keeps_an_apps_bearer_tokens(instance: Running) -> None:
    token = "restart-test-token-0123456789"
    serve.run(Echo.bind(), name="locked", route_prefix="/locked",
              auth=AuthConfig(tokens=[token]))
    kill_controller()
    serve.run(Echo.options(num_replicas=1).bind(), name="other", route_prefix="/other")
    with httpx.Client(timeout=10) as client:  # the new route table went out to the proxy
        assert client.get(f"{instance.url}/other").status_code == 200
        assert client.get(f"{instance.url}/locked").status_code == 401
        ok = client.get(f"{instance.url}/locked", headers={"authorization": f"Bearer {token}"})
        assert ok.status_code == 200
    serve.delete("locked")
    serve.delete("other")


def test_controller_killed_again_while_it_recovers(instance: Running) -> None:
    serve.run(Echo.bind(), name="echo", route_prefix="/echo")
    before = replica_pids()
    with Load(f"{instance.url}/echo") as load:
        kill_controller()
        kill_controller()  # the second one dies while it waits for members to re-attach
        serving_after_reattach(load, before)
    assert set(load.outcomes) == {"200"}, load.outcomes
    assert serve.status().applications["echo"].status == "RUNNING"


def test_replica_killed_while_controller_is_down_is_replaced(instance: Running) -> None:
    serve.run(Echo.bind(), name="echo", route_prefix="/echo")
    victim_id, victim = sorted(replica_pids().items())[0]
    instance_ = current()
    assert instance_ is not None and instance_.process is not None
    old = instance_.process.pid
    os.kill(old, signal.SIGKILL)
    os.kill(victim, signal.SIGKILL)
    eventually(lambda: len(pids := replica_pids()) == 2 and victim_id not in pids, 30,
               interval_s=0.2, what=f"two RUNNING replicas, {victim_id} (killed) not among them")
    with httpx.Client(timeout=10) as client:
        assert client.get(f"{instance.url}/echo").status_code == 200


def ranks(handle: DeploymentHandle) -> dict[str, int]:
    """Each replica's ReplicaContext.rank, by replica id, asked until both answered."""
    seen: dict[str, int] = {}

    def both() -> bool:
        replica_id, rank = handle.rank.remote().result(timeout_s=10)
        seen[replica_id] = rank
        return len(seen) == 2 and set(seen) == set(replica_pids())

    eventually(both, 30, interval_s=0.05, what="both replicas to say their rank")
    return seen


def test_ranks_survive_a_controller_restart(instance: Running) -> None:
    """The replica re-attached keeps its rank, and the one started for the replica that
    died takes the free rank, not the survivor's."""
    handle = serve.run(Echo.bind(), name="echo", route_prefix="/echo")
    before = ranks(handle)
    assert sorted(before.values()) == [0, 1]
    victim_id = next(r for r, rank in before.items() if rank == 1)
    survivor_id = next(r for r in before if r != victim_id)
    victim = replica_pids()[victim_id]
    instance_ = current()
    assert instance_ is not None and instance_.process is not None
    # the premise: the controller had saved both replicas when it died (killed before
    # its first quiet tick, it would know none of them, and start two more: CI once)
    supervisor = instance_.supervisor
    assert supervisor is not None
    eventually(lambda: set(Checkpoint(supervisor.state_dir).load()[1].replicas) >= set(before),
               10, what="the controller to checkpoint both replicas")
    os.kill(instance_.process.pid, signal.SIGKILL)
    os.kill(victim, signal.SIGKILL)
    eventually(lambda: len(pids := replica_pids()) == 2 and victim_id not in pids, 30,
               interval_s=0.2, what=f"a new replica for {victim_id}")
    after = ranks(handle)
    assert after[survivor_id] == 0
    assert sorted(after.values()) == [0, 1]


def test_control_api_refuses_a_wrong_or_missing_token(instance: Running) -> None:
    address = instance.control_address
    assert find_token(address)  # published for this user by the process that started it
    assert oct(os.stat(token_path(address)).st_mode & 0o777) == "0o600"

    async def connect(token: str) -> None:
        peer = await connect_rpc(address, None, token=token)
        peer.close()

    with pytest.raises(ControlAuthError, match="could not prove"):
        asyncio.run(connect("not-the-token"))
    asyncio.run(connect(find_token(address) or ""))


class _Boom:
    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self) -> tuple[object, tuple[str, str]]:
        return (Path.write_text, (Path(self.path), "unpickled"))  # type: ignore[return-value]


def test_nothing_is_unpickled_before_the_token(instance: Running, tmp_path: Path) -> None:
    driver = current()
    assert driver is not None and driver.process is not None
    controller = driver.process.pid
    marker = tmp_path / "marker"
    payload = pickle.dumps({"role": _Boom(str(marker)), "pid": 1})
    frame = FrameEncoder().encode(Rpc(id=1, method="hello", payload=payload))
    host, _, port = instance.control_address.rpartition(":")
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(frame)
        sock.settimeout(10)
        while sock.recv(65536):  # the refusal, then the controller closes the connection
            pass
    assert not marker.exists()
    # still serving: the same controller (it did not crash and restart) answers
    assert driver.process is not None and driver.process.pid == controller
    serve.status()


def test_an_impostor_on_the_control_port_never_sees_the_token() -> None:
    """Clients prove they know the token without sending it, and make the server prove
    it first: a process that took the port (say, while the controller restarts) learns
    nothing and gets no pickle unpickled by the client."""
    token = "the-real-control-token"
    received = bytearray()
    hung_up = asyncio.Event()

    async def scenario() -> None:
        async def impostor(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            try:
                data = await reader.read(65536)
                received.extend(data)
                (message,) = FrameDecoder().feed(data)
                assert isinstance(message, Rpc)
                fake = Reply(id=message.id, ok=True, payload=b"\0" * 48)  # a guessed proof
                writer.write(FrameEncoder().encode(fake))
                await writer.drain()
                received.extend(await reader.read(65536))  # whatever the client sends next
            finally:
                writer.close()
                hung_up.set()

        server = await asyncio.start_server(impostor, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        with pytest.raises(ControlAuthError, match="could not prove"):
            await connect_rpc(f"127.0.0.1:{port}", None, token=token)
        await asyncio.wait_for(hung_up.wait(), 10)  # the impostor sees the client hang up
        server.close()
        await server.wait_closed()

    asyncio.run(scenario())
    assert received and token.encode() not in received
