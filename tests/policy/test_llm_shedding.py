"""Admission against the TTFT objective (policy/llm_shedding.py)."""

from __future__ import annotations

import pytest

from surge.policy.llm_shedding import MIN_RETRY_AFTER_S, predicted_ttft_s, shed_retry_after


@pytest.mark.parametrize(("backlog", "prompt", "rate", "ttft_s", "retry"), [
    (0, 50_000, 10_000, 0.5, None),          # an idle engine takes any prompt
    (5_000, 1_000, 0, 0.5, None),            # no prefill rate measured yet: admit
    (2_000, 1_000, 10_000, 0.5, None),       # 0.3 s predicted: within 80% of the target
    (3_000, 1_000, 10_000, 0.5, None),       # 0.4 s: exactly 80% of it
    (3_500, 1_000, 10_000, 0.5, MIN_RETRY_AFTER_S),  # 0.45 s: shed, retry after 1 s
    (40_000, 1_000, 10_000, 0.5, 3.7),       # 4.1 s: shed, retry once drained to 0.4 s
])
def test_a_request_is_shed_when_its_predicted_ttft_misses_the_target(
        backlog: float, prompt: float, rate: float, ttft_s: float,
        retry: float | None) -> None:
    got = shed_retry_after(backlog, prompt, rate, ttft_s)
    assert got == (None if retry is None else pytest.approx(retry))


def test_predicted_ttft() -> None:
    assert predicted_ttft_s(9_000, 1_000, 20_000) == pytest.approx(0.5)
    assert predicted_ttft_s(9_000, 1_000, 0) == 0.0
