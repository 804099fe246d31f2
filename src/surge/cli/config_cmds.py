"""`surge run config.yaml`, `surge deploy`, `surge build`, `surge config [lint]`.

They read and write Ray Serve's `serve deploy` YAML (see surge.api.config_file). Errors go to
stderr as `FILE:LINE: FIELD: what is wrong`, one per line, and exit 1; warnings about
Ray keys surge does not implement go to stderr and do not stop anything.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

from surge.errors import ConfigError

__all__ = ["add_parsers", "build_command", "config_command", "deploy_command", "grpc_flags",
           "grpc_options_of", "instance_address_flag", "is_config_path", "lint_command",
           "run_config", "runtime_env_of"]

CONFIG_SUFFIXES = (".yaml", ".yml", ".json")


def is_config_path(target: str) -> bool:
    return target.endswith(CONFIG_SUFFIXES) or (":" not in target and Path(target).is_file())


def add_parsers(commands: Any) -> None:
    deploy = commands.add_parser(
        "deploy", help="apply a config file or an application to the running instance",
        description="Apply a Ray Serve-style config (or one application by import path, "
                    "with builder arguments as key=value) to a running surge instance: "
                    "changed user_config reconfigures replicas in place, other changes "
                    "roll them (new replicas serve before old ones drain), applications "
                    "an earlier config deployed and the file lacks are deleted. "
                    "`-a http://HOST:PORT` deploys through the dashboard's REST API, "
                    "as Ray's `serve deploy`.")
    deploy.add_argument("config_or_import_path",
                        help="config file (YAML), or an import path such as main:app")
    deploy.add_argument("arguments", nargs="*", metavar="key=value",
                        help="arguments of an application builder function")
    deploy.add_argument("--name", help="application name (import path only)")
    instance_address_flag(deploy)
    _runtime_env_flags(deploy)

    build = commands.add_parser(
        "build", help="write the config file of module:app",
        description="Import applications and write their config in `serve deploy` format.")
    build.add_argument("import_paths", nargs="+", metavar="module:app",
                       help="bound application or builder (several: app1, app2, ...)")
    build.add_argument("-d", "--app-dir", default=".",
                       help="directory to import the applications from (default: .)")
    build.add_argument("-o", "--output-path", "--output", dest="output",
                       help="write here instead of stdout")
    grpc_flags(build)

    config = commands.add_parser(
        "config", help="print the deployed configs, or check a file (config lint)",
        description="Without a subcommand, print the config each application was "
                    "deployed with (as Ray's `serve config`); `config lint FILE` checks a "
                    "file.")
    instance_address_flag(config)
    config.add_argument("-n", "--name", help="only this application's config")
    actions = config.add_subparsers(dest="config_command")
    lint = actions.add_parser(
        "lint", help="find configuration traps",
        description="One finding per line: LEVEL RULE-ID app/deployment.field: what is "
                    "wrong (fix: what to do). Exit 1 if any finding is an ERROR (with "
                    "--strict, a WARNING too), else 0.")
    lint.add_argument("config", help="config file (YAML)")
    lint.add_argument("--strict", action="store_true", help="warnings fail the lint too")
    lint.add_argument("--no-import", action="store_true",
                      help="do not import the applications (skip code-level checks)")
    lint.add_argument("--json", action="store_true", help="print findings as JSON")


def instance_address_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-a", "--address",
                        help="control address host:port, or a dashboard URL http://host:port")


def grpc_flags(parser: argparse.ArgumentParser) -> None:
    """Ray's gRPC flags (docs/grpc.md)."""
    parser.add_argument("--grpc-servicer-functions", action="append", default=[],
                        metavar="IMPORT_PATH",
                        help="a gRPC add_*Servicer_to_server function to serve (repeatable); "
                             "none: no gRPC server")
    parser.add_argument("--grpc-enable-reflection", dest="grpc_enable_reflection",
                        action="store_true", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--grpc-disable-reflection", dest="grpc_enable_reflection",
                        action="store_false", help="do not serve gRPC server reflection")


def grpc_options_of(args: argparse.Namespace) -> dict[str, Any] | None:
    """The gRPC flags as Ray's grpc_options (None: no servicer functions, no gRPC)."""
    if not args.grpc_servicer_functions:
        return None
    options: dict[str, Any] = {"grpc_servicer_functions": list(args.grpc_servicer_functions)}
    if getattr(args, "grpc_port", None) is not None:
        options["port"] = args.grpc_port
    if args.grpc_enable_reflection is not None:
        options["enable_reflection"] = args.grpc_enable_reflection
    return options


def _runtime_env_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--runtime-env", metavar="FILE",
                        help="YAML runtime_env; surge uses its env_vars and a local "
                             "working_dir")
    parser.add_argument("--runtime-env-json", metavar="JSON", help="the same, as JSON")
    parser.add_argument("--working-dir", metavar="DIR",
                        help="local directory holding the application's code")


def _load(path: str) -> Any:
    from surge.api.config_file import load_config

    config = load_config(path)
    for warning in config.warnings:
        print(f"warning: {warning}", file=sys.stderr)
    return config


def _progress(line: str) -> None:
    print(f"surge: {line}", flush=True)


def run_config(args: argparse.Namespace, detached: bool = False) -> None:
    """Start surge with the file's http_options and deploy its applications."""
    from surge.api.config_apply import apply_config

    config = _load(args.target)
    if args.host or args.port is not None:
        import dataclasses

        config = dataclasses.replace(config, http_options=dataclasses.replace(
            config.http_options, **{k: v for k, v in (("host", args.host),
                                                      ("port", args.port)) if v}))
    if getattr(args, "backend", None) or getattr(args, "ray_address", None):
        import dataclasses

        config = dataclasses.replace(config, backend=args.backend or config.backend,
                                     ray_address=args.ray_address)
    instance = apply_config(config, start=True, progress=_progress, detached=detached)
    print(f"surge: {len(config.applications)} application(s) running at "
          f"http://{instance.http_address}" + ("; Ctrl-C to stop" if not detached else ""),
          flush=True)


def deploy_command(args: argparse.Namespace) -> int:
    from surge.api.config_apply import apply_config
    from surge.api.config_file import parse_config
    from surge.cli.lifecycle import builder_args
    from surge.cli.remote import Dashboard, is_dashboard_url

    target = args.config_or_import_path
    arguments = builder_args(args.arguments)
    runtime_env = runtime_env_of(args)
    if is_config_path(target):
        if arguments:
            raise ConfigError("application arguments cannot be given with a config file")
        for given, what in ((args.name, "--name"), (runtime_env, "the runtime_env")):
            if given:
                print(f"surge: warning: {what} is ignored with a config file",
                      file=sys.stderr)
    data = _deploy_dict(target, arguments, args.name, runtime_env)
    if is_dashboard_url(args.address):  # as Ray's `serve deploy`: the REST API does it
        Dashboard(args.address).deploy(data)
        print(f"surge: sent the deploy request to {args.address}; `surge status -a "
              f"{args.address}` follows it", flush=True)
        return 0
    if is_config_path(target):
        config = _load(target)
    else:
        config = parse_config(data, source=f"surge deploy {target}")
    apply_config(config, start=False, progress=_progress)
    # http_options take effect when surge starts; a running instance keeps its own.
    print(f"surge: deployed {target}", flush=True)
    return 0


def _deploy_dict(target: str, arguments: dict[str, str], name: str | None,
                 runtime_env: dict[str, Any]) -> dict[str, Any]:
    """The ServeDeploySchema to deploy: the file's, or one application's as Ray's
    `serve deploy` sends it (name, import_path, runtime_env, args)."""
    if is_config_path(target):
        import yaml

        try:
            data = yaml.safe_load(Path(target).read_text())
        except (OSError, yaml.YAMLError) as exc:
            raise ConfigError(f"{target}: cannot read the config file: {exc}") from None
        if not isinstance(data, dict):
            raise ConfigError(f"{target}: a config file is a mapping with `applications`")
        return data
    app: dict[str, Any] = {"name": name} if name else {}
    app.update(import_path=target, runtime_env=runtime_env, args=arguments)
    return {"applications": [app]}


def runtime_env_of(args: argparse.Namespace) -> dict[str, Any]:
    """--runtime-env FILE / --runtime-env-json, with --working-dir over theirs, as Ray."""
    if args.runtime_env_json:
        import json

        try:
            env = json.loads(args.runtime_env_json)
        except ValueError as exc:
            raise ConfigError(f"--runtime-env-json is not JSON: {exc}") from None
    elif args.runtime_env:
        import yaml

        env = yaml.safe_load(Path(args.runtime_env).read_text())
    else:
        env = {}
    if not isinstance(env, dict):
        raise ConfigError("a runtime_env is a mapping (env_vars, working_dir, ...)")
    if args.working_dir:
        env["working_dir"] = args.working_dir
    return env


def build_command(args: argparse.Namespace) -> int:
    from surge.api.config_apply import build_config
    from surge.cli.ray_yaml import dump

    sys.path.insert(0, os.path.abspath(args.app_dir))
    data = build_config(list(args.import_paths))
    # Right after http_options, as Ray writes it: its gRPC options, the defaults too.
    grpc = {"port": 9000, "grpc_servicer_functions": [], "enable_reflection": True,
            **(grpc_options_of(args) or {})}
    entries = list(data.items())
    entries.insert([key for key, _ in entries].index("http_options") + 1,
                   ("grpc_options", grpc))
    text = ("# Written by `surge build` (Ray Serve's `serve build` format); `surge run`, "
            "`surge deploy` or `serve deploy` this file.\n\n"
            + dump(dict(entries), width=80).rstrip("\n") + "\n")
    print("surge: the applications are named app1, app2, ...; rename them as you like",
          file=sys.stderr)
    if args.output:
        Path(args.output).write_text(text)
        print(f"surge: wrote {args.output}", file=sys.stderr)
    else:
        sys.stdout.write(text)
    return 0


def lint_command(args: argparse.Namespace) -> int:
    import json

    from surge.api.config_file import load_config
    from surge.api.config_lint import lint_config

    config = load_config(args.config)
    findings = sorted(lint_config(config, import_code=not args.no_import),
                      key=lambda f: ("EWI".index(f.level[0]), f.line or 0, f.rule))
    if args.json:
        print(json.dumps([{"level": f.level, "rule": f.rule, "where": f.where,
                           "message": f.message, "fix": f.fix,
                           "file": config.source, "line": f.line} for f in findings],
                         indent=2))
    else:
        for finding in findings:
            print(finding)
    failing = {"ERROR", "WARNING"} if args.strict else {"ERROR"}
    counts = {level: sum(1 for f in findings if f.level == level)
              for level in ("ERROR", "WARNING", "INFO")}
    if not args.json:
        print(f"{args.config}: {counts['ERROR']} error(s), {counts['WARNING']} warning(s), "
              f"{counts['INFO']} info", file=sys.stderr)
    return 1 if any(f.level in failing for f in findings) else 0


def config_command(args: argparse.Namespace) -> int:
    if args.config_command == "lint":
        return lint_command(args)
    return show_configs(args)


def show_configs(args: argparse.Namespace) -> int:
    """The config each application was last deployed with, as Ray's `serve config`."""
    from surge.cli.ray_yaml import dump
    from surge.cli.remote import details

    applications = details(args.address).get("applications") or {}
    if args.name is not None:
        app = applications.get(args.name)
        if app is None or not app.get("deployed_app_config"):
            print(f'No config has been deployed for application "{args.name}".')
            return 0
        sys.stdout.write(dump(app["deployed_app_config"]))
        return 0
    configs = [dump(app["deployed_app_config"]) for app in applications.values()
               if app.get("deployed_app_config")]
    sys.stdout.write("\n---\n\n".join(configs) if configs else "No configuration was found.\n")
    return 0
