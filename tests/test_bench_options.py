"""bench/common.options: a benchmark's command line from its defaults."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from bench.common import options

DOC = "What it measures.\nStill the first paragraph.\n\nThe rest."


def test_each_default_gives_an_option_of_its_type(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("sys.argv", ["b.py", "--max-tokens", "7", "--hold-s", "2",
                                     "--quick", "--out", "x.json"])
    args = options(DOC, max_tokens=4, hold_s=10.0, systems="surge,ray", quick=False,
                   full_sets=False, out=Path("reports") / "r.json")
    assert vars(args) == {"max_tokens": 7, "hold_s": 2.0, "systems": "surge,ray",
                          "quick": True, "full_sets": False, "out": Path("x.json")}
    assert type(args.hold_s) is float


def test_help_texts_and_the_description(monkeypatch: pytest.MonkeyPatch,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr("sys.argv", ["b.py", "--help"])
    with pytest.raises(SystemExit):
        options(DOC, {"users": "concurrent users per arm"}, users=6)
    text = capsys.readouterr().out
    assert "What it measures. Still the first paragraph." in " ".join(text.split())
    assert "The rest" not in text
    assert "concurrent users per arm" in text


@pytest.mark.parametrize(("helps", "defaults", "error"), [
    ({"user": "a typo"}, {"users": 6}, "help for options that do not exist: ['user']"),
    ({}, {"on": True}, "--on: a default of True gives no type"),
    ({}, {"limit": None}, "--limit: a default of None gives no type"),
])
def test_mistakes_in_the_table_are_refused(monkeypatch: pytest.MonkeyPatch,
                                           helps: dict[str, str], defaults: dict[str, object],
                                           error: str) -> None:
    monkeypatch.setattr("sys.argv", ["b.py"])
    with pytest.raises(TypeError, match=re.escape(error)):
        options(DOC, helps, **defaults)
