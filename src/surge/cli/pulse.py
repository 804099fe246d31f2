"""`surge pulse`: an open-loop pulse load test of a URL, and its report (surge.loadtest)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

__all__ = ["add_parser", "pulse_command"]


def add_parser(commands: Any) -> None:
    pulse = commands.add_parser(
        "pulse", help="open-loop pulse load test of a URL, with a report",
        description="Send requests at scheduled times (baseline -> ramp -> peak -> back), "
                    "whatever the server does, and write DIR/report.json, "
                    "DIR/report.html and PNG plots. Exits 0 when the run completed.")
    pulse.add_argument("url", nargs="?", help="http://host:port/path to load")
    pulse.add_argument("--scenario", metavar="FILE",
                       help="YAML with these options and a `schedule` (flags win)")
    shape = pulse.add_argument_group("schedule (a pulse)")
    shape.add_argument("--baseline", type=float, metavar="RPS", help="baseline requests/s")
    shape.add_argument("--peak", type=float, metavar="RPS", help="peak requests/s")
    shape.add_argument("--baseline-s", type=float, metavar="S",
                       help="seconds at the baseline before the ramp (default 5)")
    shape.add_argument("--ramp", type=float, metavar="S", help="ramp up seconds (default 0.5)")
    shape.add_argument("--hold", type=float, metavar="S", help="seconds at the peak (default 20)")
    shape.add_argument("--ramp-down", type=float, metavar="S",
                       help="ramp down seconds (default: --ramp)")
    shape.add_argument("--after", type=float, metavar="S",
                       help="seconds at the baseline after (default: --baseline-s)")
    traffic = pulse.add_argument_group("traffic")
    traffic.add_argument("--arrivals", choices=("uniform", "poisson"),
                         help="evenly spaced or Poisson arrivals (default uniform)")
    traffic.add_argument("--seed", type=int, help="random seed for poisson (default 0)")
    traffic.add_argument("-X", "--method", help="HTTP method (default GET)")
    traffic.add_argument("--body", help="request body, or @FILE; {seq} becomes the request "
                                        "number")
    traffic.add_argument("-H", "--header", action="append", metavar="'NAME: VALUE'",
                         help="request header (repeatable)")
    llm = pulse.add_argument_group("LLM endpoints (OpenAI API, streamed)")
    llm.add_argument("--preset", choices=("chat", "completions"),
                     help="streamed /v1/chat/completions or /v1/completions requests; "
                          "the report adds TTFT, ITL and tokens/s")
    llm.add_argument("--model", help="the request's model (default: the server's only one)")
    llm.add_argument("--prompt-words", metavar="LOW:HIGH",
                     help="prompt length in words, uniform (default 16:64)")
    llm.add_argument("--max-tokens", metavar="LOW:HIGH",
                     help="max_tokens, uniform (default 16:64)")
    llm.add_argument("--trace", metavar="FILE",
                     help="replay a Mooncake .jsonl or BurstGPT .csv trace: its arrival "
                          "times, prompt lengths (shared prefixes kept) and output lengths "
                          "(implies --preset chat; scripts/make_sample_traces.py writes "
                          "samples)")
    llm.add_argument("--trace-speed", type=float, metavar="X",
                     help="replay the trace X times faster (default 1)")
    llm.add_argument("--goodput", nargs="+", metavar="METRIC:MS",
                     help="objectives a good stream meets, as vllm bench serve's: any of "
                          "ttft, tpot, e2el in ms (e.g. --goodput ttft:500 tpot:50); the "
                          "report adds good streams and request_goodput")
    limits = pulse.add_argument_group("limits and measurement")
    limits.add_argument("--slo-ms", type=float, help="latency SLO for the p99 (default 100)")
    limits.add_argument("--timeout", type=float, metavar="S",
                        help="per-request timeout from its scheduled time (default 10)")
    limits.add_argument("--connections", type=int, help="open connections at most (default 1024)")
    limits.add_argument("--max-time", type=float, metavar="S",
                        help="bound on the whole run, draining included")
    limits.add_argument("--workers", type=int, help="generator processes (default 1)")
    out = pulse.add_argument_group("output")
    out.add_argument("--out", metavar="DIR", help="report directory (default reports/pulse-TIME)")
    out.add_argument("--surge-address", metavar="HOST:PORT",
                     help="surge control address, to sample replica counts (default: "
                          "SURGE_ADDRESS, else 127.0.0.1:52800, if that instance serves URL)")
    out.add_argument("--quiet", action="store_true", help="no live progress line")
    out.add_argument("--compare", nargs="+", metavar="REPORT",
                     help="compare report.json files side by side instead of running")


def _pulse_options(args: argparse.Namespace) -> Any:
    from surge.loadtest.options import PulseOptions, load_scenario, parse_header
    from surge.loadtest.schedule import pulse

    values: dict[str, Any] = load_scenario(args.scenario) if args.scenario else {}
    if args.baseline is not None or args.peak is not None:
        if args.baseline is None or args.peak is None:
            raise ValueError("give both --baseline and --peak")
        shape = {"baseline_s": args.baseline_s, "ramp_s": args.ramp, "hold_s": args.hold,
                 "ramp_down_s": args.ramp_down, "after_s": args.after}
        values["schedule"] = pulse(args.baseline, args.peak,
                                   **{k: v for k, v in shape.items() if v is not None})
    trace = {"trace": args.trace, "trace_speed": args.trace_speed}
    if (args.goodput or any(v is not None for v in trace.values())) and not args.preset:
        args.preset = (values["llm"].kind if values.get("llm") is not None else "chat")
    body = args.body
    if body is not None:
        values["body"] = (Path(body[1:]).read_bytes() if body.startswith("@")
                          else body.encode())
    if args.header:
        values["headers"] = tuple(parse_header(h) for h in args.header)
    if args.preset or args.model or args.prompt_words or args.max_tokens:
        from surge.loadtest.llm import LLMPreset

        base = values["llm"].to_spec() if values.get("llm") is not None else {}
        given = {"kind": args.preset, "model": args.model, "prompt_words": args.prompt_words,
                 "max_tokens": args.max_tokens, "goodput": args.goodput, **trace}
        values["llm"] = LLMPreset.from_spec({**base, **{k: v for k, v in given.items()
                                                       if v is not None}})
    llm = values.get("llm")
    if llm is not None and llm.requests and "schedule" not in values:
        values["schedule"] = llm.trace_schedule()  # the trace's own arrivals
    if "schedule" not in values:
        raise ValueError("give --baseline RPS and --peak RPS (or a --scenario with a "
                         "schedule, or a --trace)")
    flags = {"url": args.url, "arrivals": args.arrivals, "seed": args.seed,
             "method": args.method, "slo_ms": args.slo_ms, "timeout_s": args.timeout,
             "connections": args.connections, "max_time_s": args.max_time,
             "workers": args.workers, "surge_address": args.surge_address}
    values.update({k: v for k, v in flags.items() if v is not None})
    if not values.get("url"):
        raise ValueError("give the URL to load (or `url:` in the scenario)")
    return PulseOptions(**values)


def pulse_command(args: argparse.Namespace) -> int:
    import time

    from surge.loadtest.report import (
        compare_table,
        load_report,
        summary_table,
        write_compare,
        write_report,
    )

    if args.compare:
        reports = [load_report(path) for path in args.compare]
        names = [Path(p).parent.name or Path(p).stem for p in args.compare]
        if len(set(names)) < len(names):
            names = list(args.compare)
        print(compare_table(reports, names))
        if args.out:
            paths = write_compare(reports, names, args.out)
            print(f"\ncomparison: {paths['html']}")
        return 0
    from surge.loadtest.runner import run_pulse

    try:
        options = _pulse_options(args)
    except (ValueError, OSError) as exc:
        print(f"surge pulse: {exc}", file=sys.stderr)
        return 2
    out = Path(args.out or f"reports/pulse-{time.strftime('%Y%m%d-%H%M%S')}")
    try:
        result = run_pulse(options, quiet=args.quiet)
    except RuntimeError as exc:  # a worker process died: there is no whole run to report
        print(f"surge pulse: {exc}", file=sys.stderr)
        return 1
    paths = write_report(result.report, out)
    print(summary_table(result.report))
    print(f"\nreport: {paths['html'].resolve()}\n        {paths['json'].resolve()}")
    return 0
