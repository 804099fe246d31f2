"""What a replica measures of its engine's capacity (policy/llm_capacity.py), on explicit
times: the meter a real replica's OpenAI service and a simulated replica both feed."""

from __future__ import annotations

import pytest

from surge.policy.llm_capacity import MIN_BUSY_S, MIN_GAPS, WINDOW_S, CapacityMeter


def test_the_prefill_rate_is_tokens_answered_over_the_time_a_backlog_waited() -> None:
    meter = CapacityMeter(window_s=10.0)
    assert meter.report(0.0)["prefill_tokens_per_s"] == 0.0  # never measured
    meter.admitted(1_000, 0.0)
    meter.admitted(3_000, 0.0)
    assert meter.backlog_tokens == 4_000
    meter.first_token(1_000, 0.1)
    meter.first_token(3_000, 0.4)  # 4,000 tokens in 0.4 s of backlog
    meter.admitted(2_000, 5.0)  # idle from 0.4 to 5.0: not counted
    meter.first_token(2_000, 5.2)  # 6,000 in 0.6 s
    report = meter.report(5.5)
    assert report["prefill_tokens_per_s"] == pytest.approx(10_000)
    assert report["prompt_tokens"] == pytest.approx(2_000)
    assert report["prefill_backlog_tokens"] == 0.0
    assert meter.decoding == 3
    # an idle window keeps what was measured; an aborted request leaves the backlog
    meter.admitted(500, 30.0)
    meter.ended(500, False, 30.01)
    assert meter.report(31.0)["prefill_tokens_per_s"] == pytest.approx(10_000)
    assert meter.backlog_tokens == 0
    assert meter.report(31.0)["prompt_tokens"] == pytest.approx(500)  # the window's one


def test_a_report_measures_the_window_up_to_it_and_counts_an_open_backlog() -> None:
    meter = CapacityMeter()
    meter.admitted(10_000, 0.0)
    meter.first_token(10_000, 1.0)  # 10,000 tokens/s in the first window
    assert meter.report(1.0)["prefill_tokens_per_s"] == pytest.approx(10_000)
    meter.admitted(4_000, 20.0)
    meter.first_token(2_000, 21.0)  # 2,000 answered, 2,000 still waiting at the report
    report = meter.report(22.0)  # busy 20 -> 22: the report closes the busy time
    assert report["prefill_tokens_per_s"] == pytest.approx(1_000)  # the first window left
    assert report["prefill_backlog_tokens"] == 2_000.0
    assert report["prompt_tokens"] == pytest.approx(4_000)
    assert WINDOW_S == 10.0


def test_too_little_busy_time_or_nothing_answered_measures_nothing() -> None:
    short = CapacityMeter()
    short.admitted(100, 0.0)
    short.first_token(100, MIN_BUSY_S / 2)  # answered, in too short a time to tell
    assert short.report(1.0)["prefill_tokens_per_s"] == 0.0
    waiting = CapacityMeter()
    waiting.admitted(100, 0.0)  # busy long enough, nothing answered
    assert waiting.report(1.0)["prefill_tokens_per_s"] == 0.0
    waiting.first_token(100, 2.0)
    assert waiting.report(2.0)["prefill_tokens_per_s"] == pytest.approx(50)


def test_an_end_after_the_first_token_leaves_the_decode_batch() -> None:
    meter = CapacityMeter()
    meter.admitted(10, 0.0)
    meter.first_token(10, 0.1)
    assert (meter.decoding, meter.backlog_tokens) == (1, 0)
    meter.ended(10, True, 0.5)
    assert (meter.decoding, meter.backlog_tokens) == (0, 0)
    meter.first_token(10, 0.6)  # a first token the meter was not told of: never below 0
    assert meter.backlog_tokens == 0
    assert repr(meter) == ("<CapacityMeter backlog=0 decoding=1 prefill=0/s "
                           "decode=0.0000+0.00000/seq>")


def test_the_decode_cost_is_a_line_through_gap_against_batch() -> None:
    meter = CapacityMeter()
    for batch in range(1, 41):  # gap = 10 ms + 0.2 ms a sequence
        meter.gap(0.01 + 0.0002 * batch, batch)
    report = meter.report(1.0)
    assert report["decode_step_s"] == pytest.approx(0.01)
    assert report["decode_s_per_seq"] == pytest.approx(0.0002)


def test_a_batch_that_did_not_vary_gives_the_gap_per_sequence() -> None:
    meter = CapacityMeter()
    for _ in range(MIN_GAPS - 1):
        meter.gap(0.02, 10)
    assert meter.report(1.0)["decode_s_per_seq"] == 0.0  # too few gaps: not measured
    meter.gap(0.02, 10)
    report = meter.report(2.0)
    assert (report["decode_step_s"], report["decode_s_per_seq"]) == (0.0, pytest.approx(0.002))


@pytest.mark.parametrize(("gap", "expected"), [
    (lambda batch: 0.05 - 0.001 * batch, (0.0, 0.0295 / 20.5)),  # a falling line
    (lambda batch: -0.01 + 0.001 * batch, (0.0, 0.0105 / 20.5)),  # below 0 at batch 0
])
def test_a_line_that_cannot_be_a_cost_gives_the_gap_per_sequence(
        gap: object, expected: tuple[float, float]) -> None:
    meter = CapacityMeter()
    for batch in range(1, 41):
        meter.gap(gap(batch), batch)  # type: ignore[operator]
    report = meter.report(1.0)
    assert (report["decode_step_s"], report["decode_s_per_seq"]) == (
        expected[0], pytest.approx(expected[1]))


def test_gaps_without_a_batch_measure_no_cost() -> None:
    meter = CapacityMeter()
    for _ in range(MIN_GAPS):
        meter.gap(0.02, 0)
    report = meter.report(1.0)
    assert (report["decode_step_s"], report["decode_s_per_seq"]) == (0.0, 0.0)
