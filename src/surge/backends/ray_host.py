"""The Ray actor that hosts one surge process (a replica or a proxy) on its node.

Ray places the actor (num_cpus, num_gpus, custom resources), so the process lands on
a node with room; the actor then starts `python -m surge.replica` (or `surge.proxy`) as
its child with CUDA_VISIBLE_DEVICES set to the GPUs Ray assigned, and hands it its spec
(surge.launch) with the node's id and IP and the actor as its parent, so that the child
dies with the actor (a killed actor, a lost node). The child is the same program, with
the same process title, as on the local backend: Ray is never on the request path.

`wait()` resolves when the child exits (its exit code); the backend watches that one
object per process (`ray.wait`, no polling of the actor), and an actor that dies makes
it raise instead. The actor is detached and named, so it outlives a controller that
crashes and a restarted controller finds it by name. A live controller kills the actor
as soon as it sees the child's exit; an actor still there ORPHAN_EXIT_S later has no
controller, and leaves by itself, so a dead replica does not hold its GPU forever.

One host per node also runs the node's weight store (surge.weights): the host of the
first replica on a node whose spec asks for its node's store (`NodeWeightStore`)
creates, or finds, the detached actor `<instance>/weights/<node id>` pinned to its node,
has it start `surge.weights` on a socket it binds first (so the replica can connect at
once), and hands the replica that socket's path. `start` is idempotent, so hosts racing
for one node's store start one.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from typing import Any

import msgspec

from surge.control_auth import TOKEN_ENV
from surge.launch import (
    ORPHAN_TIMEOUT_S,
    Lifetime,
    NodeWeightStore,
    ProxyProcessSpec,
    ReplicaProcessSpec,
    WeightStoreProcessSpec,
    encode,
    start_process,
)
from surge.weights.node import bind_store_socket

Launch = ReplicaProcessSpec | ProxyProcessSpec | WeightStoreProcessSpec

__all__ = ["ProcessHost"]

ORPHAN_EXIT_S = 30.0


class ProcessHost:
    """Wrapped with ray.remote by the backend; every method runs on the actor's loop."""

    def __init__(self) -> None:
        self.process: subprocess.Popen[bytes] | None = None
        self.info: dict[str, Any] = {}
        self.failure: BaseException | None = None
        self.started: asyncio.Event | None = None  # made on the actor's loop

    async def start(self, module: str, spec: bytes, env: dict[str, str]) -> dict[str, Any]:
        """Start the child (from the event loop's thread: it outlives every call, so the
        child's parent-death signal fires only when the actor itself dies). If it cannot
        be started, `wait` and `describe` raise the reason instead of waiting forever."""
        if self.process is not None and self.process.poll() is None:
            return self.info  # a node's store, asked for by a second replica's host
        try:
            launch = msgspec.json.decode(spec, type=Launch)
            if isinstance(launch, ReplicaProcessSpec) and isinstance(launch.weight_store,
                                                                     NodeWeightStore):
                launch = await self._with_node_store(launch, launch.weight_store)
            self.info = self._start(module, launch, env)
        except BaseException as exc:
            self.failure = exc
            raise
        finally:
            self._started().set()
        asyncio.get_running_loop().create_task(self._leave_when_orphaned())
        return self.info

    async def _with_node_store(self, launch: ReplicaProcessSpec,
                               store: NodeWeightStore) -> ReplicaProcessSpec:
        """The replica's spec naming its node's store, started first if need be (None,
        so that it loads privately, if the store cannot be had)."""
        import ray
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        context = ray.get_runtime_context()
        node = context.get_node_id()
        path = store.socket_path(node)
        spec = WeightStoreProcessSpec(options=store.options, socket_path=path, node_id=node,
                                      lifetime=Lifetime(orphan_timeout_s=ORPHAN_TIMEOUT_S),
                                      logging=launch.logging)
        try:
            host: Any = ray.remote(ProcessHost).options(
                name=f"{store.instance}/weights/{node}", namespace=context.namespace,
                lifetime="detached", get_if_exists=True, max_restarts=0, num_cpus=0,
                scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False)).remote()
            await host.start.remote("surge.weights", encode(spec), {})
        except Exception as exc:  # Ray's errors, or the store's: serve without it
            print(f"surge: no weight store on node {node[:12]} ({exc!r}); replicas there "
                  "load weights privately", file=sys.stderr, flush=True)
            return msgspec.structs.replace(launch, weight_store=None)
        return msgspec.structs.replace(launch, weight_store=path)

    def _start(self, module: str, launch: Launch, env: dict[str, str]) -> dict[str, Any]:
        import ray

        context = ray.get_runtime_context()
        node_ip = str(ray.util.get_node_ip_address())  # type: ignore[no-untyped-call]
        lifetime = msgspec.structs.replace(launch.lifetime, parent_pid=os.getpid())
        full = {**{k: v for k, v in os.environ.items() if k != TOKEN_ENV}, **env}
        gpus = [str(gpu) for gpu in ray.get_gpu_ids()]
        if gpus:
            full["CUDA_VISIBLE_DEVICES"] = ",".join(gpus)
        argv = [sys.executable, "-m", module]
        if isinstance(launch, WeightStoreProcessSpec):
            listener = bind_store_socket(launch.socket_path)
            try:
                placed_store = msgspec.structs.replace(
                    launch, node_id=context.get_node_id(), lifetime=lifetime,
                    listen_fd=listener.fileno())
                self.process = start_process(argv, encode(placed_store), full,
                                             pass_fds=(listener.fileno(),))
            finally:
                listener.close()
            return {"pid": self.process.pid, "node_id": context.get_node_id(),
                    "node_ip": node_ip, "gpus": gpus, "store": True}
        placed = msgspec.structs.replace(launch, node_id=context.get_node_id(),
                                         node_ip=node_ip, lifetime=lifetime)
        self.process = start_process(argv, encode(placed), full)
        return {"pid": self.process.pid, "node_id": context.get_node_id(), "node_ip": node_ip,
                "gpus": gpus}

    async def wait(self) -> int:
        """The child's exit code, once it exits (calls may arrive before `start` ran)."""
        await self._started().wait()
        if self.process is None:
            raise RuntimeError(f"the process was not started: {self.failure!r}")
        return await asyncio.get_running_loop().run_in_executor(None, self.process.wait)

    async def describe(self) -> dict[str, Any]:
        await self._started().wait()
        if self.process is None:
            raise RuntimeError(f"the process was not started: {self.failure!r}")
        return self.info

    def _started(self) -> asyncio.Event:
        if self.started is None:
            self.started = asyncio.Event()
        return self.started

    async def signal(self, signum: int) -> None:
        if self.process is not None and self.process.poll() is None:
            try:
                self.process.send_signal(signum)
            except ProcessLookupError:
                pass

    async def _leave_when_orphaned(self) -> None:
        assert self.process is not None
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, self.process.wait)
        if not self.info.get("store"):  # a store's host goes at once: the next replica
            await asyncio.sleep(ORPHAN_EXIT_S)  # on its node makes a new one
        os._exit(0)
