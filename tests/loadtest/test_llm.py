"""`surge pulse --preset chat`: bodies, the SSE tracker, the record's stream measures and
the report's LLM part (pure), then a short pulse against the OpenAI app on the fake
engine (e2e)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from surge.loadtest.llm import LLMPreset, StreamTracker, parse_range
from surge.loadtest.options import PulseOptions
from surge.loadtest.report import compare_table, summary_table, write_report
from surge.loadtest.schedule import pulse
from surge.loadtest.slo import Slo
from surge.loadtest.stats import Record
from surge.loadtest.summary import series, summarize


def test_bodies_are_drawn_from_the_ranges_and_repeatable() -> None:
    preset = LLMPreset(model="m", prompt_words="3:5", max_tokens=(8, 9), seed=1)
    bodies = [json.loads(preset.body(seq)) for seq in range(50)]
    assert [json.loads(preset.body(seq)) for seq in range(50)] == bodies
    assert {b["max_tokens"] for b in bodies} == {8, 9}
    assert {len(b["messages"][0]["content"].split()) for b in bodies} == {3, 4, 5}
    assert all(b["stream"] and b["stream_options"] == {"include_usage": True}
               and b["model"] == "m" and b["ignore_eos"] for b in bodies)
    completions = json.loads(LLMPreset(kind="completions", ignore_eos=False).body(0))
    assert "prompt" in completions and "ignore_eos" not in completions
    assert parse_range(4) == (4, 4)
    with pytest.raises(ValueError):
        parse_range("9:3")
    with pytest.raises(ValueError):
        LLMPreset(kind="images")


def test_tracker_finds_first_token_usage_tpot_and_itl_across_split_events() -> None:
    role = b'data: {"choices":[{"delta":{"role":"assistant","content":""}}]}\n\n'
    token = b'data: {"choices":[{"delta":{"content":"hi"}}]}\n\n'
    usage = b'data: {"choices":[],"usage":{"completion_tokens":3}}\n\ndata: [DONE]\n\n'
    tracker = StreamTracker()
    tracker.feed(role, 0.1)
    assert tracker.first < 0  # the role chunk carries no token
    tracker.feed(token[:20], 0.2)
    tracker.feed(token[20:] + token, 0.3)
    tracker.feed(token + usage, 0.5)
    assert (tracker.first, tracker.last, tracker.events) == (0.3, 0.5, 3)
    assert tracker.tokens == 3
    assert tracker.tpot() == pytest.approx(0.1)
    # one gap per event after the first, as vLLM's client sees chunks: the first two
    # events came in one read (0 apart), the third 0.2 s later
    assert tracker.gaps == [0.0, pytest.approx(0.2)]


def test_tracker_reads_json_written_with_spaces() -> None:
    """Python's json.dumps writes `"content": "x"`: the same stream as vLLM's compact one."""
    spaced = StreamTracker()
    spaced.feed(b'data: {"choices": [{"delta": {"content": "hi"}}]}\n\n', 0.1)
    spaced.feed(b'data: {"choices": [{"text" : "yo"}]}\n\n', 0.3)
    spaced.feed(b'data: {"choices": [], "usage": {"completion_tokens": 2}}\n\n', 0.3)
    assert (spaced.first, spaced.last, spaced.events, spaced.tokens) == (0.1, 0.3, 2, 2)


def test_record_keeps_stream_measures_and_the_summary_reports_them() -> None:
    schedule = pulse(1, 2, baseline_s=1, ramp_s=0.1, hold_s=1, after_s=1)
    record = Record()
    for i in range(4):
        record.sent_at(i, 0.0)
        record.ok_at(i, i + 10, 1.0)
        record.stream_at(i, first_s=i * 0.1 + 0.05, done_s=i * 0.1 + 1.0, ttft_s=0.05,
                         tpot_s=0.01, tokens=20, gaps=[0.01] * 18 + [0.02], e2el_s=1.0)
    other = Record()
    other.sent_at(5, 0.0)
    other.ok_at(5, 6, 0.1)
    other.stream_at(5, first_s=0.52, done_s=0.6, ttft_s=0.02, tpot_s=None, tokens=1,
                    e2el_s=0.1)
    record.merge(other)
    summary = summarize(record, schedule, slo_ms=100)
    llm = summary["llm"]
    assert llm["streams"] == llm["completed"] == 5 and llm["output_tokens"] == 81
    assert llm["median_ttft_ms"] == pytest.approx(50, rel=0.01)
    assert llm["mean_ttft_ms"] == pytest.approx(44, rel=0.01)  # (4 x 50 + 20) / 5
    assert llm["p99_tpot_ms"] == pytest.approx(10, rel=0.01)
    assert llm["median_itl_ms"] == pytest.approx(10, rel=0.01)
    assert llm["p99_itl_ms"] == pytest.approx(20, rel=0.01)  # 4 of the 76 gaps
    assert (llm["median_e2el_ms"], llm["p99_e2el_ms"]) == (pytest.approx(1000, rel=0.01),
                                                           pytest.approx(1000, rel=0.01))
    assert llm["std_e2el_ms"] == pytest.approx(360, rel=0.01)  # 1.0 s x 4 and 0.1 s
    assert llm["goodput"] is None and llm["request_goodput"] is None
    assert llm["total_output_tokens"] == 81
    assert llm["request_throughput"] == pytest.approx(5 / llm["duration"], abs=1e-3)
    assert sum(record.tokens) == pytest.approx(81)
    points = series(record)
    assert points[0]["ttft_p99_ms"] == pytest.approx(50, rel=0.01)
    assert sum(p["tokens_per_s"] for p in points) / 10 == pytest.approx(81, rel=0.01)
    plain = Record()
    plain.sent_at(0, 0.0)
    plain.ok_at(0, 1, 0.01)
    assert summarize(plain, schedule, slo_ms=100)["llm"] is None
    assert "ttft_p50_ms" not in series(plain)[0]


def test_goodput_counts_the_streams_that_met_every_objective() -> None:
    schedule = pulse(1, 2, baseline_s=1, ramp_s=0.1, hold_s=1, after_s=1)
    record = Record(slo=Slo.parse(["ttft:100", "tpot:20"]))
    measures = [(0.05, 0.010, 1.0),  # good
                (0.15, 0.010, 1.0),  # TTFT over
                (0.05, 0.030, 1.0),  # TPOT over
                (0.10, None, 0.2)]  # one token: a TPOT of 0, TTFT on the objective: good
    for i, (ttft, tpot, e2el) in enumerate(measures):
        record.sent_at(i, 0.0)
        record.ok_at(i, i + 1, e2el)
        record.stream_at(i, first_s=ttft, done_s=e2el, ttft_s=ttft, tpot_s=tpot,
                         tokens=1 if tpot is None else 10, e2el_s=e2el)
    merged = Record()  # as the runner merges its workers' records
    merged.merge(record)
    llm = summarize(merged, schedule, slo_ms=100)["llm"]
    assert llm["goodput"] == {"ttft": 100.0, "tpot": 20.0}
    assert (llm["good_completed"], llm["goodput_pct"]) == (2, 50.0)
    assert llm["request_goodput"] == pytest.approx(2 / llm["duration"], abs=1e-3)
    assert Slo.parse({"e2el": 500}).met(9.0, 9.0, 0.5)
    assert not Slo.parse({"e2el": 500}).met(0.0, 0.0, 0.501)


def test_429s_are_counted_as_shed_and_goodput_is_also_over_served_and_shed() -> None:
    schedule = pulse(1, 2, baseline_s=1, ramp_s=0.1, hold_s=1, after_s=1)
    record = Record(slo=Slo.parse(["ttft:100"]))
    for i, ttft in enumerate((0.05, 0.05, 0.05, 0.5)):  # three good streams, one late
        record.sent_at(i, 0.0)
        record.ok_at(i, i + 1, 1.0)
        record.stream_at(i, first_s=ttft, done_s=1.0, ttft_s=ttft, tpot_s=0.01, tokens=10,
                         e2el_s=1.0)
    for i, kind in enumerate(("429", "429", "503", "timeout"), start=4):
        record.sent_at(i, 0.0)
        record.error_at(kind, i, i + 1)
    llm = summarize(record, schedule, slo_ms=100)["llm"]
    assert (llm["shed"], llm["shed_pct"], llm["failed_5xx"], llm["timeouts"]) == (
        2, 25.0, 1, 1)
    assert (llm["goodput_pct"], llm["goodput_of_answered_pct"]) == (75.0, 50.0)
    rows = dict(summary_table_rows(llm))
    assert rows["shed (429) / 5xx / timeouts"] == "2 (25%) / 1 / 1"


def summary_table_rows(llm: dict[str, object]) -> list[tuple[str, str]]:
    from surge.loadtest.llm_report import facts

    return facts({"llm": llm})


@pytest.mark.parametrize(("spec", "message"), [
    (["ttft"], "METRIC:MS"),
    (["ttft:fast"], "not a number of milliseconds"),
    (["latency:5"], "latency"),
    (["ttft:0"], "goodput ttft"),
    ({}, "at least one of ttft, tpot, e2el"),
])
def test_bad_goodput_objectives_say_what_is_wrong(spec: object, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Slo.parse(spec)  # type: ignore[arg-type]


def test_goodput_comes_from_the_flag_or_the_scenario_and_is_reported() -> None:
    preset = LLMPreset.from_spec({"goodput": {"ttft": 200, "tpot": 50}})
    assert preset.goodput == Slo(ttft_ms=200, tpot_ms=50)
    assert LLMPreset.from_spec(preset.to_spec()) == preset
    assert LLMPreset(goodput=["e2el:900"]).goodput == Slo(e2el_ms=900)  # type: ignore[arg-type]


def test_options_point_at_the_openai_path_and_post_json() -> None:
    options = PulseOptions(url="http://127.0.0.1:8000/v1", schedule=pulse(1, 2),
                           llm=LLMPreset())
    assert options.url == "http://127.0.0.1:8000/v1/chat/completions"
    assert options.method == "POST"
    assert ("content-type", "application/json") in options.headers
    assert options.describe()["llm"]["kind"] == "chat"
    assert options.plan().llm is not None


@pytest.mark.e2e
def test_a_chat_pulse_against_the_fake_engine(tmp_path: Path) -> None:
    from surge import serve
    from surge.loadtest.runner import run_pulse
    from surge.serve.llm import build_openai_app
    from tests.e2e.conftest import running_instance

    with running_instance() as running:
        serve.run(build_openai_app({"llm_configs": [{
            "model_loading_config": {"model_id": "fake"},
            "llm_engine": "surge.testing:FakeLLMEngine",
            "engine_kwargs": {"max_model_len": 512, "token_delay_s": 0.002}}]}),
            name="llm", route_prefix="/")
        options = PulseOptions(url=running.url, schedule=pulse(5, 20, baseline_s=1, ramp_s=0.2,
                                                               hold_s=1, after_s=0.5),
                               llm=LLMPreset(max_tokens="4:8"), surge_address="")
        report = run_pulse(options, quiet=True).report
    summary = report["summary"]
    assert summary["ok"] == summary["sent"] > 0
    llm = summary["llm"]
    assert llm["streams"] == summary["ok"]
    assert 4 * llm["streams"] <= llm["output_tokens"] <= 8 * llm["streams"]
    assert llm["median_ttft_ms"] is not None and llm["median_itl_ms"] is not None
    assert llm["median_tpot_ms"] is not None and llm["p99_e2el_ms"] is not None
    paths = write_report(report, tmp_path)
    assert paths["streams"].stat().st_size > 0
    assert "time to first token" in paths["html"].read_text()
    assert "time to first token p50 / p99" in summary_table(report)
    assert "output tokens/s mean / peak" in compare_table([report, report], ["a", "b"])


@pytest.mark.e2e
def test_surge_pulse_replays_a_trace_against_mock_engines(tmp_path: Path) -> None:
    import random

    from surge import serve
    from surge.cli.main import main
    from surge.loadtest.traces import TraceRequest, mooncake_shaped, write_mooncake
    from surge.serve.llm import build_openai_app
    from tests.e2e.conftest import running_instance

    trace = [TraceRequest(r.at_s, min(r.input_length, 300), min(r.output_length, 8),
                         r.hash_ids) for r in mooncake_shaped(40, 20.0, random.Random(5))]
    write_mooncake(trace, tmp_path / "trace.jsonl")
    with running_instance() as running:
        serve.run(build_openai_app({"llm_configs": [{
            "model_loading_config": {"model_id": "mock"},
            "llm_engine": "surge.testing:MockVLLMEngine",
            "engine_kwargs": {"max_model_len": 1024, "step_s": 0.002},
            "deployment_config": {"num_replicas": 2}}]}), name="llm", route_prefix="/")
        code = main(["pulse", running.url, "--trace", str(tmp_path / "trace.jsonl"),
                     "--trace-speed", "2", "--quiet", "--surge-address", "",
                     "--goodput", "ttft:60000", "tpot:0.001",
                     "--out", str(tmp_path / "out")])
    assert code == 0
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    summary = report["summary"]
    assert summary["sent"] == summary["ok"] == 40
    assert summary["llm"]["output_tokens"] == sum(r.output_length for r in trace)
    assert report["run"]["llm"]["trace"].endswith("trace.jsonl")
    assert report["run"]["expected_requests"] == 40
    # no stream of more than one token decodes in 1 µs a token: only one-token ones are good
    assert report["run"]["llm"]["goodput"] == {"ttft": 60000.0, "tpot": 0.001}
    assert summary["llm"]["good_completed"] == sum(r.output_length <= 1 for r in trace)
