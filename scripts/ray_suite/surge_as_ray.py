"""Ray Serve's own tests, run with `ray.serve` pointed at surge (scripts/ray_suite/run.py).

Loaded two ways: as a pytest plugin in the test process (`-p surge_as_ray`: aliases, the
fixtures Ray's tests/conftest.py defines, Ray's test helpers that read Ray's controller
replaced by ones that read surge's status, and each test's classification), and by
`sitecustomize.py` in every process the run starts (surge's controller, fork server,
replicas: the aliases, and a Ray connection made when a Ray actor handle, such as a test's
SignalActor, first arrives in a replica).

Real Ray stays underneath: `ray.init` starts a real (small) cluster, `ray.remote`, actors
and `ray.get` are Ray's; only `ray.serve` and its public modules are surge's.
"""

from __future__ import annotations

import importlib
import os
import re
import sys
import time
from typing import Any

# Ray Serve's public modules that surge has; everything under ray.serve._private stays Ray's.
PUBLIC = ("handle", "exceptions", "config", "context", "schema", "metrics", "grpc_util",
          "llm", "batching", "multiplex", "api")
_ALIASED = False


def alias() -> None:
    """Make `ray.serve` (and its public modules) surge's, keeping Ray's internals loaded."""
    global _ALIASED
    if _ALIASED:
        return
    _ALIASED = True
    import ray
    import ray.serve  # Ray's own first, so that ray.serve._private.* stay importable
    import ray.serve._private.constants
    import ray.serve._private.test_utils

    surge_serve = importlib.import_module("surge.serve")
    sys.modules["ray.serve"] = surge_serve
    ray.serve = surge_serve  # type: ignore[attr-defined]
    for name in PUBLIC:
        target = {"batching": "surge.replica.batching",
                  "multiplex": "surge.replica.multiplex"}.get(name, f"surge.serve.{name}")
        try:
            ray_module = importlib.import_module(f"ray.serve.{name}")
        except ImportError:
            ray_module = None
        try:
            module = sys.modules[f"ray.serve.{name}"] = importlib.import_module(target)
        except ImportError:
            sys.modules.pop(f"ray.serve.{name}", None)
            continue
        # Ray's private names that surge lacks (e.g. multiplex._ModelMultiplexWrapper),
        # so that a test file importing one still imports; the tests that use one are
        # internal (private_names), and run Ray's object.
        for attr, value in vars(ray_module or object).items():
            if attr.startswith("_") and not attr.startswith("__") and not hasattr(module, attr):
                setattr(module, attr, value)
    _connect_ray_on_demand()
    _moved_names()
    _tests_package()


def _tests_package() -> None:
    """`from ray.serve.tests.common.utils import ...` (and test_config_files) reads the given
    test files: Ray's wheel does not ship its tests, on surge's run nor on the anchor."""
    tests = os.environ.get("SURGE_AS_RAY_TESTS")
    if tests:
        import types
        package = types.ModuleType("ray.serve.tests")
        package.__path__ = [tests]
        sys.modules["ray.serve.tests"] = package


def _moved_names() -> None:
    """Test helpers that Ray moved between releases, where test files of other releases
    look for them (the stored test files are not all of one commit)."""
    import types

    import ray._common.test_utils as common_test_utils
    import ray._common.utils as common_utils
    import ray._private.test_utils as private_test_utils
    import ray._private.utils as private_utils

    for name in ("SignalActor", "Semaphore", "async_wait_for_condition", "wait_for_condition"):
        if hasattr(common_test_utils, name) and not hasattr(private_test_utils, name):
            setattr(private_test_utils, name, getattr(common_test_utils, name))
    if not hasattr(private_utils, "get_or_create_event_loop"):
        private_utils.get_or_create_event_loop = common_utils.get_or_create_event_loop
    if "ray._common.synchronization_actors" not in sys.modules:
        actors = types.ModuleType("ray._common.synchronization_actors")
        actors.SignalActor = common_test_utils.SignalActor  # type: ignore[attr-defined]
        actors.Semaphore = getattr(common_test_utils, "Semaphore", None)  # type: ignore[attr-defined]
        sys.modules[actors.__name__] = actors
    try:
        importlib.import_module("ray._private.pydantic_compat")
    except ImportError:
        sys.modules["ray._private.pydantic_compat"] = importlib.import_module(
            "ray._common.pydantic_compat")


def _connect_ray_on_demand() -> None:
    """In a replica, join the test's Ray cluster when a Ray handle is first unpickled."""
    import ray
    import ray.actor

    original = ray.actor.ActorHandle._deserialization_helper

    def helper(*args: Any, **kwargs: Any) -> Any:
        if not ray.is_initialized() and os.environ.get("RAY_ADDRESS"):
            ray.init(address=os.environ["RAY_ADDRESS"], log_to_driver=False,
                     namespace=os.environ.get("SURGE_AS_RAY_NAMESPACE"))
            from surge.process import at_exit

            # A replica leaves through os._exit right after the user's __del__: let the
            # Ray calls it made (a SignalActor's send) go out before the connection ends.
            # 0.5 s lost test_fastapi's shutdown-hook sends about one run in two on this
            # 2-core machine; 2 s lost none in four.
            at_exit(lambda: (time.sleep(2.0), ray.shutdown()))
        return original(*args, **kwargs)

    ray.actor.ActorHandle._deserialization_helper = helper  # type: ignore[method-assign]


# ---- helpers of ray.serve._private.test_utils that read Ray's controller ---------------

def _status() -> Any:
    from surge import serve
    return serve.status()


def get_application_url(protocol: Any = "HTTP", app_name: str = "default",
                        use_localhost: bool = True, is_websocket: bool = False,
                        exclude_route_prefix: bool = False,
                        from_proxy_manager: bool = False) -> str:
    if str(getattr(protocol, "value", protocol)).upper() == "GRPC":
        return "127.0.0.1:9000"
    prefix = ""
    if not exclude_route_prefix:
        app = _status().applications.get(app_name)
        prefix = (app.route_prefix or "") if app is not None else ""
        prefix = "" if prefix == "/" else prefix
    return f"{'ws' if is_websocket else 'http'}://127.0.0.1:8000{prefix}"


def get_application_urls(protocol: Any = "HTTP", app_name: str = "default",
                         use_localhost: bool = True, is_websocket: bool = False,
                         exclude_route_prefix: bool = False,
                         from_proxy_manager: bool = False) -> list[str]:
    return [get_application_url(protocol, app_name, use_localhost, is_websocket,
                                exclude_route_prefix)]


def check_running(app_name: str = "default") -> bool:
    app = _status().applications.get(app_name)
    assert app is not None and app.status == "RUNNING", app
    return True


def check_apps_running(apps: list[str]) -> bool:
    for name in apps:
        check_running(name)
    return True


def _running(name: str, app_name: str) -> int:
    app = _status().applications.get(app_name)
    if app is None or name not in app.deployments:
        return 0
    return int(app.deployments[name].replica_states.get("RUNNING", 0))


def check_num_replicas_eq(name: str, target: int, app_name: str = "default",
                          use_controller: bool = False) -> bool:
    assert _running(name, app_name) == target
    return True


def check_num_replicas_gte(name: str, target: int, app_name: str = "default") -> bool:
    assert _running(name, app_name) >= target
    return True


def check_num_replicas_lte(name: str, target: int, app_name: str = "default") -> bool:
    assert _running(name, app_name) <= target
    return True


def check_deployment_status(name: str, expected_status: Any, app_name: str = "default") -> bool:
    app = _status().applications[app_name]
    assert app.deployments[name].status == str(getattr(expected_status, "value", expected_status))
    return True


def request_with_retries(timeout: float = 30, app_name: str = "default") -> Any:
    import httpx
    deadline = time.monotonic() + timeout
    while True:
        try:
            return httpx.get(get_application_url("HTTP", app_name), timeout=timeout)
        except httpx.HTTPError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


REPLACED = {name: value for name, value in dict(globals()).items() if name in (
    "get_application_url", "get_application_urls", "check_running", "check_apps_running",
    "check_num_replicas_eq", "check_num_replicas_gte", "check_num_replicas_lte",
    "check_deployment_status", "request_with_retries")}


def _replace_helpers() -> None:
    ray_test_utils = sys.modules["ray.serve._private.test_utils"]
    for name, value in REPLACED.items():
        setattr(ray_test_utils, name, value)


# ---- which tests reach into Ray itself (left out of the count) -------------------------

# A test whose own source uses one of these reaches Ray Serve's internals (its controller,
# its actors, its private modules) or Ray's state API: what it checks is Ray's machinery,
# which surge replaces, so its result does not measure compatibility of user code.
INTERNAL = re.compile(
    r"_private|_get_global_client|serve_instance\.|client\.|ray\.util\.state|list_actors|"
    r"get_actor\(|ray\.kill|\._router\b|\._init\(|request_counter|"
    r"get_runtime_context|_run\(|\.remote\(\)\.get_actor|"
    r"ray\.get_actor|state_api|SERVE_CONTROLLER|ReplicaID|DeploymentID|_get_internal|"
    r"ray_start_regular|ray_cluster|ray\.nodes\(|placement_group|metrics_start|"
    r"RAY_SERVE_|haproxy|_to_object_ref|_get_or_create|serve\.context\._")
SAFE_PRIVATE = re.compile(r"ray\.serve\._private\.test_utils|ray\._common\.test_utils")


def internal_reason(source: str) -> str | None:
    """Why this test's source measures Ray's machinery rather than user-visible behaviour."""
    for line in source.splitlines():
        if SAFE_PRIVATE.search(line) and "_private" not in SAFE_PRIVATE.sub("", line):
            continue
        match = INTERNAL.search(line)
        if match:
            return f"uses {match.group(0)!r}: {line.strip()[:100]}"
    return None


# Fixtures of Ray's conftest that build Ray's own machinery (a multi-node cluster, the CLI's
# `ray start`, metrics and telemetry actors): a test that takes one checks that machinery.
# `ray_instance` is not among them: it only starts Ray (here, the run's Ray is joined) with
# the env vars a test gives, and those (RAY_SERVE_*) show in the test's source.
INTERNAL_FIXTURES = frozenset({"ray_start_stop", "ray_cluster", "manage_ray_with_telemetry",
                               "metrics_start_shutdown"})


def private_names(module: Any) -> dict[str, str]:
    """The test module's names bound to Ray's private functions and classes (imported
    from ray.serve._private.*, test helpers and constants aside): name -> module."""
    found: dict[str, str] = {}
    for name, value in getattr(module, "__dict__", {}).items():
        origin = getattr(value, "__module__", None) or ""
        private_module = (origin.startswith("ray.serve._private")
                          and not SAFE_PRIVATE.search(origin)
                          and not origin.endswith(".constants"))
        private_name = name.startswith("_") and origin.startswith(("ray.serve", "surge."))
        if callable(value) and (private_module or private_name):
            found[name] = origin
    return found


def imported_private_reason(source: str, private: dict[str, str]) -> str | None:
    """Why a test that calls one of those names measures Ray's machinery, or None."""
    for name, origin in private.items():
        if re.search(rf"\b{re.escape(name)}\b", source):
            return f"uses {name} (from {origin})"
    return None


def internal_helpers(module: Any, private: dict[str, str]) -> dict[str, str]:
    """The test module's own helper functions that reach Ray's internals: name -> why
    (a test that calls one, e.g. one that reads a handle's private router, is internal)."""
    import inspect

    found: dict[str, str] = {}
    for name, value in getattr(module, "__dict__", {}).items():
        if (inspect.isfunction(value) and not name.startswith("test")
                and value.__module__ == getattr(module, "__name__", None)):
            try:
                source = inspect.getsource(value)
            except (OSError, TypeError):
                continue
            why = internal_reason(source) or imported_private_reason(source, private)
            if why:
                found[name] = f"calls {name}, which {why}"
    return found


def helper_reason(source: str, helpers: dict[str, str]) -> str | None:
    for name, why in helpers.items():
        if re.search(rf"\b{re.escape(name)}\b", source):
            return why
    return None


def fixture_reason(fixtures: Any) -> str | None:
    """Why a test's fixtures make it measure Ray's machinery, or None."""
    used = sorted(INTERNAL_FIXTURES.intersection(fixtures))
    return f"fixture {used}" if used else None


# ---- the pytest plugin -------------------------------------------------------------------

def _anchor() -> bool:
    """The run is the anchor: Ray Serve 2.60 itself, nothing aliased (run.py --anchor)."""
    return os.environ.get("SURGE_AS_RAY_ANCHOR") == "1"


def _serve() -> Any:
    return importlib.import_module("ray.serve" if _anchor() else "surge.serve")


def pytest_configure(config: Any) -> None:
    if _anchor():
        _moved_names()
        _tests_package()
    else:
        alias()
        _replace_helpers()
    import ray
    # A cluster of its own ("local"): without it ray.init joins any cluster already running
    # on the machine (another session's), which refuses num_cpus and fails the whole file.
    ray.init(address="local", num_cpus=16, namespace="serve", include_dashboard=False,
             log_to_driver=False, ignore_reinit_error=True)
    original_init = ray.init

    def init_once(*args: Any, **kwargs: Any) -> Any:  # a test's own ray.init joins ours
        kwargs["ignore_reinit_error"] = True
        return original_init(*args, **kwargs)

    ray.init = init_once
    os.environ["RAY_ADDRESS"] = ray.get_runtime_context().gcs_address
    os.environ["SURGE_AS_RAY_NAMESPACE"] = "serve"


def pytest_unconfigure(config: Any) -> None:
    """Stop Serve and Ray, then exit: the results are written by now (junit), and a
    shutdown that hangs (Ray's, after some stale tests) must not hold the run."""
    import threading

    def stop() -> None:
        _serve().shutdown()
        import ray
        if ray.is_initialized():
            ray.shutdown()

    stopper = threading.Thread(target=stop, daemon=True)
    stopper.start()
    stopper.join(60)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def pytest_collection_modifyitems(session: Any, config: Any, items: list[Any]) -> None:
    import inspect
    for item in items:
        function = getattr(item, "function", None)
        try:
            source = inspect.getsource(function) if function else ""
        except (OSError, TypeError):
            source = ""
        module = getattr(item, "module", None)
        private = private_names(module)
        reason = (internal_reason(source) or imported_private_reason(source, private)
                  or helper_reason(source, internal_helpers(module, private))
                  or fixture_reason(getattr(item, "fixturenames", ())))
        item.user_properties.append(("internal", reason or ""))


def _clean() -> None:
    serve = _serve()
    try:
        for name in list(serve.status().applications):
            serve.delete(name)
    except Exception:
        serve.shutdown()


import pytest  # noqa: E402 (after the aliasing helpers, which child processes use alone)


@pytest.fixture
def serve_instance() -> Any:
    serve = _serve()
    serve.start(http_options={"host": "127.0.0.1", "port": 8000})
    yield None
    _clean()


@pytest.fixture
def _shared_serve_instance() -> Any:
    serve = _serve()
    serve.start(http_options={"host": "127.0.0.1", "port": 8000})
    yield None


def _shutdown_serve_after() -> Any:
    yield
    _serve().shutdown()


# Ray's conftest stops Ray too; here the run's one Ray cluster stays up for the next test.
serve_and_ray_shutdown = pytest.fixture(_shutdown_serve_after, name="serve_and_ray_shutdown")
ray_shutdown = pytest.fixture(_shutdown_serve_after, name="ray_shutdown")


@pytest.fixture
def ray_instance(request: Any) -> Any:
    """Ray's conftest starts Ray with the env vars a test gives; here the run's Ray is up."""
    saved = os.environ.copy()
    os.environ.update(getattr(request, "param", {}) or {})
    import ray
    yield ray.get_runtime_context()
    os.environ.clear()
    os.environ.update(saved)




@pytest.fixture
def shutdown_ray_and_serve() -> Any:
    serve = _serve()
    serve.shutdown()
    yield
    serve.shutdown()
