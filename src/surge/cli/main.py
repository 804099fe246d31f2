"""`surge start | run | deploy | status | config | shutdown | build | pulse | simulate`.

Operate (start, run, deploy, status, config, shutdown: Ray's `serve` commands and
flags), write and check configs (build, config lint), load-test and rehearse (pulse,
simulate).

Commands that talk to a running instance find it at `-a/--address`: a control address
host:port (default SURGE_ADDRESS, else 127.0.0.1:52800), or, for deploy, status, config
and shutdown, a dashboard URL http://host:port spoken to through Ray's REST API (with
no -a and no SURGE_ADDRESS, RAY_DASHBOARD_ADDRESS names it, as for Ray's `serve`). For
start and run, `--address auto` or ray://... (or --backend ray) names a Ray cluster.
`surge pulse` loads any HTTP URL (see surge.loadtest).
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any, NoReturn

from surge.backends.choice import BACKENDS
from surge.cli import config_cmds as _config_cmds
from surge.cli import lifecycle as _lifecycle
from surge.cli.pulse import add_parser as _pulse_parser
from surge.cli.pulse import pulse_command as _pulse
from surge.cli.simulate import add_parser as _simulate_parser
from surge.cli.simulate import simulate_command as _simulate
from surge.config.schema import closest
from surge.errors import RayServeException

__all__ = ["main"]

PROXY_LOCATIONS = ("EveryNode", "HeadOnly", "Disabled")


class _Parser(argparse.ArgumentParser):
    """Unknown flags are refused with the closest real one, as a typo deserves."""

    def error(self, message: str) -> NoReturn:
        if "unrecognized arguments:" in message:
            words = message.split("unrecognized arguments:", 1)[1].split()
            flags = [w.split("=", 1)[0] for w in words if w.startswith("-")]
            known = [o for action in self._all_actions() for o in action.option_strings]
            hints = []
            for flag in flags:
                close = closest(flag, known, cutoff=0.5)
                hints.append(f"{flag} (did you mean {close}?)" if close else flag)
            if hints:
                message = f"unknown flag{'s' if len(hints) > 1 else ''}: {', '.join(hints)}"
        super().error(message)

    def _all_actions(self) -> list[argparse.Action]:
        """This parser's options and, after a subcommand, that subcommand's."""
        actions = list(self._actions)
        chosen = getattr(self, "chosen", None)
        if chosen is not None:
            actions += chosen._all_actions()
        return actions


def _parser() -> _Parser:
    parser = _Parser(prog="surge", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    _start_parser(commands)
    _run_parser(commands)
    status = commands.add_parser(
        "status", help="applications, deployments and replicas",
        description="Print the status of every application as Ray's `serve status` does "
                    "(YAML: proxies, applications, target_capacity); `--table` or "
                    "`--json` show surge's own, with request rates.")
    _config_cmds.instance_address_flag(status)
    status.add_argument("-n", "--name", help="only this application")
    status.add_argument("--table", action="store_true",
                        help="a table with request rates instead of Ray's YAML")
    status.add_argument("--json", action="store_true",
                        help="surge's status as JSON, with request rates and replicas")
    shutdown = commands.add_parser("shutdown", help="stop the instance: every application, "
                                                    "replica, proxy and its daemon")
    _config_cmds.instance_address_flag(shutdown)
    shutdown.add_argument("-y", "--yes", action="store_true",
                          help="do not ask for confirmation (a script is never asked)")
    _config_cmds.add_parsers(commands)
    _pulse_parser(commands)
    _simulate_parser(commands)
    return parser


def _where_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-a", "--address",
                        help="control address host:port; `auto` or ray://HOST:PORT (or any "
                             "address with --backend ray): the Ray cluster to place on")
    parser.add_argument("--backend", choices=BACKENDS, default=None,
                        help="where replicas run: local (default) or ray (a Ray cluster; "
                             "pip install 'surge[ray]')")


def _start_parser(commands: Any) -> None:
    start = commands.add_parser(
        "start", help="start a detached instance, which outlives this command",
        description="Start surge in the background (supervised by a daemon of its own) and "
                    "return: deploy with `surge deploy`, `surge run --non-blocking` or a "
                    "script; `surge shutdown` stops it. An instance already running at the "
                    "address is left as it is.")
    _where_flags(start)
    start.add_argument("--http-host", help="host the HTTP proxies listen on "
                                           "(default 127.0.0.1)")
    start.add_argument("--http-port", type=int, help="HTTP port (default 8000)")
    start.add_argument("--proxy-location", choices=PROXY_LOCATIONS,
                       help="where proxies run (default EveryNode)")
    start.add_argument("--dashboard-host", help="dashboard, /metrics and REST API host "
                                                "(default 127.0.0.1)")
    start.add_argument("--dashboard-port", type=int,
                       help="dashboard port (default 52801; 0: any free port)")
    start.add_argument("--grpc-port", type=int, help="gRPC port (default 9000)")
    _config_cmds.grpc_flags(start)


def _run_parser(commands: Any) -> None:
    run = commands.add_parser(
        "run", help="deploy module:app or config.yaml and block until Ctrl-C",
        description="Deploy an application (import path, e.g. main:app or main.app; a "
                    "builder function takes key=value arguments) or a config file, and "
                    "block until Ctrl-C, which shuts surge down. An instance already "
                    "running at the address is deployed to.")
    run.add_argument("target", help="import path of a bound application or builder, e.g. "
                                    "echo:app, or a Ray Serve-style config file")
    run.add_argument("arguments", nargs="*", metavar="key=value",
                     help="arguments of an application builder function")
    run.add_argument("--name", default="default", help="application name (default: default)")
    run.add_argument("--route-prefix", default="/", help="HTTP route prefix (default: /)")
    run.add_argument("-d", "--app-dir", default=".",
                     help="directory to import the application from (default: .)")
    run.add_argument("--blocking", dest="blocking", action="store_true", default=True,
                     help="block until Ctrl-C, then shut down (default)")
    run.add_argument("--non-blocking", dest="blocking", action="store_false",
                     help="deploy and return; an instance started for it runs detached")
    run.add_argument("-r", "--reload", action="store_true",
                     help="redeploy when a file under the app dir changes (blocks)")
    run.add_argument("--host", default=None, help="HTTP host (default 127.0.0.1)")
    run.add_argument("--port", type=int, default=None, help="HTTP port (default 8000)")
    _where_flags(run)
    run.add_argument("--dashboard-port", type=int, default=None,
                     help="port of the dashboard and /metrics on 127.0.0.1 (default 52801; "
                          "0: any free port; see `surge status`)")
    _config_cmds._runtime_env_flags(run)


# The commands Ray's CLI points at a dashboard (its -a default: RAY_DASHBOARD_ADDRESS).
DASHBOARD_COMMANDS = ("deploy", "status", "config", "shutdown")


def _addresses(args: argparse.Namespace) -> None:
    """Split -a into the control address (SURGE_ADDRESS) and a Ray cluster's address."""
    args.ray_address = None
    address = getattr(args, "address", None)
    dashboard = os.environ.get("RAY_DASHBOARD_ADDRESS")
    if (args.command in DASHBOARD_COMMANDS and not address and dashboard
            and not os.environ.get("SURGE_ADDRESS")):
        # As Ray's serve CLI, whose -a defaults to it; without a scheme, HTTP (as Ray's)
        args.address = dashboard if "://" in dashboard else f"http://{dashboard}"
    if args.command in ("start", "run") and address and (
            args.backend == "ray" or address == "auto" or address.startswith("ray://")):
        args.ray_address, args.address = address, None
        args.backend = "ray"
    address = getattr(args, "address", None)
    if address and not address.startswith(("http://", "https://")):
        os.environ["SURGE_ADDRESS"] = address
    if args.command == "run" and args.dashboard_port is not None:
        os.environ["SURGE_DASHBOARD"] = f"127.0.0.1:{args.dashboard_port}"


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args, extras = parser.parse_known_args(argv)
    if extras:
        subparsers = parser._subparsers
        assert subparsers is not None
        choices = subparsers._group_actions[0].choices
        assert isinstance(choices, dict)
        parser.chosen = choices[args.command]  # type: ignore[attr-defined]
        parser.error(f"unrecognized arguments: {' '.join(extras)}")
    _addresses(args)
    try:
        handler = {"run": _lifecycle.run_command, "start": _lifecycle.start_command,
                   "status": _lifecycle.status_command,
                   "shutdown": _lifecycle.shutdown_command,
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
