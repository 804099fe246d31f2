"""`surge run | deploy | status | shutdown | build | config | pulse | simulate`.

Operate (run, deploy, status, shutdown), write and check configs (build, config lint),
load-test and rehearse (pulse, simulate).

Every command that talks to a running instance finds it at `--address`, else
SURGE_ADDRESS, else 127.0.0.1:52800. `surge pulse` loads any HTTP URL (see
surge.loadtest) and finds the surge instance behind it at `--surge-address`.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
from pathlib import Path
from typing import Any

from surge.backends.choice import BACKENDS
from surge.cli import config_cmds as _config_cmds
from surge.cli.simulate import add_parser as _simulate_parser
from surge.cli.simulate import simulate_command as _simulate
from surge.errors import RayServeException

__all__ = ["main"]


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="surge", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)

    run = commands.add_parser("run", help="deploy module:app or config.yaml locally and block "
                                          "until Ctrl-C")
    run.add_argument("target", help="import path of a bound application, e.g. echo:app, or "
                                    "a Ray Serve-style config file, e.g. config.yaml")
    run.add_argument("--name", default="default", help="application name (default: default)")
    run.add_argument("--route-prefix", default="/", help="HTTP route prefix (default: /)")
    run.add_argument("--host", default=None, help="HTTP host (default 127.0.0.1)")
    run.add_argument("--port", type=int, default=None, help="HTTP port (default 8000)")
    run.add_argument("--address", help="control address host:port; with --backend ray, the "
                                        "Ray cluster's address (e.g. auto), as `serve run`")
    run.add_argument("--backend", choices=BACKENDS, default=None,
                     help="where replicas run: local (default) or ray (a Ray cluster; "
                          "pip install 'surge[ray]')")
    run.add_argument("--dashboard-port", type=int, default=None,
                     help="port of the dashboard and /metrics on 127.0.0.1 (default 52801; "
                          "0: any free port; see `surge status`)")

    status = commands.add_parser("status", help="applications, deployments and replicas")
    status.add_argument("--json", action="store_true", help="print JSON")
    status.add_argument("--address", help="control address host:port")

    shutdown = commands.add_parser("shutdown", help="stop the running instance")
    shutdown.add_argument("--address", help="control address host:port")
    _config_cmds.add_parsers(commands)
    _pulse_parser(commands)
    _simulate_parser(commands)
    return parser


def _pulse_parser(commands: Any) -> None:
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


def _import_app(target: str) -> Any:
    module_name, _, attr = target.partition(":")
    if not attr:
        raise SystemExit(f"surge run: expected module:attribute, got {target!r}")
    sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise SystemExit(f"surge run: cannot import {module_name!r}: {exc}") from None
    try:
        return getattr(module, attr)
    except AttributeError:
        raise SystemExit(f"surge run: module {module_name!r} has no {attr!r}") from None


def _run(args: argparse.Namespace) -> int:
    from surge import serve

    if _config_cmds.is_config_path(args.target):
        _config_cmds.run_config(args)
        _block()
        return 0
    app = _import_app(args.target)
    http: dict[str, Any] = {}
    if args.host:
        http["host"] = args.host
    if args.port is not None:
        http["port"] = args.port
    serve.start(http_options=http or None, backend=args.backend or "local",
                ray_address=args.ray_address)
    serve.run(app, name=args.name, route_prefix=args.route_prefix)
    print(f"surge: application {args.name!r} running; Ctrl-C to stop", flush=True)
    _block()
    return 0


def _block() -> None:
    """Wait for Ctrl-C (then shut down) or for the instance to be shut down elsewhere."""
    from surge import serve
    from surge.api.instance import current

    instance = current()
    try:
        supervisor = instance.supervisor if instance is not None else None
        while supervisor is not None:
            if supervisor.ended.wait(timeout=1.0):
                print("surge: the instance was shut down", flush=True)
                return
    except KeyboardInterrupt:
        print("surge: shutting down", flush=True)
    serve.shutdown()


def _status(args: argparse.Namespace) -> int:
    from surge.api.instance import connect_or_start

    instance = connect_or_start(start=False)
    status = instance.call("status", timeout=10)
    replicas = instance.call("replicas", timeout=10)
    data = status.to_dict()
    data["replicas"] = replicas
    if args.json:
        print(json.dumps(data, indent=2))
        return 0
    print(f"control {data['control_address']}   http {data['http_address'] or '-'}   "
          f"dashboard {data.get('dashboard_address') or '-'}")
    proxies = data.get("proxy_addresses") or {}
    if set(proxies.values()) - {data["http_address"]}:  # proxies on several nodes (ray)
        for proxy_id, address in sorted(proxies.items()):
            print(f"  proxy {proxy_id:<24} {address}")
    if not data["applications"]:
        print("no applications")
    for name, app in data["applications"].items():
        print(f"{name:<20} {app['status']:<14} route {app['route_prefix']}")
        if app["message"]:
            print(f"  {app['message']}")
        for dname, dep in app["deployments"].items():
            states = " ".join(f"{k}={v}" for k, v in sorted(dep["replica_states"].items()))
            print(f"  {dname:<18} {dep['status']:<12} target {dep['target_replicas']}  {states}")
            rates = dep.get("rates") or {}
            if rates:
                print(f"  {'':<18} {rates['offered_per_s']:,.0f} req/s offered, "
                      f"{rates['completed_per_s']:,.0f} served, "
                      f"{rates['rejected_per_s']:,.0f} rejected; {rates['queued']:.0f} queued, "
                      f"{rates['ongoing']:.0f} ongoing")
    return 0


def _shutdown(args: argparse.Namespace) -> int:
    from surge import serve
    from surge.api.instance import connect_or_start

    connect_or_start(start=False)
    serve.shutdown()
    print("surge: shut down")
    return 0


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
    if "schedule" not in values:
        raise ValueError("give --baseline RPS and --peak RPS (or a --scenario with a schedule)")
    body = args.body
    if body is not None:
        values["body"] = (Path(body[1:]).read_bytes() if body.startswith("@")
                          else body.encode())
    if args.header:
        values["headers"] = tuple(parse_header(h) for h in args.header)
    flags = {"url": args.url, "arrivals": args.arrivals, "seed": args.seed,
             "method": args.method, "slo_ms": args.slo_ms, "timeout_s": args.timeout,
             "connections": args.connections, "max_time_s": args.max_time,
             "workers": args.workers, "surge_address": args.surge_address}
    values.update({k: v for k, v in flags.items() if v is not None})
    if not values.get("url"):
        raise ValueError("give the URL to load (or `url:` in the scenario)")
    return PulseOptions(**values)


def _pulse(args: argparse.Namespace) -> int:
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


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    args.ray_address = None
    if getattr(args, "backend", None) == "ray":  # --address names the Ray cluster
        args.ray_address, args.address = args.address, None
    if getattr(args, "address", None):
        os.environ["SURGE_ADDRESS"] = args.address
    if getattr(args, "dashboard_port", None) is not None:
        os.environ["SURGE_DASHBOARD"] = f"127.0.0.1:{args.dashboard_port}"
    try:
        handler = {"run": _run, "status": _status, "shutdown": _shutdown,
                   "pulse": _pulse, "simulate": _simulate,
                   "deploy": _config_cmds.deploy_command,
                   "build": _config_cmds.build_command,
                   "config": _config_cmds.config_command}[args.command]
        return handler(args)
    except RayServeException as exc:
        print(f"surge {args.command}: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
