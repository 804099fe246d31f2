"""ChildCalls: the unfinished handle calls of one request, cancelled together."""

from __future__ import annotations

import threading

from surge.router.children import ChildCalls


class Call:
    def __init__(self) -> None:
        self.cancels = 0

    def cancel(self) -> None:
        self.cancels += 1


def test_cancel_reaches_the_unfinished_calls_once_and_only_them() -> None:
    calls = ChildCalls()
    done, running, queued = Call(), Call(), Call()
    leave_done = calls.join(done)
    calls.join(running)
    calls.join(queued)
    leave_done(None)  # finished: it leaves
    assert len(calls) == 2
    assert repr(calls) == "<ChildCalls unfinished=2>"
    calls.cancel()
    assert (done.cancels, running.cancels, queued.cancels) == (0, 1, 1)
    assert len(calls) == 0
    calls.cancel()  # a second cancel finds nothing left
    assert (running.cancels, queued.cancels) == (1, 1)


def test_a_call_made_after_the_cancel_is_not_cancelled() -> None:
    calls = ChildCalls()
    calls.cancel()
    clean_up = Call()  # a cancelled handler's clean-up may still call others
    leave = calls.join(clean_up)
    assert clean_up.cancels == 0
    leave(None)
    leave(None)  # leaving twice is harmless
    assert len(calls) == 0


def test_first_joins_from_several_threads_make_one_state() -> None:
    """Its state is made at the first join; threads joining at once all join the same."""
    calls = ChildCalls()
    assert len(calls) == 0 and repr(calls) == "<ChildCalls unfinished=0>"
    calls.cancel()  # nothing joined yet: nothing to cancel
    members = [Call() for _ in range(8)]
    barrier = threading.Barrier(len(members))

    def join(member: Call) -> None:
        barrier.wait()
        calls.join(member)

    threads = [threading.Thread(target=join, args=(member,)) for member in members]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(calls) == len(members)
    calls.cancel()
    assert [member.cancels for member in members] == [1] * len(members)
