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


def test_tracker_finds_first_token_usage_and_itl_across_split_events() -> None:
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
    assert tracker.itl() == pytest.approx(0.1)


def test_record_keeps_stream_measures_and_the_summary_reports_them() -> None:
    schedule = pulse(1, 2, baseline_s=1, ramp_s=0.1, hold_s=1, after_s=1)
    record = Record()
    for i in range(4):
        record.sent_at(i, 0.0)
        record.ok_at(i, i + 10, 1.0)
        record.stream_at(i, first_s=i * 0.1 + 0.05, done_s=i * 0.1 + 1.0, ttft_s=0.05,
                         itl_s=0.01, tokens=20)
    other = Record()
    other.sent_at(5, 0.0)
    other.ok_at(5, 6, 0.1)
    other.stream_at(5, first_s=0.52, done_s=0.6, ttft_s=0.02, itl_s=None, tokens=1)
    record.merge(other)
    summary = summarize(record, schedule, slo_ms=100)
    llm = summary["llm"]
    assert llm["streams"] == 5 and llm["output_tokens"] == 81
    assert llm["ttft_p50_ms"] == pytest.approx(50, rel=0.01)
    assert llm["itl_p99_ms"] == pytest.approx(10, rel=0.01)
    assert sum(record.tokens) == pytest.approx(81)
    points = series(record)
    assert points[0]["ttft_p99_ms"] == pytest.approx(50, rel=0.01)
    assert sum(p["tokens_per_s"] for p in points) / 10 == pytest.approx(81, rel=0.01)
    plain = Record()
    plain.sent_at(0, 0.0)
    plain.ok_at(0, 1, 0.01)
    assert summarize(plain, schedule, slo_ms=100)["llm"] is None
    assert "ttft_p50_ms" not in series(plain)[0]


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
    assert llm["ttft_p50_ms"] is not None and llm["itl_p50_ms"] is not None
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
                     "--out", str(tmp_path / "out")])
    assert code == 0
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    summary = report["summary"]
    assert summary["sent"] == summary["ok"] == 40
    assert summary["llm"]["output_tokens"] == sum(r.output_length for r in trace)
    assert report["run"]["llm"]["trace"].endswith("trace.jsonl")
    assert report["run"]["expected_requests"] == 40
