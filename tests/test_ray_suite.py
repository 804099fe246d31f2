"""The Ray-suite harness's own decisions: which of Ray's tests count, and the tally."""

from __future__ import annotations

import importlib.util
import os
import sys
import time
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from tests.eventually import eventually

HARNESS = Path(__file__).resolve().parent.parent / "scripts" / "ray_suite"


def _load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"ray_suite_{name}", HARNESS / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


run = _load("run")
surge_as_ray = _load("surge_as_ray")


def result(file: str, test: str, outcome: str, internal: str = "") -> dict[str, str]:
    """One test's row as the harness records it (`internal`: why it is Ray's own)."""
    return {"file": file, "test": test, "outcome": outcome, "internal": internal}


def test_a_test_that_reaches_rays_controller_is_internal() -> None:
    source = "def test_x(serve_instance):\n    client = _get_global_client()\n"
    assert surge_as_ray.internal_reason(source) is not None


def test_a_test_of_user_visible_behaviour_counts() -> None:
    source = (
        "def test_x(serve_instance):\n"
        "    from ray.serve._private.test_utils import check_running\n"
        "    serve.run(f.bind())\n"
        "    assert httpx.get(get_application_url()).text == 'hi'\n"
    )
    assert surge_as_ray.internal_reason(source) is None


def test_the_tally_leaves_internal_tests_and_skips_out() -> None:
    results = [
        result("a.py", "t1", "passed"),
        result("a.py", "t2", "failed"),
        result("a.py", "t3", "failed", internal="uses controller"),
        result("a.py", "t4", "skipped"),
        result("b.py", "t5", "passed"),
    ]
    summary = run.summarize(results)
    assert (summary["passed"], summary["counted"]) == (2, 3)
    assert summary["files"][0]["internal"] == 1 and summary["files"][0]["skipped"] == 1


def test_with_an_anchor_only_what_passes_on_ray_counts() -> None:
    results = [
        result("a.py", "t1", "passed"),
        result("a.py", "t2", "failed"),
        result("a.py", "stale", "failed"),
        result("b.py", "<collection>", "error"),
    ]
    anchor = [
        result("a.py", "t1", "passed"),
        result("a.py", "t2", "passed"),
        result("a.py", "stale", "failed"),
        result("a.py", "ray", "passed", internal="uses client."),
        # b.py imports on Ray, not on surge: its tests count, as failed
        result("b.py", "t3", "passed"),
    ]
    summary = run.summarize(results, anchor)
    assert (summary["passed"], summary["counted"]) == (1, 3)


def test_a_test_that_builds_a_ray_cluster_is_internal_one_that_only_starts_ray_counts() -> None:
    assert surge_as_ray.fixture_reason(["ray_cluster", "tmp_path"]) == "fixture ['ray_cluster']"
    assert surge_as_ray.fixture_reason(["ray_instance", "ray_shutdown"]) is None


def test_ray_serve_tests_reads_the_given_test_files(tmp_path: Path, monkeypatch: Any) -> None:
    (tmp_path / "test_config_files").mkdir()
    (tmp_path / "test_config_files" / "helper.py").write_text("g = 'bound'\n")
    monkeypatch.setenv("SURGE_AS_RAY_TESTS", str(tmp_path))
    monkeypatch.delitem(sys.modules, "ray.serve.tests", raising=False)
    surge_as_ray._tests_package()
    package = sys.modules["ray.serve.tests"]
    monkeypatch.delitem(sys.modules, "ray.serve.tests")
    assert list(package.__path__) == [str(tmp_path)]


def test_a_test_that_calls_a_ray_internal_imported_at_module_level_is_internal() -> None:
    import types

    def builder_helper() -> None: ...

    builder_helper.__module__ = "ray.serve._private.api"
    wait = lambda: None  # noqa: E731
    wait.__module__ = "ray.serve._private.test_utils"  # Ray's test helpers are fine
    module = types.SimpleNamespace(call_builder=builder_helper, wait_for=wait, LIMIT=3)
    private = surge_as_ray.private_names(module)
    assert private == {"call_builder": "ray.serve._private.api"}
    assert surge_as_ray.imported_private_reason("    call_builder(f, {})\n", private)
    assert surge_as_ray.imported_private_reason("    wait_for(lambda: True)\n", private) is None


def test_a_private_name_of_ray_serve_imported_at_module_level_is_internal() -> None:
    import types

    class _Wrapper: ...

    _Wrapper.__module__ = "ray.serve.multiplex"
    module = types.SimpleNamespace(_ModelMultiplexWrapper=_Wrapper)
    assert surge_as_ray.private_names(module) == {"_ModelMultiplexWrapper": "ray.serve.multiplex"}


def test_a_test_that_calls_a_helper_reaching_ray_internals_is_internal(tmp_path: Path) -> None:
    # a test module with a helper that reads a handle's private router, and one that does not
    path = tmp_path / "test_fake.py"
    path.write_text("def check_router(handle):\n    return handle._router.curr_replicas\n\n\n"
                    "def plain(x):\n    return x + 1\n")
    spec = importlib.util.spec_from_file_location("test_fake", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    helpers = surge_as_ray.internal_helpers(module, {})
    assert set(helpers) == {"check_router"}
    assert surge_as_ray.helper_reason("    wait_for_condition(check_router, handle=h)\n", helpers)
    assert surge_as_ray.helper_reason("    assert plain(1) == 2\n", helpers) is None


@pytest.mark.e2e
def test_a_file_that_hangs_past_its_limit_is_stopped_with_its_children(tmp_path: Path) -> None:
    child_pid = tmp_path / "child.pid"
    hang = ("import subprocess, sys, time\n"
            "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
            f"open({str(child_pid)!r}, 'w').write(str(child.pid))\n"
            "time.sleep(60)\n")
    log = tmp_path / "hang.log"
    started = time.monotonic()
    late = run.run_bounded([sys.executable, "-c", hang], tmp_path, dict(os.environ), log, 3)
    assert time.monotonic() - started < 30
    assert late == "the file ran past 3 s and was stopped\n"
    pid = int(child_pid.read_text())
    eventually(lambda: _gone(pid), 10, what=f"the hung file's child {pid} to be killed")
    assert run.run_bounded([sys.executable, "-c", "pass"], tmp_path, dict(os.environ),
                           log, 30) == ""


def _gone(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True
