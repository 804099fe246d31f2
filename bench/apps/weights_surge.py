"""The weight-loading app on surge: `python weights_surge.py --mode store|file --model PATH
--port PORT [--autoscale]`.

Each replica's constructor loads every tensor of the model, with `weights.load` from the
node's store (`store`) or with `safetensors.numpy.load_file` into its own memory
(`file`), then reads one byte of every page (so its pages are mapped, as a first
forward pass would), and prints `WEIGHTS pid=... load_s=... touch_s=... hit=...
load_cpu_s=...` on stderr (load_cpu_s: the constructor thread's CPU time for the load).
A request sleeps 40 ms (max_ongoing_requests 4: ~100 requests/s a replica).

Without --autoscale: one replica, READY, then `SCALE n` (redeploy with n replicas; prints
`SCALED t`) and `STOP` on stdin. With --autoscale (min 1, max 8 replicas, target 2
ongoing): READY once the first replica serves, then `REPLICAS wall running target`
every 100 ms until SIGTERM or STOP.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sys
import threading
import time
from typing import Any

import numpy as np

from surge import serve

PAGE = 4096


@serve.deployment(max_ongoing_requests=4)
class Model:
    def __init__(self, mode: str, path: str) -> None:
        started, cpu = time.monotonic(), time.thread_time()
        hit, materialise_s = False, 0.0
        if mode == "store":
            from surge import weights

            loaded = weights.load("bench-model", path)
            self.tensors: dict[str, np.ndarray] = dict(loaded)
            self.weights = loaded
            hit, materialise_s = loaded.info.hit, loaded.info.materialise_s
        else:
            from safetensors.numpy import load_file

            self.tensors = load_file(path)
        loaded_at, load_cpu = time.monotonic(), time.thread_time() - cpu
        touched = 0
        for array in self.tensors.values():
            touched += int(array.reshape(-1).view(np.uint8)[::PAGE].sum())
        done = time.monotonic()
        print(f"WEIGHTS pid={os.getpid()} mode={mode} load_s={loaded_at - started:.6f} "
              f"touch_s={done - loaded_at:.6f} hit={hit} materialise_s={materialise_s:.6f} "
              f"load_cpu_s={load_cpu:.6f} tensors={len(self.tensors)} checksum={touched}",
              file=sys.stderr, flush=True)

    async def __call__(self, request: Any) -> str:
        await asyncio.sleep(0.04)
        return "ok"


# Ray's default policy, tuned for bursts (as bench/autoscale_step.py's ray_tuned): surge's
# proactive policy would size for the baseline's own cold start projected over the first
# replica's start-up (seconds with a 2 GiB model), and scale to 8 before the step.
AUTOSCALING = {"min_replicas": 1, "max_replicas": 8, "target_ongoing_requests": 2,
               "upscale_delay_s": 0, "metrics_interval_s": 0.5, "look_back_period_s": 2,
               "upscaling_factor": 2, "policy": {"policy_function": "ray_default"}}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mode", choices=("store", "file"), required=True)
    parser.add_argument("--model", required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--autoscale", action="store_true")
    parser.add_argument("--max-replicas", type=int, default=8)
    args = parser.parse_args()
    serve.start(http_options={"host": "127.0.0.1", "port": args.port},
                weight_store=args.mode == "store")
    app = Model.bind(args.mode, args.model)
    if args.autoscale:
        scaling = {**AUTOSCALING, "max_replicas": args.max_replicas}
        app = Model.options(autoscaling_config=scaling).bind(args.mode, args.model)
    serve.run(app, name="weights", route_prefix="/model")
    print(f"READY http://127.0.0.1:{args.port}/model", flush=True)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    if args.autoscale:
        threading.Thread(target=lambda: (sys.stdin.read(), stop.set()), daemon=True).start()
        while not stop.is_set():
            overview = serve.status().applications["weights"].deployments["Model"]
            running = overview.replica_states.get("RUNNING", 0)
            print(f"REPLICAS {time.time():.3f} {running} {overview.target_replicas}",
                  flush=True)
            stop.wait(0.1)
    else:
        for line in sys.stdin:
            command = line.split()
            if command and command[0] == "SCALE":
                print(f"T_SCALE {time.time():.6f}", flush=True)
                serve.run(Model.options(num_replicas=int(command[1])).bind(
                    args.mode, args.model), name="weights", route_prefix="/model")
                print(f"SCALED {time.time():.6f}", flush=True)
            elif command and command[0] == "STOP":
                break
    serve.shutdown()


if __name__ == "__main__":
    main()
