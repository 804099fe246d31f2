"""Write seeded sample traces in the published formats, for the benchmarks (and for
`surge pulse` once it replays traces): nothing is downloaded at run time; a user's real
files read the same way (surge.loadtest.traces.read_trace).

    python scripts/make_sample_traces.py [--out traces/] [--requests 2000] [--rate 20] \
        [--mooncake-mix system_prompts|conversations]

Writes `mooncake_shaped.jsonl` (Mooncake's JSON Lines, >= 50% block reuse: by default
conversations over shared system prompts; `--mooncake-mix conversations`: the mix of
Mooncake's FAST'25 conversation and synthetic traces, most reuse a conversation's own
turns) and `burstgpt_shaped.csv` (BurstGPT's CSV: gamma burstiness 0.25, log-normal
lengths); see src/surge/loadtest/traces.py.
"""

from __future__ import annotations

import argparse
import random
from pathlib import Path

from surge.loadtest.traces import (
    MOONCAKE_MIXES,
    block_reuse,
    burstgpt_shaped,
    mooncake_shaped,
    write_burstgpt,
    write_mooncake,
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("traces"))
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--rate", type=float, default=20.0, help="requests/s on average")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--mooncake-mix", choices=MOONCAKE_MIXES, default=MOONCAKE_MIXES[0])
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    moon = mooncake_shaped(args.requests, args.rate, random.Random(args.seed),
                          mix=args.mooncake_mix)
    write_mooncake(moon, args.out / "mooncake_shaped.jsonl")
    burst = burstgpt_shaped(args.requests, args.rate, random.Random(args.seed + 1))
    write_burstgpt(burst, args.out / "burstgpt_shaped.csv")
    print(f"{args.out / 'mooncake_shaped.jsonl'}: {len(moon)} requests over "
          f"{moon[-1].at_s:.0f} s, block reuse {block_reuse(moon):.0%}")
    print(f"{args.out / 'burstgpt_shaped.csv'}: {len(burst)} requests over "
          f"{burst[-1].at_s:.0f} s")


if __name__ == "__main__":
    main()
