"""Regenerate examples/mlp_weights.npz (committed): `python examples/make_mlp_weights.py`.

A 64 -> 256 -> 256 -> 10 multilayer perceptron with He-initialised float32 weights
from a fixed seed, so every checkout serves the same model without a download.
"""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np

SEED = 20240601
SIZES = (64, 256, 256, 10)
OUT = Path(__file__).resolve().parent / "mlp_weights.npz"


def main() -> None:
    rng = np.random.default_rng(SEED)
    arrays: dict[str, np.ndarray] = {}
    for index, (fan_in, fan_out) in enumerate(itertools.pairwise(SIZES)):
        scale = np.sqrt(2.0 / fan_in)
        arrays[f"w{index}"] = (rng.standard_normal((fan_in, fan_out)) * scale).astype(np.float32)
        arrays[f"b{index}"] = (rng.standard_normal(fan_out) * 0.01).astype(np.float32)
    np.savez(OUT, **arrays)
    print(f"wrote {OUT} ({OUT.stat().st_size:,} bytes)")


if __name__ == "__main__":
    main()
