"""`surge run | status | shutdown`: operate a surge instance from the shell.

Every command that talks to a running instance finds it at `--address`, else
SURGE_ADDRESS, else 127.0.0.1:52800.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
from typing import Any

from surge.errors import RayServeException

__all__ = ["main"]


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="surge", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)

    run = commands.add_parser("run", help="deploy module:app locally and block until Ctrl-C")
    run.add_argument("target", help="import path of a bound application, e.g. echo:app")
    run.add_argument("--name", default="default", help="application name (default: default)")
    run.add_argument("--route-prefix", default="/", help="HTTP route prefix (default: /)")
    run.add_argument("--host", default=None, help="HTTP host (default 127.0.0.1)")
    run.add_argument("--port", type=int, default=None, help="HTTP port (default 8000)")
    run.add_argument("--address", help="control address host:port")

    status = commands.add_parser("status", help="applications, deployments and replicas")
    status.add_argument("--json", action="store_true", help="print JSON")
    status.add_argument("--address", help="control address host:port")

    shutdown = commands.add_parser("shutdown", help="stop the running instance")
    shutdown.add_argument("--address", help="control address host:port")
    return parser


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

    app = _import_app(args.target)
    http: dict[str, Any] = {}
    if args.host:
        http["host"] = args.host
    if args.port is not None:
        http["port"] = args.port
    serve.start(http_options=http or None)
    serve.run(app, name=args.name, route_prefix=args.route_prefix)
    print(f"surge: application {args.name!r} running; Ctrl-C to stop", flush=True)
    _block()
    return 0


def _block() -> None:
    """Wait for Ctrl-C (then shut down) or for the instance to be shut down elsewhere."""
    import subprocess

    from surge import serve
    from surge.api.instance import current

    instance = current()
    try:
        while instance is not None and instance.process is not None:
            try:
                instance.process.wait(timeout=1.0)
                print("surge: the instance was shut down", flush=True)
                return
            except subprocess.TimeoutExpired:
                continue
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
    print(f"control {data['control_address']}   http {data['http_address'] or '-'}")
    if not data["applications"]:
        print("no applications")
    for name, app in data["applications"].items():
        print(f"{name:<20} {app['status']:<14} route {app['route_prefix']}")
        if app["message"]:
            print(f"  {app['message']}")
        for dname, dep in app["deployments"].items():
            states = " ".join(f"{k}={v}" for k, v in sorted(dep["replica_states"].items()))
            print(f"  {dname:<18} {dep['status']:<12} target {dep['target_replicas']}  {states}")
    return 0


def _shutdown(args: argparse.Namespace) -> int:
    from surge import serve
    from surge.api.instance import connect_or_start

    connect_or_start(start=False)
    serve.shutdown()
    print("surge: shut down")
    return 0


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if getattr(args, "address", None):
        os.environ["SURGE_ADDRESS"] = args.address
    try:
        handler = {"run": _run, "status": _status, "shutdown": _shutdown}[args.command]
        return handler(args)
    except RayServeException as exc:
        print(f"surge {args.command}: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
