"""Collects each scenario's outcome and prints the table at the end of the session."""

from __future__ import annotations

from typing import Any

import pytest

from tests.chaos.harness import Outcome, table

OUTCOMES: list[Outcome] = []


@pytest.fixture
def outcomes() -> list[Outcome]:
    return OUTCOMES


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if OUTCOMES:
        terminalreporter.section("chaos (short profile)")
        terminalreporter.write_line(table(OUTCOMES))
