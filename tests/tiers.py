"""The suite's tiers: which tests are fast, and the check that keeps them so.

Every test is in exactly one tier. A test is slow when it carries one of SLOW_MARKERS;
every other test gets the `fast` marker, so `pytest -m fast` (`make test-fast`) runs
the unit and in-memory shell tests and `pytest -m "not fast"` the rest. `make test`
runs both.

Markers come from where a test lives, so a new file cannot forget them: every test
under a directory of DIRECTORY_MARKERS gets that directory's markers (a module may add
more with `pytestmark`). A test elsewhere that starts processes carries `e2e` itself.

The check: while a fast test runs (its setup, call and teardown), starting a process
(subprocess, fork, exec, spawn, os.system) raises at the call and fails the test,
naming the marker to add. It is structural, not a clock: a fast test may be as slow
as it likes on a loaded machine, but it may not start processes.
"""

from __future__ import annotations

import sys
from collections.abc import Generator
from pathlib import Path
from typing import Any

import pytest

TESTS = Path(__file__).resolve().parent

# tests/<directory>/... -> the markers each of its tests gets
DIRECTORY_MARKERS: dict[str, tuple[str, ...]] = {
    "e2e": ("e2e",),
    "chaos": ("chaos", "e2e"),
    "fuzz": ("fuzz", "e2e"),
    "ray": ("ray",),
    "multihost": ("multihost",),
    "llm": ("llm",),
}
SLOW_MARKERS = frozenset({"e2e", "chaos", "fuzz", "ray", "multihost"})
FAST = "fast"

# audit events (docs.python.org/3/library/audit_events.html) that start a process
PROCESS_EVENTS = frozenset({"subprocess.Popen", "os.fork", "os.forkpty", "os.posix_spawn",
                            "os.spawn", "os.exec", "os.system"})


class ProcessStartedInFastTest(RuntimeError):
    """A test in the fast tier started a process."""


class _Guard:
    """Refuses process starts while a fast test is running (one audit hook per process:
    Python has no way to remove one, so it stays and checks `active`)."""

    def __init__(self) -> None:
        self.active: str | None = None  # the fast test's node id
        self.started: list[str] = []  # what it tried to start

    def __call__(self, event: str, args: tuple[Any, ...]) -> None:
        if self.active is None or event not in PROCESS_EVENTS:
            return
        what = f"{event} {_short(args)}"
        self.started.append(what)
        raise ProcessStartedInFastTest(_message(self.active, [what]))


def _short(args: tuple[Any, ...]) -> str:
    text = repr(args[:2]) if args else ""
    return text if len(text) <= 200 else text[:200] + "..."


def _message(nodeid: str, started: list[str]) -> str:
    return (f"{nodeid} is in the fast tier but started a process ({'; '.join(started)}): "
            f"mark it e2e (pytest.mark.e2e) or move it under a directory of "
            f"tests/tiers.py's DIRECTORY_MARKERS")


GUARD = _Guard()
sys.addaudithook(GUARD)


def directory_markers(path: Path) -> tuple[str, ...]:
    try:
        parts = path.resolve().relative_to(TESTS).parts
    except ValueError:  # a test file outside tests/
        return ()
    return DIRECTORY_MARKERS.get(parts[0], ()) if len(parts) > 1 else ()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        for name in directory_markers(Path(str(item.path))):
            item.add_marker(name)
        if not any(item.get_closest_marker(name) for name in SLOW_MARKERS):
            item.add_marker(FAST)


def _guarded(item: pytest.Item) -> Generator[None, Any, Any]:
    if item.get_closest_marker(FAST) is None:
        return (yield)
    GUARD.active, GUARD.started = item.nodeid, []
    try:
        result = yield
    finally:
        GUARD.active = None
    if GUARD.started:  # raised at the call, but the code under test may have caught it
        pytest.fail(_message(item.nodeid, GUARD.started), pytrace=False)
    return result


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> Generator[None, Any, Any]:
    return (yield from _guarded(item))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Generator[None, Any, Any]:
    return (yield from _guarded(item))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item) -> Generator[None, Any, Any]:
    return (yield from _guarded(item))

