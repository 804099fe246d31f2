"""`surge run config.yaml`, `surge deploy`, `surge build` and `surge config lint`.

All four read Ray Serve's `serve deploy` YAML (see surge.api.config_file). Errors go to
stderr as `FILE:LINE: FIELD: what is wrong`, one per line, and exit 1; warnings about
Ray keys surge does not implement go to stderr and do not stop anything.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

__all__ = ["add_parsers", "build_command", "config_command", "deploy_command",
           "is_config_path", "lint_command", "run_config"]

CONFIG_SUFFIXES = (".yaml", ".yml", ".json")


def is_config_path(target: str) -> bool:
    return target.endswith(CONFIG_SUFFIXES) or (":" not in target and Path(target).is_file())


def add_parsers(commands: Any) -> None:
    deploy = commands.add_parser(
        "deploy", help="apply a config file to the running instance",
        description="Apply a Ray Serve-style config to a running surge instance: changed "
                    "user_config reconfigures replicas in place, other changes roll them "
                    "(new replicas serve before old ones drain), applications missing "
                    "from the file are deleted.")
    deploy.add_argument("config", help="config file (YAML)")
    deploy.add_argument("--address", help="control address host:port")

    build = commands.add_parser(
        "build", help="write the config file of module:app",
        description="Import applications and write their config in `serve deploy` format.")
    build.add_argument("import_paths", nargs="+", metavar="module:app",
                       help="bound application or builder (several: app1, app2, ...)")
    build.add_argument("-o", "--output", help="write here instead of stdout")

    config = commands.add_parser("config", help="check config files",
                                 description="Work with config files.")
    actions = config.add_subparsers(dest="config_command", required=True)
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


def _load(path: str) -> Any:
    from surge.api.config_file import load_config

    config = load_config(path)
    for warning in config.warnings:
        print(f"warning: {warning}", file=sys.stderr)
    return config


def _progress(line: str) -> None:
    print(f"surge: {line}", flush=True)


def run_config(args: argparse.Namespace) -> None:
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
    instance = apply_config(config, start=True, progress=_progress)
    print(f"surge: {len(config.applications)} application(s) running at "
          f"http://{instance.http_address}; Ctrl-C to stop", flush=True)


def deploy_command(args: argparse.Namespace) -> int:
    from surge.api.config_apply import apply_config

    config = _load(args.config)
    apply_config(config, start=False, progress=_progress)
    # http_options take effect when surge starts; a running instance keeps its own.
    print(f"surge: deployed {args.config}", flush=True)
    return 0


def build_command(args: argparse.Namespace) -> int:
    import yaml

    from surge.api.config_apply import build_config

    data = build_config(list(args.import_paths))
    text = ("# Written by `surge build`; `surge run` or `surge deploy` this file.\n"
            + yaml.safe_dump(data, sort_keys=False))
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
    return lint_command(args)
