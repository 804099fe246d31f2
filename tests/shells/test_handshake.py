"""transport.handshake without sockets: frames in, frames out, one table of states."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from surge.transport.handshake import (
    AUTHENTICATE,
    CHALLENGE,
    NONCE_BYTES,
    TRANSITIONS,
    ClientHandshake,
    HandshakeFailed,
    HandshakeState,
    ServerHandshake,
    ServerUnproven,
)
from surge.transport.messages import Message, Push, Reply, Rpc

TOKEN = "the-token"
A, B = b"a" * NONCE_BYTES, b"b" * NONCE_BYTES


def talk(client: ClientHandshake, server: ServerHandshake) -> list[Message]:
    """Run both ends to the end; every frame that crossed, in order."""
    wire: list[Message] = [client.start()]
    to_server = [wire[0]]
    while to_server:
        answers = [frame for message in to_server for frame in server.receive(message)]
        wire += answers
        to_server = [frame for message in answers for frame in client.receive(message)]
        wire += to_server
    return wire


def test_two_ends_that_know_the_token_both_end_done_in_four_frames() -> None:
    client, server = ClientHandshake(TOKEN, A), ServerHandshake(TOKEN, B)
    wire = talk(client, server)
    assert (client.state, server.state) == (HandshakeState.DONE, HandshakeState.DONE)
    assert [type(m).__name__ for m in wire] == ["Rpc", "Reply", "Rpc", "Reply"]
    assert [m.method for m in wire if isinstance(m, Rpc)] == [CHALLENGE, AUTHENTICATE]
    assert all(TOKEN.encode() not in m.payload for m in wire)  # the token never travels


def test_a_server_without_the_token_is_caught_before_the_client_proves_anything() -> None:
    client, impostor = ClientHandshake(TOKEN, A), ServerHandshake("another", B)
    answer = impostor.receive(client.start())
    with pytest.raises(ServerUnproven):
        client.receive(answer[0])
    assert client.state is HandshakeState.FAILED  # and it sent no proof of its own


def test_a_client_without_the_token_is_refused() -> None:
    guesser, server = ClientHandshake("a-guess", A), ServerHandshake(TOKEN, B)
    answer = server.receive(guesser.start())
    # the guesser cannot verify the server's proof, so it stops there; a client that
    # replays a made-up proof anyway is refused:
    with pytest.raises(HandshakeFailed):
        server.receive(Rpc(id=0, method=AUTHENTICATE, payload=answer[0].payload[:32]))
    assert server.state is HandshakeState.FAILED


@pytest.mark.parametrize("first", [
    Rpc(id=1, method="hello", payload=b""),  # a client that does not know a handshake
    Rpc(id=0, method=AUTHENTICATE, payload=TOKEN.encode()),  # the old raw-token frame
    Rpc(id=0, method=CHALLENGE, payload=b"short"),
    Push(topic="load", payload=b""),
    Reply(id=0, ok=True, payload=b""),
])
def test_a_server_accepts_nothing_but_a_challenge_first(first: Message) -> None:
    server = ServerHandshake(TOKEN, B)
    with pytest.raises(HandshakeFailed):
        server.receive(first)
    assert server.state is HandshakeState.FAILED


def test_a_refusal_fails_the_client() -> None:
    client = ClientHandshake(TOKEN, A)
    client.start()
    with pytest.raises(HandshakeFailed, match="refused"):
        client.receive(Reply(id=0, ok=False, payload=b""))


def test_the_table_has_no_way_out_of_done_or_failed() -> None:
    assert TRANSITIONS[HandshakeState.DONE] == TRANSITIONS[HandshakeState.FAILED] == frozenset()
    assert set(TRANSITIONS) == set(HandshakeState)
    for state, targets in TRANSITIONS.items():
        assert state not in targets


def test_nonces_must_have_their_size() -> None:
    with pytest.raises(ValueError, match="16 bytes"):
        ClientHandshake(TOKEN, b"x")


frames = st.one_of(
    st.builds(Rpc, id=st.integers(0, 3), method=st.sampled_from([CHALLENGE, AUTHENTICATE, "x"]),
              payload=st.binary(max_size=48)),
    st.builds(Reply, id=st.integers(0, 3), ok=st.booleans(), payload=st.binary(max_size=48)),
)


@given(st.lists(frames, max_size=6))
def test_no_made_up_frames_make_a_server_trust_anyone(sequence: list[Message]) -> None:
    server = ServerHandshake(TOKEN, B)
    for message in sequence:
        try:
            server.receive(message)
        except HandshakeFailed:
            break
    assert server.state is not HandshakeState.DONE


@given(st.lists(frames, max_size=6))
def test_no_made_up_frames_make_a_client_trust_anyone(sequence: list[Message]) -> None:
    client = ClientHandshake(TOKEN, A)
    client.start()
    for message in sequence:
        try:
            client.receive(message)
        except HandshakeFailed:
            break
    assert client.state is not HandshakeState.DONE
