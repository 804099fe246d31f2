"""surge demo: a traffic pulse against a small real model, with autoscaling and a report.

Run with `make demo`. It starts surge on this machine (controller, HTTP proxy, replica
processes; everything on 127.0.0.1), deploys examples/mlp.py (a numpy MLP, ~20 ms of
simulated accelerator time per batch, its weights mapped from the node's weight store,
so every replica after the first shares one copy) with the proactive autoscaling policy
(1 to 8 replicas), then runs `surge pulse`: 100 requests/s for 5 s, a ramp to 2,000
requests/s in 500 ms, 20 s at the peak, back down. It prints the live progress, the
summary table and the path of the HTML report, and shuts everything down.

Environment: SURGE_DEMO_PORT (HTTP, default 8000), SURGE_ADDRESS (control address,
default 127.0.0.1:52800), SURGE_DEMO_PEAK (default 2000), SURGE_DEMO_HOLD_S (default
20), SURGE_DEMO_ACCELERATOR_MS (default 20), SURGE_DEMO_OUT (default reports/demo).
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
# ERROR: keeps shutdown chatter (the proxy noting each replica it loses) out of the demo
os.environ.setdefault("SURGE_LOG_LEVEL", "ERROR")

from examples.mlp import MLP, example_body  # noqa: E402
from surge import serve  # noqa: E402

PORT = int(os.environ.get("SURGE_DEMO_PORT", "8000"))
PEAK = os.environ.get("SURGE_DEMO_PEAK", "2000")
HOLD_S = os.environ.get("SURGE_DEMO_HOLD_S", "20")
OUT = Path(os.environ.get("SURGE_DEMO_OUT", str(ROOT / "reports" / "demo")))


def _check(url: str, body: str) -> dict[str, object]:
    request = urllib.request.Request(url, data=body.encode(),
                                     headers={"content-type": "application/json"})
    with urllib.request.urlopen(request, timeout=10) as response:
        answer: dict[str, object] = json.loads(response.read())
    return answer


def _allow_connections(wanted: int) -> int:
    """Raise this process's descriptor limit (surge's processes inherit it); how many
    client connections the pulse may then open without starving the proxy."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = 2 * wanted + 256
    if soft != resource.RLIM_INFINITY and soft < target:
        soft = target if hard == resource.RLIM_INFINITY else min(target, hard)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    return wanted if soft == resource.RLIM_INFINITY else min(wanted, (soft - 256) // 2)


def _replicas() -> str:
    deployment = serve.status().applications["mlp"].deployments["MLP"]
    return ", ".join(f"{n} {state}" for state, n in sorted(deployment.replica_states.items()))


def main() -> int:
    started = time.monotonic()
    # The first second of the pulse queues ~1,000 requests: let each have a connection.
    connections = _allow_connections(4000)
    print(f"starting surge (controller, HTTP proxy on 127.0.0.1:{PORT}, replicas) ...",
          flush=True)
    serve.start(http_options={"port": PORT})
    try:
        serve.run(MLP.bind(), name="mlp", route_prefix="/mlp")
        url = f"http://127.0.0.1:{PORT}/mlp"
        body = example_body()
        print(f"  MLP deployed in {time.monotonic() - started:.1f} s; replicas: {_replicas()}")
        print(f"  POST {url} -> {_check(url, body)}")
        command = [sys.executable, "-m", "surge.cli.main", "pulse", url, "-X", "POST",
                   "-H", "content-type: application/json", "--body", body,
                   "--baseline", "100", "--peak", PEAK, "--baseline-s", "5", "--ramp", "0.5",
                   "--hold", HOLD_S, "--after", "5", "--slo-ms", "100",
                   "--connections", str(connections), "--out", str(OUT)]
        control = os.environ.get("SURGE_ADDRESS")
        if control:
            command += ["--surge-address", control]
        print(f"\nsurge pulse {url} -X POST --body '{{\"features\": [...]}}' --baseline 100 "
              f"--peak {PEAK} --ramp 0.5 --hold {HOLD_S} --slo-ms 100 --connections "
              f"{connections} --out {OUT}\n",
              flush=True)
        code = subprocess.call(command)
        print(f"\nreplicas after the pulse: {_replicas()}")
    finally:
        serve.shutdown()
    print(f"shut down; no surge process is left running. {time.monotonic() - started:.0f} s "
          "in all.")
    if code == 0:
        print(f"open {OUT / 'report.html'} for the plots.")
    return code


if __name__ == "__main__":
    sys.exit(main())
