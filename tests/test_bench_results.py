"""The README's benchmark table is bench/results.json rendered (bench/results.py): it
cannot drift from the figures the benchmarks recorded, with their date and commit."""

from __future__ import annotations

import pytest
from bench.results import (
    README,
    ROWS,
    entry,
    load,
    parse_summary,
    readme_table,
    record,
    render,
    with_table,
)


def test_the_readme_table_is_the_recorded_figures() -> None:
    assert readme_table(README.read_text()) == render(load()), (
        "the README's benchmark table differs from bench/results.json: "
        "run `.venv/bin/python bench/results.py render --write`")


def test_every_run_the_readme_quotes_says_when_and_on_what_it_ran() -> None:
    results = load()
    for script in {row.script for row in ROWS}:
        run = results[script]
        assert run["date"][:2] == "20" and len(run["date"]) == 10, script
        assert len(run["commit"]) >= 7 and run["command"].startswith(f"bench/{script}.py")


def test_a_summary_line_becomes_figures_and_replaces_only_its_scripts_run() -> None:
    output = "table...\nsummary: rps=1200 p99_ms=1.92 policy=proactive+standby\nbye\n"
    figures = parse_summary(output)
    assert figures == {"rps": 1200, "p99_ms": 1.92, "policy": "proactive+standby"}
    run = entry(figures, date="2026-12-05", commit="abc1234", command="bench/x.py")
    old = {"x": {"figures": {}}, "y": {"figures": {"kept": 1}}}
    assert record(old, "x", run) == {"x": run, "y": {"figures": {"kept": 1}}}
    with pytest.raises(ValueError, match="no `summary"):
        parse_summary("no summary here")


def test_a_missing_figure_names_the_run_and_the_figure() -> None:
    results = load()
    del results["memory"]["figures"]["ray_pss_mib"]
    with pytest.raises(KeyError, match="memory's run has no figure 'ray_pss_mib'"):
        render(results)


def test_writing_the_table_replaces_only_what_is_between_the_markers() -> None:
    readme = README.read_text()
    changed = with_table(readme, "| new |")
    assert readme_table(changed) == "| new |"
    before, after = readme.split(readme_table(readme))
    assert changed.startswith(before) and changed.endswith(after)
