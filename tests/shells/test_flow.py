"""transport.flow: the stream windows on both ends, without sockets."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from surge.transport.flow import FRAME_CHARGE, Credits, SendWindow, charge


def test_a_window_closes_once_spent_and_reopens_on_credit() -> None:
    window = SendWindow(1000)
    window.sent(900)  # 964 charged
    assert window.open
    window.sent(100)  # overdraws once: the frame was already allowed
    assert not window.open and window.left == 1000 - charge(900) - charge(100)
    window.credit(charge(900))
    assert window.open


def test_credit_comes_back_in_batches_of_half_a_window() -> None:
    credits = Credits(1000)  # returns credit once 500 is owed
    assert [credits.delivered(100) for _ in range(5)] == [0] * 5
    assert [credits.consumed(100) for _ in range(5)] == [0, 0, 0, 4 * charge(100), 0]
    assert credits.held == 0


def test_consumption_may_come_in_any_pieces_and_pays_whole_frames_only() -> None:
    credits = Credits(200)  # threshold 100: one frame's charge is enough
    credits.delivered(50)
    credits.delivered(50)
    assert credits.consumed(30) == 0  # part of the first frame: nothing whole yet
    assert credits.consumed(30) == charge(50)  # the first frame, and 10 of the second
    assert credits.held == 1
    assert credits.consumed(40) == charge(50)


def test_empty_frames_are_charged_and_passed_on_as_they_arrive() -> None:
    credits = Credits(4 * FRAME_CHARGE)  # threshold: two empty frames
    assert credits.delivered(0) == 0
    assert credits.delivered(0) == 2 * FRAME_CHARGE
    assert credits.held == 0


@given(st.lists(st.integers(0, 5000), min_size=1, max_size=60), st.data())
def test_a_consumer_that_passes_everything_on_never_stalls_the_sender(
        frames: list[int], data: st.DataObject) -> None:
    """The sender sends while its window is open; the consumer passes each delivered
    frame on in arbitrary pieces. Every frame gets sent: flow control never deadlocks."""
    window, credits = SendWindow(8192), Credits(8192)
    to_send, backlog = list(frames), 0  # payload delivered, not yet passed on
    for _ in range(40 * len(frames) + 40):  # each round passes a quarter of the backlog on
        while to_send and window.open:
            size = to_send.pop(0)
            window.sent(size)
            window.credit(credits.delivered(size))
            backlog += size
        if not to_send and not backlog:
            break
        piece = data.draw(st.integers(max(1, backlog // 4), backlog)) if backlog else 0
        backlog -= piece
        window.credit(credits.consumed(piece))
    assert to_send == [] and backlog == 0


@given(st.lists(st.integers(0, 3000), min_size=1, max_size=40))
def test_what_comes_back_never_exceeds_what_was_charged(frames: list[int]) -> None:
    credits = Credits(4096)
    returned = sum(credits.delivered(size) for size in frames)
    returned += credits.consumed(sum(frames))
    assert returned <= sum(charge(size) for size in frames)
