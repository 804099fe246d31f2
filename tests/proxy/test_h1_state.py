"""proxy/h1_state.py: the two lifecycles as tables, and the one error for what is not in them."""

from __future__ import annotations

import pytest

from surge.proxy.h1_state import (
    CONNECTION,
    EXCHANGE,
    Conn,
    ConnEvent,
    H1StateError,
    Phase,
    PhaseEvent,
)

C, CE, P, PE = Conn, ConnEvent, Phase, PhaseEvent

# Every legal move, written out: the tables must say exactly this and nothing more.
CONNECTION_MOVES = {
    (C.IDLE, CE.BEGIN): C.HEADERS,
    (C.IDLE, CE.DECLINE): C.CLOSED,
    (C.IDLE, CE.IDLE_TIMEOUT): C.CLOSED,
    (C.IDLE, CE.REFUSE): C.CLOSING,
    (C.IDLE, CE.CLOSE): C.CLOSED,
    (C.IDLE, CE.LOST): C.CLOSED,
    (C.HEADERS, CE.HEADERS_END): C.BODY,
    (C.HEADERS, CE.REFUSE): C.CLOSING,
    (C.HEADERS, CE.CLOSE): C.CLOSED,
    (C.HEADERS, CE.LOST): C.CLOSED,
    (C.BODY, CE.END): C.IDLE,
    (C.BODY, CE.LAST): C.CLOSING,
    (C.BODY, CE.REFUSE): C.CLOSING,
    (C.BODY, CE.CLOSE): C.CLOSED,
    (C.BODY, CE.LOST): C.CLOSED,
    (C.BODY, CE.UPGRADE): C.UPGRADED,
    (C.UPGRADED, CE.CLOSE): C.CLOSED,
    (C.UPGRADED, CE.LOST): C.CLOSED,
    (C.CLOSING, CE.CLOSE): C.CLOSED,
    (C.CLOSING, CE.LOST): C.CLOSED,
    (C.CLOSED, CE.LOST): C.CLOSED,
}

EXCHANGE_MOVES = {
    (P.QUEUED, PE.DISPATCH): P.WAITING,
    (P.QUEUED, PE.END): P.DONE,  # answered by the proxy itself
    (P.QUEUED, PE.GONE): P.ABANDONED,
    (P.WAITING, PE.STREAM): P.STREAMING,
    (P.WAITING, PE.END): P.DONE,
    (P.WAITING, PE.GONE): P.ABANDONED,
    (P.WAITING, PE.DETACH): P.DETACHED,
    (P.WAITING, PE.ACCEPT): P.OPEN,
    (P.OPEN, PE.MESSAGE): P.OPEN,
    (P.OPEN, PE.END): P.DONE,
    (P.OPEN, PE.CUT): P.DONE,
    (P.DONE, PE.MESSAGE): P.DONE,
    (P.STREAMING, PE.BODY): P.STREAMING,
    (P.STREAMING, PE.END): P.DONE,
    (P.STREAMING, PE.CUT): P.DONE,
    (P.STREAMING, PE.GONE): P.ABANDONED,
    (P.STREAMING, PE.DETACH): P.DETACHED,
    (P.DONE, PE.GONE): P.DONE,
    (P.DETACHED, PE.FRAME): P.DETACHED,
    (P.DETACHED, PE.SETTLE): P.ABANDONED,
}


@pytest.mark.parametrize("state", list(Conn))
@pytest.mark.parametrize("event", list(ConnEvent))
def test_connection_table(state: Conn, event: ConnEvent) -> None:
    expected = CONNECTION_MOVES.get((state, event))
    if expected is None:
        with pytest.raises(H1StateError, match=f"{event.name} is not allowed in {state.name}"):
            CONNECTION[state][event]
    else:
        assert CONNECTION[state][event] is expected


@pytest.mark.parametrize("phase", list(Phase))
@pytest.mark.parametrize("event", list(PhaseEvent))
def test_exchange_table(phase: Phase, event: PhaseEvent) -> None:
    expected = EXCHANGE_MOVES.get((phase, event))
    if expected is None:
        with pytest.raises(H1StateError, match=f"{event.name} is not allowed in {phase.name}"):
            EXCHANGE[phase][event]
    else:
        assert EXCHANGE[phase][event] is expected


def test_every_state_has_a_row_and_the_ends_are_ends() -> None:
    assert set(CONNECTION) == set(Conn)
    assert set(EXCHANGE) == set(Phase)
    assert dict(CONNECTION[C.CLOSED]) == {CE.LOST: C.CLOSED}  # once closed, only the news
    assert dict(EXCHANGE[P.ABANDONED]) == {}


@pytest.mark.parametrize("path", [
    [PE.DISPATCH, PE.END],  # one frame
    [PE.DISPATCH, PE.STREAM, PE.BODY, PE.BODY, PE.END],  # a stream
    [PE.DISPATCH, PE.STREAM, PE.CUT],  # a stream that failed
    [PE.END, PE.GONE],  # the proxy's own answer, then the client left
    [PE.DISPATCH, PE.DETACH, PE.FRAME, PE.SETTLE],  # runs on without its client
    [PE.GONE],  # the client left before its turn
])
def test_lifecycles_of_an_exchange(path: list[PhaseEvent]) -> None:
    phase = P.QUEUED
    for event in path:
        phase = EXCHANGE[phase][event]
    assert phase in (P.DONE, P.ABANDONED)


def test_hashing_is_by_identity() -> None:
    # the tables are looked up several times per request: no Python-level __hash__
    assert hash(C.IDLE) == object.__hash__(C.IDLE)
    assert hash(PE.END) == object.__hash__(PE.END)
