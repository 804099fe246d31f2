"""The suite's tiers (tests/tiers.py) and the coverage gate's scope (pyproject.toml)."""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from tests.tiers import (
    DIRECTORY_MARKERS,
    GUARD,
    SLOW_MARKERS,
    ProcessStartedInFastTest,
    directory_markers,
)

ROOT = Path(__file__).resolve().parents[1]
TESTS = ROOT / "tests"


def test_a_test_gets_the_markers_of_the_directory_it_lives_in() -> None:
    assert directory_markers(TESTS / "e2e" / "test_x.py") == ("e2e",)
    assert directory_markers(TESTS / "chaos" / "deep" / "test_x.py") == ("chaos", "e2e")
    assert directory_markers(TESTS / "multihost" / "test_x.py") == ("multihost",)
    assert directory_markers(TESTS / "shells" / "test_x.py") == ()
    assert directory_markers(TESTS / "test_x.py") == ()
    assert directory_markers(ROOT / "bench" / "test_x.py") == ()


def test_every_directory_of_the_rule_exists_and_the_slow_ones_are_slow() -> None:
    for directory, markers in DIRECTORY_MARKERS.items():
        assert (TESTS / directory).is_dir(), directory
        assert markers[0] == directory
    assert set(DIRECTORY_MARKERS) - {"llm"} <= SLOW_MARKERS  # llm's in-memory tests are fast


def test_this_test_is_in_the_fast_tier(request: pytest.FixtureRequest) -> None:
    assert request.node.get_closest_marker("fast") is not None
    assert GUARD.active == request.node.nodeid


def test_a_fast_test_that_starts_a_process_is_refused_at_the_call() -> None:
    with pytest.raises(ProcessStartedInFastTest, match="mark it e2e"):
        subprocess.run([sys.executable, "-c", "pass"], check=True)
    with pytest.raises(ProcessStartedInFastTest, match=r"os\.system"):
        os.system("true")
    assert [what.split()[0] for what in GUARD.started] == ["subprocess.Popen", "os.system"]
    GUARD.started.clear()  # refused as it should be: this test is no offender


def test_every_pattern_of_the_coverage_gate_names_a_file() -> None:
    # a core moved or renamed would otherwise leave the gate silently
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    patterns = config["tool"]["coverage"]["run"]["include"]
    assert patterns
    for pattern in patterns:
        assert [p for p in ROOT.glob(pattern) if p.suffix == ".py"], pattern
