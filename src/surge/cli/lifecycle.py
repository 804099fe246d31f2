"""`surge start | run | status | shutdown`: an instance's life from the command line.

`surge start` starts a detached instance (api/daemon.py) and returns; `surge run`
deploys an application or a config file and blocks until Ctrl-C, which shuts the
instance down (with `--non-blocking` it deploys, leaves the instance running
detached and returns; with `--reload` it redeploys whenever a source file changes).
`status` and `shutdown` reach the instance at `-a` (surge.cli.remote). docs/operations.md
describes who supervises whom.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
import time
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from surge.cli import config_cmds
from surge.cli.remote import Dashboard, details, is_dashboard_url, status_from_details
from surge.errors import ConfigError, ControllerUnavailableError

__all__ = ["builder_args", "run_command", "shutdown_command", "start_command",
           "status_command"]

RELOAD_POLL_S = 1.0
MAX_WATCHED_FILES = 20_000
SKIPPED_DIRS = {".git", ".venv", "venv", "__pycache__", "node_modules", ".mypy_cache",
                ".ruff_cache", ".pytest_cache"}
SHUTDOWN_WAIT_S = 60.0


def builder_args(arguments: list[str]) -> dict[str, str]:
    """`key=value` words (Ray's application builder arguments) as a dict."""
    out = {}
    for argument in arguments:
        key, sep, value = argument.partition("=")
        if not sep or not key or not value:
            raise ConfigError(f"invalid application argument {argument!r}: arguments are "
                              "key=value")
        out[key] = value
    return out


# -- surge start --------------------------------------------------------------------------


def start_command(args: argparse.Namespace) -> int:
    from surge import serve
    from surge.api.instance import connect_or_start, current

    try:
        instance = connect_or_start(start=False)
        print(f"surge: an instance already runs at {instance.address} (http "
              f"{instance.http_address or '-'}); it keeps its own options")
        return 0
    except ControllerUnavailableError:
        pass
    http = {k: v for k, v in (("host", args.http_host), ("port", args.http_port))
            if v is not None}
    if args.grpc_port is not None and not args.grpc_servicer_functions:
        print("surge: warning: --grpc-port without --grpc-servicer-functions starts no gRPC "
              "server", file=sys.stderr)
    serve.start(detached=True, http_options=http or None, proxy_location=args.proxy_location,
                grpc_options=config_cmds.grpc_options_of(args),
                backend=args.backend or "local", ray_address=args.ray_address,
                dashboard_host=args.dashboard_host, dashboard_port=args.dashboard_port)
    started = current()
    assert started is not None
    instance = started
    status = instance.call("status", timeout=10)
    print(f"surge: started a detached instance (daemon pid {instance.daemon_pid})\n"
          f"  control    {instance.address}\n  http       {instance.http_address or '-'}\n"
          f"  dashboard  {status.dashboard_address or '-'}\n  log        {instance.log_file}\n"
          "`surge deploy`, `surge run --non-blocking` or a script deploy to it; "
          "`surge shutdown` stops it.", flush=True)
    return 0


# -- surge run ----------------------------------------------------------------------------


def run_command(args: argparse.Namespace) -> int:
    if args.reload and not args.blocking:
        raise ConfigError("the --non-blocking option conflicts with the --reload option")
    app_dir = _app_dir(args)
    sys.path.insert(0, app_dir)
    arguments = builder_args(args.arguments)
    is_config = config_cmds.is_config_path(args.target)
    if is_config and arguments:
        print("surge: warning: application arguments are ignored when running a config "
              "file", file=sys.stderr)
    detached = not args.blocking

    def deploy(reloading: bool) -> None:
        if reloading:
            _reload_modules_under(app_dir)
        if is_config:
            config_cmds.run_config(args, detached=detached)
        else:
            _run_import_path(args, arguments, app_dir, detached)

    deploy(False)
    if not args.blocking:
        from surge.api.instance import current

        instance = current()
        owner = "detached" if instance is not None and instance.daemon_pid else "running"
        print(f"surge: deployed; the instance keeps running ({owner}); `surge shutdown` "
              "stops it", flush=True)
        return 0
    if args.reload:
        _watch(app_dir, deploy)
    else:
        _block()
    return 0


def _app_dir(args: argparse.Namespace) -> str:
    working_dir = args.working_dir or _runtime_env(args).get("working_dir")
    if working_dir and "://" in str(working_dir):
        raise ConfigError(f"working_dir {working_dir!r} is a remote URI; surge runs code from "
                          "a local directory (use -d/--app-dir or a local working_dir)")
    return os.path.abspath(str(working_dir or args.app_dir))


def _runtime_env(args: argparse.Namespace) -> dict[str, Any]:
    """--runtime-env FILE / --runtime-env-json: surge uses env_vars and working_dir."""
    env = config_cmds.runtime_env_of(args)
    ignored = sorted(set(env) - {"env_vars", "working_dir"})
    if ignored:
        print(f"surge: warning: runtime_env {', '.join(ignored)} not supported; surge uses "
              "the current Python environment", file=sys.stderr)
    return env


def _run_import_path(args: argparse.Namespace, arguments: dict[str, str], app_dir: str,
                     detached: bool) -> None:
    from surge import serve
    from surge.api.config_apply import import_application
    from surge.api.instance import current

    app = import_application(args.target, arguments, (app_dir,))
    if current() is None:
        for key, value in (_runtime_env(args).get("env_vars") or {}).items():
            os.environ[str(key)] = str(value)  # the instance and its replicas inherit them
        http = {k: v for k, v in (("host", args.host), ("port", args.port)) if v is not None}
        serve.start(http_options=http or None, backend=args.backend or "local",
                    ray_address=args.ray_address, detached=detached)
    serve.run(app, name=args.name, route_prefix=args.route_prefix)
    instance = current()
    where = f" at http://{instance.http_address}" if instance is not None else ""
    print(f"surge: application {args.name!r} running{where}"
          + ("; Ctrl-C to stop" if args.blocking else ""), flush=True)


def _reload_modules_under(directory: str) -> None:
    root = Path(directory)
    for name, module in list(sys.modules.items()):
        path = getattr(module, "__file__", None)
        if not path or name == "__main__":
            continue
        try:
            Path(path).resolve().relative_to(root)
        except ValueError:
            continue
        try:
            importlib.reload(module)
        except Exception:  # the edit broke it: the redeploy reports the import error
            traceback.print_exc()


def _source_files(directory: str) -> dict[str, float]:
    found: dict[str, float] = {}
    for path in _walk(Path(directory)):
        try:
            found[str(path)] = path.stat().st_mtime
        except OSError:
            continue
        if len(found) >= MAX_WATCHED_FILES:
            break
    return found


def _walk(root: Path) -> Iterator[Path]:
    for entry in sorted(root.iterdir()) if root.is_dir() else ():
        if entry.is_dir() and not entry.is_symlink():
            if entry.name not in SKIPPED_DIRS:
                yield from _walk(entry)
        elif entry.suffix in (".py", ".yaml", ".yml", ".json"):
            yield entry


def _watch(directory: str, deploy: Callable[[bool], None]) -> None:
    """Redeploy whenever a source file under `directory` changes, until Ctrl-C."""
    from surge.api.instance import current

    print(f"surge: watching {directory} for changes; Ctrl-C to stop", flush=True)
    seen = _source_files(directory)
    try:
        while True:
            instance = current()
            supervisor = instance.supervisor if instance is not None else None
            if supervisor is not None and supervisor.ended.wait(RELOAD_POLL_S):
                print("surge: the instance was shut down", flush=True)
                return
            if supervisor is None:
                time.sleep(RELOAD_POLL_S)
            now = _source_files(directory)
            changed = sorted(p for p in set(now) | set(seen) if now.get(p) != seen.get(p))
            seen = now
            if not changed:
                continue
            print(f"surge: {len(changed)} file(s) changed ({os.path.relpath(changed[0], directory)}"
                  f"{', ...' if len(changed) > 1 else ''}); redeploying", flush=True)
            try:
                deploy(True)
            except Exception:
                traceback.print_exc()
                print("surge: deploying the latest version failed; the previous one keeps "
                      "serving", file=sys.stderr, flush=True)
    except KeyboardInterrupt:
        print("surge: shutting down", flush=True)
        from surge import serve

        serve.shutdown()


def _block() -> None:
    """Wait for Ctrl-C (then shut down) or for the instance to be shut down elsewhere."""
    from surge import serve
    from surge.api.instance import current

    instance = current()
    try:
        supervisor = instance.supervisor if instance is not None else None
        if supervisor is None:  # an instance that was already running: it stays
            while True:
                time.sleep(3600)
        while not supervisor.ended.wait(timeout=1.0):
            pass
        print("surge: the instance was shut down", flush=True)
        return
    except KeyboardInterrupt:
        print("surge: shutting down", flush=True)
    serve.shutdown()


# -- surge status / shutdown --------------------------------------------------------------


def status_command(args: argparse.Namespace) -> int:
    if not (args.json or args.table):
        return _print_ray_status(args)
    if is_dashboard_url(args.address):
        data = status_from_details(Dashboard(args.address).details(), args.address)
    else:
        from surge.api.instance import connect_or_start

        instance = connect_or_start(start=False)
        data = instance.call("status", timeout=10).to_dict()
        data["replicas"] = instance.call("replicas", timeout=10)
    if args.name is not None:
        if args.name not in data["applications"]:
            print(f"surge status: application {args.name!r} does not exist", file=sys.stderr)
            return 1
        data["applications"] = {args.name: data["applications"][args.name]}
        data["replicas"] = [r for r in data.get("replicas", ()) if r["app"] == args.name]
    if args.json:
        print(json.dumps(data, indent=2))
    else:
        _print_status(data)
    return 0


def _print_ray_status(args: argparse.Namespace) -> int:
    """Ray's `serve status` document (surge.cli.ray_yaml), or one application's part."""
    from surge.cli import ray_yaml

    status = ray_yaml.serve_status(details(args.address))
    if args.name is None:
        sys.stdout.write(ray_yaml.dump(status))
        return 0
    if args.name not in status["applications"]:
        print(f"surge status: application {args.name!r} does not exist", file=sys.stderr)
        return 1
    sys.stdout.write(ray_yaml.dump(status["applications"][args.name]))
    return 0


def _print_status(data: dict[str, Any]) -> None:
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
            models = [f"{r['replica_id']}: {', '.join(r['models'])}"
                      for r in data.get("replicas", ())
                      if r.get("models") and r["app"] == name and r["deployment"] == dname]
            if models:
                print(f"  {'':<18} models  {'; '.join(sorted(models))}")
            if dep.get("message"):
                print(f"  {'':<18} {dep['message']}")
            rates = dep.get("rates") or {}
            if "offered_per_s" in rates:
                print(f"  {'':<18} {rates['offered_per_s']:,.0f} req/s offered, "
                      f"{rates['completed_per_s']:,.0f} served, "
                      f"{rates['rejected_per_s']:,.0f} rejected; {rates['queued']:.0f} queued, "
                      f"{rates['ongoing']:.0f} ongoing")
            if "node_cpu" in rates:
                print(f"  {'':<18} node CPU {100 * rates['node_cpu']:.0f}% busy (all cores)")


def shutdown_command(args: argparse.Namespace) -> int:
    where = args.address or os.environ.get("SURGE_ADDRESS") or "the default address"
    if is_dashboard_url(args.address):
        dashboard = Dashboard(args.address)
        try:
            dashboard.details()
        except ControllerUnavailableError as exc:
            print(f"surge shutdown: {exc}; nothing to shut down", file=sys.stderr)
            return 0
        if not _confirmed(args, where):
            return 1
        dashboard.shutdown()
        _wait_unanswered(dashboard)
    else:
        from surge import serve
        from surge.api.instance import connect_or_start

        try:
            connect_or_start(start=False)
        except ControllerUnavailableError as exc:
            print(f"surge shutdown: {exc}; nothing to shut down", file=sys.stderr)
            return 0
        if not _confirmed(args, where):
            return 1
        serve.shutdown()
    print("surge: shut down")
    return 0


def _confirmed(args: argparse.Namespace, where: str) -> bool:
    """Ray asks before deleting every application; -y skips it, as does a script (no TTY)."""
    if args.yes or not sys.stdin.isatty():
        return True
    answer = input(f"This shuts down surge at {where} and deletes all its applications. "
                   "Continue? [y/N]: ")
    if answer.strip().lower() in ("y", "yes"):
        return True
    print("Aborted.", file=sys.stderr)
    return False


def _wait_unanswered(dashboard: Dashboard) -> None:
    deadline = time.monotonic() + SHUTDOWN_WAIT_S
    while time.monotonic() < deadline:
        try:
            dashboard.details()
        except ControllerUnavailableError:
            return
        time.sleep(0.2)
    print(f"surge shutdown: {dashboard.url} still answers after {SHUTDOWN_WAIT_S:.0f}s",
          file=sys.stderr)
