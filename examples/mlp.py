"""A small real model behind surge: a numpy MLP with an accelerator-like batch latency.

`surge run examples.mlp:app --route-prefix /mlp`, then

    curl -d '{"features": [0.1, 0.2, ...64 numbers]}' http://127.0.0.1:8000/mlp

The model is a 64 -> 256 -> 256 -> 10 multilayer perceptron whose weights ship with the
repository (examples/mlp_weights.npz, from examples/make_mlp_weights.py), loaded with
`weights.load`: the first replica on the machine copies them into the node's weight
store, every later one (the pulse's scale-up, a standby) maps that one copy read-only
in about a millisecond (docs/weights.md). Requests are
gathered with `@serve.batch`; each batch costs its CPU (a few tens of microseconds)
plus a simulated accelerator latency (`accelerator_ms`, default 20 ms, awaited so the
CPU stays free), so a replica's throughput is bounded by batches per second, as on a
GPU, and adding replicas adds capacity even on a 2-core machine.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

import numpy as np

from surge import serve, weights

WEIGHTS = Path(__file__).resolve().parent / "mlp_weights.npz"
FEATURES = 64
# One batch at a time, like one GPU. A batch closes BATCH_WAIT_S after its first request
# even while the accelerator is still busy with the previous one (Ray's @serve.batch does
# the same), so the wait must be about the accelerator time for batches to fill: a
# replica then serves up to MAX_BATCH per accelerator time (~400 requests/s).
MAX_BATCH = 8
BATCH_WAIT_S = 0.02
ACCELERATOR_MS = float(os.environ.get("SURGE_DEMO_ACCELERATOR_MS", "20"))


def load_layers(path: Path = WEIGHTS) -> list[tuple[np.ndarray, np.ndarray]]:
    """The layers, zero-copy from the node's weight store (read-only arrays)."""
    tensors = weights.load("mlp", path)
    count = len([name for name in tensors if name.startswith("w")])
    return [(tensors[f"w{i}"], tensors[f"b{i}"]) for i in range(count)]


def forward(layers: list[tuple[np.ndarray, np.ndarray]], x: np.ndarray) -> np.ndarray:
    """ReLU hidden layers, softmax output; x has shape (batch, 64)."""
    for weight, bias in layers[:-1]:
        x = np.maximum(x @ weight + bias, 0.0)
    weight, bias = layers[-1]
    logits = x @ weight + bias
    logits -= logits.max(axis=1, keepdims=True)
    exp = np.exp(logits)
    probabilities: np.ndarray = exp / exp.sum(axis=1, keepdims=True)
    return probabilities


@serve.deployment(
    # room for one batch on the accelerator and the next one filling
    max_ongoing_requests=2 * MAX_BATCH,
    autoscaling_config={"min_replicas": 1, "max_replicas": 8,
                        "target_ongoing_requests": MAX_BATCH},
)
class MLP:
    def __init__(self, accelerator_ms: float = ACCELERATOR_MS) -> None:
        self.layers = load_layers()
        self.accelerator_s = accelerator_ms / 1000

    @serve.batch(max_batch_size=MAX_BATCH, batch_wait_timeout_s=BATCH_WAIT_S)
    async def predict(self, rows: list[np.ndarray]) -> list[dict[str, Any]]:
        probabilities = forward(self.layers, np.stack(rows))
        await asyncio.sleep(self.accelerator_s)  # the accelerator works; the CPU is free
        best = probabilities.argmax(axis=1)
        return [{"class": int(c), "p": round(float(p[c]), 4)}
                for c, p in zip(best, probabilities, strict=True)]

    async def __call__(self, request: Any) -> dict[str, Any]:
        body = await request.json()
        features = np.asarray(body["features"], dtype=np.float32)
        if features.shape != (FEATURES,):
            return {"error": f"expected {FEATURES} features, got shape {features.shape}"}
        result: dict[str, Any] = await self.predict(features)
        return result


def example_body(seed: int = 0) -> str:
    """A JSON request body with 64 features."""
    values = np.random.default_rng(seed).standard_normal(FEATURES).round(3)
    return '{"features": [' + ", ".join(f"{v:g}" for v in values) + "]}"


app = MLP.bind()
