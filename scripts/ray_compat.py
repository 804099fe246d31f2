"""Generate docs/ray-compat.md: every public name of Ray Serve, and whether surge has it.

    python scripts/ray_compat.py                  # read Ray Serve, write the snapshot + table
    python scripts/ray_compat.py --from-snapshot  # re-classify the checked-in snapshot
    python scripts/ray_compat.py --create-venv    # first make Ray Serve's venv (bench/common.py)

Two halves. The dump (`--dump OUT`, run by Ray Serve's own Python in a subprocess; this
file imports only the standard library at module level) writes Ray's public surface as
JSON: the public names of its modules, the parameters of five callables, the fields of
its config classes and the keys of its config-file schema. That JSON, names only, is
checked in (docs/ray-surface-X.Y.json), so the second half runs without Ray: it imports
surge and sorts each item into one of three answers, read from surge's own sources (its
modules and signatures, `surge.api.deployment._IGNORED`, `surge.api.config_file`'s
`*_RAY_ONLY`, `surge.config.RAY_ACTOR_OPTION_KEYS_ACCEPTED`,
`surge.config.RAY_CLASSES_ACCEPTED`, `RAY_FIELDS_ACCEPTED`), never from a list kept
here. Only the notes, one line each on a difference made on purpose, are kept here, and
each must name an item that both sides still have. tests/test_ray_compat.py checks the
table against the snapshot.
"""

from __future__ import annotations

import argparse
import ast
import importlib
import importlib.util
import inspect
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
TABLE = DOCS / "ray-compat.md"
SNAPSHOT_GLOB = "ray-surface-*.json"

# Ray Serve's modules that apps import, as its API reference documents them. Which of a
# module's names are public: its `__all__` where it has one; else the names that Ray marks
# @PublicAPI or @DeveloperAPI (ray.util.annotations: what the reference documents) and that
# the module defines itself, re-exports left out. Either way names starting with "_" are
# private. Not read: ray.serve.api, .deployment, .batching, .utils, .multiplex (ray.serve
# re-exports their public names and the reference documents them there), and modules of
# Ray-internal or legacy features (.dag, .gang, .experimental, .scripts, the adapters).
MODULES = (
    "ray.serve", "ray.serve.autoscaling_policy", "ray.serve.config", "ray.serve.context",
    "ray.serve.exceptions", "ray.serve.grpc_util", "ray.serve.handle", "ray.serve.llm",
    "ray.serve.metrics", "ray.serve.request_router", "ray.serve.schema",
    "ray.serve.task_consumer",
)
# "module:qualname". Parameters: named ones only; "self", *args, **kwargs and "_private"
# ones left out. Fields: the pydantic model's fields, "_private" ones left out.
CALLABLES = ("ray.serve:deployment", "ray.serve:Deployment.options", "ray.serve:run",
             "ray.serve:start", "ray.serve.handle:DeploymentHandle.options")
CLASSES = ("ray.serve.config:AutoscalingConfig", "ray.serve.config:AutoscalingPolicy",
           "ray.serve.config:BackpressureConfig", "ray.serve.config:HTTPOptions",
           "ray.serve.config:RequestRouterConfig", "ray.serve.config:gRPCOptions",
           "ray.serve.schema:LoggingConfig")
# The `serve deploy` file's schema: where in the file, and surge.api.config_file's names
# for the keys it implements and for the Ray keys it accepts with a warning.
CONFIG_FILE = {
    "ray.serve.schema:ServeDeploySchema": ("the top level", "TOP_KEYS", "TOP_RAY_ONLY"),
    "ray.serve.schema:HTTPOptionsSchema": ("`http_options`", "HTTP_KEYS", "HTTP_RAY_ONLY"),
    "ray.serve.schema:ServeApplicationSchema": ("`applications[]`", "APP_KEYS",
                                                "APP_RAY_ONLY"),
    "ray.serve.schema:DeploymentSchema": ("`applications[].deployments[]`",
                                          "DEPLOYMENT_KEYS", "DEPLOYMENT_RAY_ONLY"),
    "ray.serve.schema:RayActorOptionsSchema": ("`deployments[].ray_actor_options`",
                                               "RAY_ACTOR_OPTION_KEYS_IMPLEMENTED",
                                               "RAY_ACTOR_OPTION_KEYS_ACCEPTED"),
}
# The page's sections, each in this order.
GROUPS = {"names": MODULES, "parameters": CALLABLES, "fields": CLASSES,
          "config_file": tuple(CONFIG_FILE)}

IMPLEMENTED, ACCEPTED, MISSING = "implemented", "accepted, not used", "not in surge"
STATUSES = (IMPLEMENTED, ACCEPTED, MISSING)

_QUEUE = ("one budget for the whole deployment, not one per caller; unset (-1): bounded "
          "by time instead, a request that would wait longer than surge's "
          "`max_queue_wait_s` (default 0.1 s) is refused at once, with a Retry-After "
          "(Ray queues without bound; docs/using.md#queues-and-overload)")
_RETRIES = "default 3 process starts, not Ray's 20"
_ENV_VARS = "`env_vars` only; Ray's other runtime_env keys are accepted with a warning"
_SILENT_RUN = "no warning: serve.run's `**kwargs` takes it silently"
_SILENT_HANDLE = "no warning: DeploymentHandle.options' `**kwargs` takes it silently"
_PLACEMENT = ("refused where Ray refuses it, with Ray's message (config/placement.py: the "
              "strategy, the bundles' shape, the first bundle holding the replica's "
              "`ray_actor_options`); no placement group is made")
# Differences on purpose, one line each: (table, item) -> note. The item must exist on both
# sides (in Ray's surface, and implemented or accepted by surge), or the script fails.
NOTES: dict[tuple[str, str], str] = {
    ("ray.serve.config", "RequestRouterConfig"):
        "surge's own router (power of two choices; on the engine's queue where replicas "
        "report routing stats, docs/llm.md); a custom router is unused",
    ("ray.serve.config", "gRPCOptions"): "bytes through: the request is parsed only in the "
                                         "replica; see docs/grpc.md",
    ("ray.serve:deployment", "max_queued_requests"): _QUEUE,
    ("ray.serve:deployment", "max_constructor_retry_count"): _RETRIES,
    ("ray.serve:deployment", "placement_group_bundles"): _PLACEMENT,
    ("ray.serve:deployment", "placement_group_strategy"): _PLACEMENT,
    ("ray.serve:Deployment.options", "placement_group_bundles"): _PLACEMENT,
    ("ray.serve:Deployment.options", "placement_group_strategy"): _PLACEMENT,
    ("ray.serve:Deployment.options", "max_queued_requests"): _QUEUE,
    ("ray.serve:Deployment.options", "max_constructor_retry_count"): _RETRIES,
    ("ray.serve:run", "controller_options"): _SILENT_RUN,
    ("ray.serve:run", "external_scaler_enabled"): _SILENT_RUN,
    ("ray.serve:run", "logging_config"): _SILENT_RUN,
    ("ray.serve.handle:DeploymentHandle.options", "multiplexed_model_id"):
        "reaches the replica's request context; no model-aware routing",
    ("ray.serve.handle:DeploymentHandle.options", "request_serialization"): _SILENT_HANDLE,
    ("ray.serve.handle:DeploymentHandle.options", "response_serialization"): _SILENT_HANDLE,
    ("ray.serve.handle:DeploymentHandle.options", "session_id"):
        "reaches the replica's request context (over HTTP: `x-session-id`); routes with "
        "bounded affinity where replicas report routing stats (docs/llm.md)",
    ("ray.serve.config:AutoscalingConfig", "policy"):
        "default: surge's `proactive`; `{policy_function: ray_default}` is Ray's, exactly",
    ("ray.serve.config:AutoscalingPolicy", "policy_function"):
        "default `proactive` (surge's); `ray_default` is Ray's default policy",
    ("ray.serve.config:BackpressureConfig", "retry_after_s"):
        "unset: no Retry-After, as Ray, except on surge's wait bound (max_queued_requests "
        "unset), which advises its estimate of the queue's drain time",
    ("ray.serve.schema:LoggingConfig", "enable_access_log"):
        "access lines sampled: at most 10/s per process unless `access_log_max_per_s: 0`",
    ("ray.serve.schema:ServeApplicationSchema", "runtime_env"): _ENV_VARS,
    ("ray.serve.schema:DeploymentSchema", "max_queued_requests"): _QUEUE,
    ("ray.serve.schema:RayActorOptionsSchema", "num_cpus"):
        "sizes the replica's thread pools as Ray sets `OMP_NUM_THREADS` (whole CPUs, at "
        "least 1), OpenBLAS', MKL's and torch's too; env_vars win; LLMServer's engine "
        "sizes its own (docs/using.md#thread-pools)",
    ("ray.serve.schema:RayActorOptionsSchema", "resources"):
        "used for placement on the Ray backend only",
    ("ray.serve.schema:RayActorOptionsSchema", "runtime_env"): _ENV_VARS,
}


# -- the dump: runs in Ray Serve's Python ------------------------------------------------


def resolve(path: str) -> Any:
    """`module:qualname` -> the object."""
    module, _, qualname = path.partition(":")
    found: Any = importlib.import_module(module)
    for part in filter(None, qualname.split(".")):
        found = getattr(found, part)
    return found


def _marked_public(obj: Any) -> bool:
    # @PublicAPI/@DeveloperAPI set _annotated to the object's own name (so that a subclass
    # does not inherit the mark) and _annotated_type.
    own = getattr(obj, "_annotated", None)
    kind = getattr(getattr(obj, "_annotated_type", None), "name", "")
    return own is not None and own == getattr(obj, "__name__", None) and \
        kind in ("PUBLIC_API", "DEVELOPER_API")


def _all_from_source(name: str) -> list[str]:
    """`__all__` as written in the module's source (for a module that cannot import)."""
    spec = importlib.util.find_spec(name)
    assert spec is not None and spec.origin is not None
    tree = ast.parse(Path(spec.origin).read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets):
            return list(ast.literal_eval(node.value))
    raise SystemExit(f"{name} cannot be imported and its source has no __all__")


def public_names(name: str) -> tuple[list[str], bool] | None:
    """The module's public names and whether they were read from its source; None: absent."""
    if importlib.util.find_spec(name) is None:
        return None
    try:
        module = importlib.import_module(name)
    except ImportError:  # present, but its extra (ray[llm]) is not installed
        return sorted(n for n in _all_from_source(name) if not n.startswith("_")), True
    listed = getattr(module, "__all__", None)
    if listed is None:
        listed = [n for n, obj in vars(module).items()
                  if _marked_public(obj) and getattr(obj, "__module__", None) == name]
    return sorted(n for n in listed if not n.startswith("_")), False


def parameter_names(obj: Any) -> list[str]:
    skip = (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
    return sorted(p.name for p in inspect.signature(obj).parameters.values()
                  if p.kind not in skip and p.name != "self" and not p.name.startswith("_"))


def field_names(cls: Any) -> list[str]:
    fields = getattr(cls, "model_fields", None)
    if fields is None:
        fields = cls.__fields__  # pydantic 1
    return sorted(n for n in fields if not n.startswith("_"))


def dump() -> dict[str, Any]:
    import ray

    names: dict[str, list[str]] = {}
    from_source = []
    for module in MODULES:
        found = public_names(module)
        if found is not None:
            names[module] = found[0]
            if found[1]:
                from_source.append(module)
    return {"ray_version": ray.__version__, "read_from_source": from_source, "names": names,
            "parameters": {c: parameter_names(resolve(c)) for c in CALLABLES},
            "fields": {c: field_names(resolve(c)) for c in CLASSES},
            "config_file": {c: field_names(resolve(c)) for c in CONFIG_FILE}}


# -- surge's side ------------------------------------------------------------------------


@dataclass(frozen=True)
class Known:
    """What surge has for one table. `any_keyword`: a `**kwargs` takes every other name."""

    implemented: frozenset[str] = frozenset()
    accepted: frozenset[str] = frozenset()
    any_keyword: bool = False

    def status(self, name: str) -> str:
        if name in self.implemented:
            return IMPLEMENTED
        if name in self.accepted or self.any_keyword:
            return ACCEPTED
        return MISSING


def surge_path(ray_path: str) -> str:
    assert ray_path.startswith("ray.serve"), ray_path
    return "surge.serve" + ray_path[len("ray.serve"):]


def _surge_object(ray_path: str) -> Any:
    """surge's object at Ray's path (`ray.serve.x:Y` -> `surge.serve.x:Y`); None: absent."""
    module = surge_path(ray_path).partition(":")[0]
    try:
        return resolve(surge_path(ray_path))
    except ModuleNotFoundError as exc:
        if exc.name != module:
            raise
        return None
    except AttributeError:
        return None


def _accepted_only(obj: Any) -> bool:
    from surge.config import RAY_CLASSES_ACCEPTED

    return any(obj is cls for cls in RAY_CLASSES_ACCEPTED)


def known_names(module_path: str) -> Known:
    module = _surge_object(module_path)
    if module is None:
        return Known()
    present = {n for n in dir(module) if not n.startswith("__")}
    accepted = {n for n in present if _accepted_only(getattr(module, n))}
    return Known(frozenset(present - accepted), frozenset(accepted))


def known_parameters(callable_path: str) -> Known:
    if callable_path in ("ray.serve:deployment", "ray.serve:Deployment.options"):
        from surge.api import deployment  # both take **options, checked against these

        return Known(frozenset(deployment._OPTION_KEYS), frozenset(deployment._IGNORED))
    # Elsewhere the signature says it: a named parameter is one surge uses; one it only
    # accepts goes to its `**_ray_only` (as serve.start's grpc_options does).
    target = _surge_object(callable_path)
    if target is None:
        return Known()
    params = inspect.signature(target).parameters.values()
    named = {p.name for p in params if p.kind is not inspect.Parameter.VAR_KEYWORD}
    return Known(frozenset(named), any_keyword=any(
        p.kind is inspect.Parameter.VAR_KEYWORD for p in params))


def known_fields(class_path: str) -> Known:
    import dataclasses

    cls = _surge_object(class_path)
    if cls is None:
        return Known()
    from surge.config import RAY_FIELDS_ACCEPTED

    names = frozenset(f.name for f in dataclasses.fields(cls))
    if _accepted_only(cls):
        return Known(accepted=names)
    unused = frozenset(RAY_FIELDS_ACCEPTED.get(cls, ()))
    return Known(names - unused, unused)


def known_config_keys(schema_path: str) -> Known:
    from surge.api import config_file

    _, implemented, accepted = CONFIG_FILE[schema_path]
    return Known(frozenset(getattr(config_file, implemented)),
                 frozenset(getattr(config_file, accepted)))


KNOWN: dict[str, Callable[[str], Known]] = {
    "names": known_names, "parameters": known_parameters, "fields": known_fields,
    "config_file": known_config_keys,
}


# -- classification ------------------------------------------------------------------------


@dataclass(frozen=True)
class Row:
    name: str
    status: str
    note: str = ""


@dataclass(frozen=True)
class Table:
    group: str
    key: str  # "ray.serve.config", "ray.serve:run", ...
    rows: tuple[Row, ...]

    def count(self, status: str) -> int:
        return sum(row.status == status for row in self.rows)


def check_notes(tables: list[Table], notes: Mapping[tuple[str, str], str]) -> list[str]:
    """Notes that name an item missing on either side (or a note over one line)."""
    statuses = {(t.key, r.name): r.status for t in tables for r in t.rows}
    problems = []
    for (key, name), text in sorted(notes.items()):
        status = statuses.get((key, name))
        if status is None:
            problems.append(f"note on {key} {name!r}: Ray Serve has no such item")
        elif status == MISSING:
            problems.append(f"note on {key} {name!r}: surge does not have it")
        if "\n" in text or "|" in text:
            problems.append(f"note on {key} {name!r}: one line, no '|'")
    return problems


def _keys(surface: Mapping[str, Any], group: str) -> list[str]:
    """The group's tables in GROUPS' order; a snapshot that does not fit them is stale."""
    read, wanted = set(surface[group]), GROUPS[group]
    stale = read - set(wanted) if group == "names" else read ^ set(wanted)
    if stale:
        raise SystemExit(f"the snapshot's {group} {sorted(stale)} do not match this script's; "
                         "regenerate it from Ray Serve (python scripts/ray_compat.py)")
    return [key for key in wanted if key in read]  # a module Ray lacks has no table


def classify(surface: Mapping[str, Any],
             notes: Mapping[tuple[str, str], str] = NOTES) -> list[Table]:
    tables = []
    for group in GROUPS:
        for key in _keys(surface, group):
            known = KNOWN[group](key)
            rows = tuple(Row(n, known.status(n), notes.get((key, n), ""))
                         for n in sorted(surface[group][key]))
            tables.append(Table(group, key, rows))
    problems = check_notes(tables, notes)
    if problems:
        raise SystemExit("scripts/ray_compat.py NOTES:\n  " + "\n  ".join(problems))
    return tables


# -- the page ------------------------------------------------------------------------------

HEADINGS = {
    "names": "Names, module by module",
    "parameters": "Parameters",
    "fields": "Fields of the config classes",
    "config_file": "Keys of the config file (`serve deploy` YAML)",
}


def label(table: Table) -> str:
    module, _, qualname = table.key.partition(":")
    if table.group == "names":
        return f"`{module}`"
    dotted = f"{module}.{qualname}"
    return f"`{dotted}(...)`" if table.group == "parameters" else f"`{dotted}`"


def title(table: Table) -> str:
    if table.group == "names":
        return f"{label(table)} (surge: `{surge_path(table.key)}`)"
    if table.group == "config_file":
        return f"{label(table)}: {CONFIG_FILE[table.key][0]}"
    return label(table)


@dataclass(frozen=True)
class Behaviour:
    """A behaviour (not a name) in which surge differs from Ray Serve on purpose."""

    what: str
    ray: str
    surge: str
    why: str
    test: str  # "tests/path.py::test_name": the test that pins surge's side


# Behaviour that differs on purpose: what a Ray Serve user would notice, and the test that
# pins it (tests/test_ray_compat.py checks that each test exists). Ray's own tests of
# these run against surge (scripts/ray_suite/run.py) and fail there by design.
BEHAVIOURS: tuple[Behaviour, ...] = (
    Behaviour(
        "What a FastAPI app gets after `@serve.ingress(app)`",
        "the app is copied when the decorator runs: later routes, `include_router` calls, "
        "middleware and handlers are not used",
        "routes are frozen there as in Ray (a later route or `include_router` answers "
        "404); middleware, exception and event handlers added later are still used",
        "freezing routes needs no copy; copying the whole app at decoration would require "
        "every module-level app to be picklable when its module is imported",
        "tests/e2e/test_fastapi_classes.py::"
        "test_a_class_in_a_test_body_with_an_included_router"),
    Behaviour(
        "A FastAPI `BackgroundTasks` task and the response",
        "the response reaches the client while the task runs (Starlette runs it after the "
        "body is sent); Ray's `test_fastapi_features` reads the task's file right after "
        "the response and passes on Ray's slower path",
        "the same order, and surge's faster path answers before the task has written: "
        "that test reads an empty file",
        "holding every response until its background tasks end would delay what the "
        "tasks are for (work after the answer)",
        "tests/e2e/test_fastapi_classes.py::"
        "test_a_background_task_runs_after_the_response_is_sent"),
    Behaviour(
        "A thread lock in a deployment's arguments or class (FastAPI's `include_router` "
        "keeps one per router)",
        "refused (`TypeError: Could not serialize the deployment ...`) until the process "
        "has run one `serve.ingress(app)`; from then on every lock in every deployment "
        "travels as a fresh unlocked one",
        "in a `serve.ingress` deployment (its class, app and arguments) it travels as a "
        "fresh unlocked lock, so apps that include routers deploy; anywhere else it is "
        "refused with Ray's `TypeError`, naming the variable (`Model.hello -> lock`)",
        "the rule should not depend on what else the process decorated before; a lock "
        "meant to be shared by replicas is refused rather than silently one per replica",
        "tests/test_deployment_travel.py::test_an_ingress_apps_locks_still_travel_fresh"),
    Behaviour(
        "A deployment class or function defined at the top of an importable module",
        "pickled by value when decorated: the module-level objects its code uses (a lock, "
        "a client) must pickle, or the decorator raises `TypeError`",
        "travels by import path (replicas import the module), so what it uses need not "
        "pickle; by value (and checked when decorated, as Ray) only from `__main__` or "
        "from inside a function",
        "an importable module is importable on every replica of one machine; its code "
        "then runs there as written",
        "tests/test_deployment_travel.py::"
        "test_a_class_in_an_importable_module_travels_by_import_path"),
    Behaviour(
        "`runtime_env` keys other than `env_vars` (`pip`, `conda`, `working_dir`, ...)",
        "builds the environment for the replicas",
        "accepted with one warning and not used: replicas run in the driver's environment "
        "(a deployment's `working_dir` or `py_modules` given as a local path fails to "
        "deploy, and is refused in a config file, as in Ray)",
        "building environments per deployment is Ray's cluster machinery; install what an "
        "app needs in its image or venv (docs/using.md)",
        "tests/config/test_config_file.py::"
        "test_ray_fruit_config_warns_about_ray_only_keys_and_old_names"),
    Behaviour(
        "`ReplicaContext.rank.node_rank` and `.local_rank`",
        "the node's rank among the deployment's nodes, and the replica's on its node",
        "`node_rank` 0 and `local_rank` equal to `rank`: ranks are counted across nodes "
        "as on one",
        "surge places replicas per node without a per-node rank table yet",
        "tests/e2e/test_handles.py::test_replica_context"),
    Behaviour(
        "A request refused by surge's wait bound (`max_queued_requests` unset: "
        "`max_queue_wait_s`)",
        "never refused: the queue has no bound",
        "503 with `Retry-After` (the time the queue takes to drain, 1-10 s); under an "
        "explicit `max_queued_requests` no `Retry-After` unless "
        "`backpressure_config.retry_after_s` is set, as Ray",
        "Ray has no such refusal to match; a client told when to come back spreads its "
        "retries instead of hammering a full queue",
        "tests/e2e/test_queue_wait.py::test_http_refuses_at_once_what_would_wait_too_long"),
    Behaviour(
        "`handle.method.choose_replica()` then `.dispatch(selection, ...)`",
        "the slot is reserved on the replica, so the dispatch is accepted at once; the "
        "arguments reach a custom request router",
        "the slot is held by the caller's router (it counts against "
        "`max_ongoing_requests` there); if other routers filled the replica meanwhile, "
        "the dispatch waits for room on that same replica; the arguments are not used",
        "surge has no reserve message between router and replica, and no custom routers",
        "tests/shells/test_router_reservations.py::"
        "test_a_dispatch_the_chosen_replica_rejects_is_retried_there_only"),
    Behaviour(
        "`DeploymentHandle.init_options` and `.request_counter`",
        "the handle's private `InitHandleOptions` (None until its first call starts its "
        "router) and its `serve_handle_request_counter` metrics Counter",
        "`init_options` is always None and `request_counter` raises `AttributeError`; "
        "neither is taken for a deployment method (`handle_id` is Ray's: random, shared "
        "by the handles `.options()` makes)",
        "surge's handles start no router of their own (the process's runtime routes for "
        "all of them), and calls are counted per deployment "
        "(`serve_deployment_request_counter_total`), not per handle",
        "tests/test_handle_attributes.py::"
        "test_init_options_and_request_counter_are_not_deployment_methods"),
    Behaviour(
        "Handle calls made in a cancelled request's cleanup (`except CancelledError: "
        "await other.remote()`)",
        "cancelled too if still waiting for a replica when the handler exits",
        "not cancelled: the cleanup can still call other deployments",
        "a handler that cleans up after a cancel should be able to finish doing so",
        "tests/shells/test_child_calls.py::test_a_call_made_after_the_cancel_is_not_cancelled"),
    Behaviour(
        "`surge deploy FILE` and `surge run` when an application fails (a constructor "
        "raises, a module cannot be imported)",
        "`serve deploy` exits 0 once the request is sent, the other applications deploy "
        "and `serve status` shows the failed one DEPLOY_FAILED; `serve run` prints the "
        "traceback and exits 0",
        "both wait for the outcome and exit 1 with the reason; a file with an application "
        "that cannot be imported or validated changes nothing (`surge deploy -a "
        "http://HOST:PORT` returns when the REST API answers, as Ray's)",
        "a script or CI step learns from the exit code that its deploy failed",
        "tests/e2e/test_operations.py::"
        "test_cli_deploy_and_run_wait_and_exit_1_when_an_application_fails"),
    Behaviour(
        "`serve run --working-dir URI` (or a runtime_env `working_dir` URI: S3, GCS, a "
        "zip over HTTP)",
        "downloads the archive and runs the application from it",
        "refused with an error naming the URI: the code runs from a local directory "
        "(`-d/--app-dir`, or a local `working_dir`)",
        "surge does not fetch or unpack code; deploy the image or directory that holds it",
        "tests/e2e/test_operations.py::test_cli_run_refuses_a_remote_working_dir"),
    Behaviour(
        "`surge status`, `config` or `deploy` with no instance running (after `surge "
        "shutdown`), and `surge status -n` of an application that does not exist",
        "after `serve shutdown` the Ray cluster stays: `serve status` prints an empty "
        "status and `serve deploy` starts Serve again; `status -n` of a missing "
        "application logs an error and exits 0",
        "an instance is the cluster and Serve together, and `surge shutdown` stops both: "
        "the commands say that no instance answers and exit 1 (`surge start` starts "
        "one); `status -n` of a missing application exits 1",
        "surge has no cluster apart from its instance; a missing application is an error",
        "tests/e2e/test_deploy.py::test_cli_reports_a_missing_instance"),
    Behaviour(
        "The CLI's progress and result lines (`Sent deploy request successfully.`, "
        "`Sent shutdown request; applications will be deleted asynchronously.`, ...) and "
        "its config errors",
        "Ray's wording, on stderr or stdout through Ray's logger; a bad file is a pydantic "
        "`ValidationError` naming `ServeDeploySchema`",
        "surge's own lines (`surge: deployed FILE`, `surge: shut down`), and one line per "
        "error as `FILE:LINE: FIELD: what is wrong`; the documents a script reads "
        "(`status`, `config`, `build`) are Ray's, byte for byte",
        "surge's deploy and shutdown are synchronous, so Ray's sentences would be untrue; "
        "the exit code tells the outcome",
        "tests/e2e/test_ray_cli.py::test_surge_status_and_config_print_what_rays_cli_prints"),
)


def behaviours() -> list[str]:
    lines = ["## Behaviour that differs on purpose", "",
             "Beyond names: where surge does something else than Ray Serve on purpose, "
             "and the test that pins surge's side. Everything else an application sees is "
             "meant to be Ray's; Ray Serve's own test files measure it: `make ray-suite "
             "RAY_TESTS=<a Ray checkout>/python/ray/serve/tests` runs them on Ray Serve "
             "itself, then on surge with `ray.serve` pointed at surge, and counts the tests "
             "of user-visible behaviour that pass on Ray (scripts/ray_suite/run.py says "
             "which tests count as Ray's internals, and why).", "",
             "| behaviour | Ray Serve | surge | why | pinned by |", "|---|---|---|---|---|"]
    lines += [f"| {b.what} | {b.ray} | {b.surge} | {b.why} | `{b.test}` |"
              for b in BEHAVIOURS]
    return [*lines, ""]


def intro(surface: Mapping[str, Any], tables: list[Table], snapshot: str) -> list[str]:
    version = surface["ray_version"]
    callables = ", ".join(label(t) for t in tables if t.group == "parameters")
    lines = [
        "# Ray Serve compatibility, name by name",
        "",
        "<!-- Generated by scripts/ray_compat.py; edits here are overwritten. -->",
        "",
        f"Every public name of Ray Serve {version}'s Python API (the modules apps import, "
        f"the parameters of {callables}, the fields of the config classes, the keys of the "
        "config file), and what surge does with it:",
        "",
        f"- **{IMPLEMENTED}**: surge has it at Ray's path (`ray.serve.x` is "
        "`surge.serve.x`) and honours it;",
        f"- **{ACCEPTED}**: surge takes it, so that Ray Serve code loads and runs, and does "
        "not act on it; it logs a warning saying so, unless the note says otherwise;",
        f"- **{MISSING}**: importing the name fails; the argument or key is an error.",
        "",
        f"Read from Ray Serve {version}'s installed package into `docs/{snapshot}` "
        "(names only), and from surge's source. A module's public names are its "
        "`__all__` where it has one, else the names Ray marks `@PublicAPI` or "
        "`@DeveloperAPI` that the module itself defines; names starting with `_` are "
        "left out.",
    ]
    if surface["read_from_source"]:
        modules = ", ".join(f"`{m}`" for m in surface["read_from_source"])
        lines += ["", f"{modules}: read from the source's `__all__` (the module does not "
                      "import without its extra, e.g. `ray[llm]`)."]
    return [*lines, "",
            "Regenerate after changing surge's API: `python scripts/ray_compat.py "
            "--from-snapshot` (no Ray needed); after a Ray upgrade: `python "
            "scripts/ray_compat.py` (reads Ray Serve's virtualenv; `--create-venv` makes it "
            "first). `tests/test_ray_compat.py` fails when this page is stale.", ""]


def summary(tables: list[Table]) -> list[str]:
    lines = ["## Summary", "", "| | " + " | ".join(STATUSES) + " |",
             "|---|" + "---:|" * len(STATUSES),
             "| **all** | " + " | ".join(
                 f"**{sum(t.count(s) for t in tables)}**" for s in STATUSES) + " |"]
    for table in tables:
        counts = " | ".join(str(table.count(s)) for s in STATUSES)
        lines.append(f"| {label(table)} | {counts} |")
    return [*lines, ""]


def section(table: Table) -> list[str]:
    lines = [f"### {title(table)}", "", "| name | surge | note |", "|---|---|---|"]
    lines += [f"| `{r.name}` | {r.status} | {r.note}".rstrip() + " |" for r in table.rows]
    return [*lines, ""]


def render(surface: Mapping[str, Any], tables: list[Table], snapshot: str) -> str:
    lines = [*intro(surface, tables, snapshot), *summary(tables), *behaviours()]
    for group in GROUPS:
        lines += [f"## {HEADINGS[group]}", ""]
        for table in (t for t in tables if t.group == group):
            lines += section(table)
    return "\n".join(lines).rstrip("\n") + "\n"


# -- files and processes -------------------------------------------------------------------


def snapshot_name(version: str) -> str:
    return f"ray-surface-{'.'.join(version.split('.')[:2])}.json"


def snapshot_path() -> Path:
    found = sorted(DOCS.glob(SNAPSHOT_GLOB))
    if len(found) != 1:
        raise SystemExit(f"expected one docs/{SNAPSHOT_GLOB}, found {len(found)}")
    return found[0]


def expected_page(snapshot: Path) -> str:
    surface = json.loads(snapshot.read_text())
    return render(surface, classify(surface), snapshot.name)


def _bench_common() -> Any:
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    return importlib.import_module("bench.common")


def default_ray_python() -> str:
    return str(_bench_common().RAY_VENV / "bin" / "python")


def read_ray(python: str) -> dict[str, Any]:
    """Ray Serve's surface, dumped by `python` (a virtualenv with ray[serve])."""
    probe = subprocess.run([python, "-c", "import ray.serve"], capture_output=True) \
        if Path(python).exists() else None
    if probe is None or probe.returncode != 0:
        raise SystemExit(
            f"no Ray Serve at {python}. Make it (ray[serve]=={_bench_common().RAY_VERSION}, "
            "a few minutes, cached) with `python scripts/ray_compat.py --create-venv` "
            "(bench/common.py's ray_python), point SURGE_BENCH_RAY_VENV at a virtualenv "
            "with Ray Serve or pass --ray-python; or use --from-snapshot.")
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "surface.json"
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        subprocess.run([python, str(Path(__file__).resolve()), "--dump", str(out)],
                       check=True, cwd=tmp, env=env)
        surface: dict[str, Any] = json.loads(out.read_text())
    return surface


def write_snapshot(surface: Mapping[str, Any]) -> Path:
    path = DOCS / snapshot_name(surface["ray_version"])
    for stale in DOCS.glob(SNAPSHOT_GLOB):
        if stale != path:
            stale.unlink()
    path.write_text(json.dumps(surface, indent=1, sort_keys=True) + "\n")
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--ray-python", help="Python with ray[serve] (default: the "
                        "benchmarks' venv, bench/common.py, or $SURGE_BENCH_RAY_VENV)")
    parser.add_argument("--from-snapshot", action="store_true",
                        help="classify the checked-in snapshot; Ray not needed")
    parser.add_argument("--create-venv", action="store_true",
                        help="create Ray Serve's venv first if missing (a few minutes)")
    parser.add_argument("--dump", metavar="OUT", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.dump:
        Path(args.dump).write_text(json.dumps(dump()))
        return 0
    if args.from_snapshot:
        snapshot = snapshot_path()
    else:
        python = args.ray_python or (_bench_common().ray_python() if args.create_venv
                                     else default_ray_python())
        snapshot = write_snapshot(read_ray(python))
    TABLE.write_text(expected_page(snapshot))
    print(f"wrote {TABLE.relative_to(ROOT)} from {snapshot.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
