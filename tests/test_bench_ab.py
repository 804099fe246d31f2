"""bench/ab.py's reading of two sides' runs: which figures it compares and how."""

from __future__ import annotations

from bench.ab import figures_of, table


def test_figures_are_the_last_summary_lines_numbers() -> None:
    output = "summary: rps=1\nnoise\nsummary: rps=12504 ray_rps=nan note=fast p99_ms=0.81\n"
    assert figures_of(output) == {"rps": 12504.0, "p99_ms": 0.81}
    assert figures_of("a run that crashed\n") == {}


def test_the_table_compares_medians_of_keys_both_sides_printed() -> None:
    this = [{"rps": 100.0, "p99": 2.0}, {"rps": 120.0, "p99": 4.0}, {"rps": 110.0}]
    ref = [{"rps": 90.0, "old": 1.0}, {"rps": 88.0}, {}]
    text, medians = table(this, ref, "9430eea")
    assert medians == {"rps": 110.0, "ref_rps": 89.0}
    assert "| rps | 110 | 89 | 0.81 | 100, 120, 110 | 90, 88 |" in text
    assert "printed by one side only: p99, old" in text
