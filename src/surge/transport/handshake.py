"""The one handshake that guards the instance's token, sans-IO: frames in, frames out.

Every link that must be trusted opens with it: control connections (transport/rpc.py)
and routers' links to replicas over TCP (router/replica_link.py, replica/server.py).
Mutual HMAC-SHA256 challenge-response; the token itself never travels:

    client                                        server
    Rpc(CHALLENGE, client nonce)          ──▶
                                          ◀──     Reply(server nonce + server proof)
    (checks the server's proof)
    Rpc(AUTHENTICATE, client proof)       ──▶     (checks the client's proof)
                                          ◀──     Reply(ok)

A proof is HMAC(token, role + one nonce + the other). The client sends nothing that
matters before the server proved itself, the server accepts nothing before the client
did, and neither unpickles anything the other sent before the end (payloads here are
raw bytes). States and their legal moves are one table; anything else is
`HandshakeFailed` and the shell closes the link. Nonces are parameters (the shells pass
`secrets.token_bytes(NONCE_BYTES)`), so tests are exact.
"""

from __future__ import annotations

import enum
import hashlib
import hmac

from surge.transport.messages import Message, Reply, Rpc

__all__ = [
    "AUTHENTICATE",
    "CHALLENGE",
    "NONCE_BYTES",
    "TRANSITIONS",
    "ClientHandshake",
    "HandshakeFailed",
    "HandshakeState",
    "ServerHandshake",
    "ServerUnproven",
]

CHALLENGE = "challenge"
AUTHENTICATE = "authenticate"
NONCE_BYTES = 16
HANDSHAKE_ID = 0  # the frames' id: request ids start at 1 on every link


class HandshakeState(enum.StrEnum):
    START = "START"  # client: nothing sent yet
    CHALLENGED = "CHALLENGED"  # client: challenge sent, waiting for the server's proof
    PROVED = "PROVED"  # client: proof sent, waiting for the server's acceptance
    LISTENING = "LISTENING"  # server: waiting for a challenge
    ANSWERED = "ANSWERED"  # server: challenge answered, waiting for the client's proof
    DONE = "DONE"  # both proved themselves: the link is trusted
    FAILED = "FAILED"


S = HandshakeState
TRANSITIONS: dict[HandshakeState, frozenset[HandshakeState]] = {
    S.START: frozenset({S.CHALLENGED}),
    S.CHALLENGED: frozenset({S.PROVED, S.FAILED}),
    S.PROVED: frozenset({S.DONE, S.FAILED}),
    S.LISTENING: frozenset({S.ANSWERED, S.FAILED}),
    S.ANSWERED: frozenset({S.DONE, S.FAILED}),
    S.DONE: frozenset(),
    S.FAILED: frozenset(),
}


class HandshakeFailed(Exception):
    """The other end does not know the token, or does not speak the handshake."""


class ServerUnproven(HandshakeFailed):
    """The end we connected to could not prove that it knows the token (an impostor on
    the port, or a stale token here)."""


def proof(key: bytes, role: bytes, nonce: bytes, other: bytes) -> bytes:
    return hmac.new(key, role + nonce + other, hashlib.sha256).digest()


class _Handshake:
    def __init__(self, token: str, nonce: bytes, state: HandshakeState) -> None:
        if len(nonce) != NONCE_BYTES:
            raise ValueError(f"a handshake nonce is {NONCE_BYTES} bytes, got {len(nonce)}")
        self._key = token.encode()
        self._nonce = nonce
        self.state = state

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.state.value}>"

    @property
    def done(self) -> bool:
        return self.state is HandshakeState.DONE

    def _move(self, new: HandshakeState) -> None:
        if new not in TRANSITIONS[self.state]:
            raise HandshakeFailed(f"handshake cannot go from {self.state.value} to "
                                  f"{new.value}")
        self.state = new

    def _fail(self, why: str) -> HandshakeFailed:
        if self.state is not HandshakeState.FAILED:
            self._move(HandshakeState.FAILED)
        return HandshakeFailed(why)


class ClientHandshake(_Handshake):
    """The end that connects: proves itself only after the server has."""

    def __init__(self, token: str, nonce: bytes) -> None:
        super().__init__(token, nonce, HandshakeState.START)

    def start(self) -> Rpc:
        self._move(HandshakeState.CHALLENGED)
        return Rpc(id=HANDSHAKE_ID, method=CHALLENGE, payload=self._nonce)

    def receive(self, message: Message) -> list[Message]:
        """The server's answer; returns what to send next. Raises HandshakeFailed."""
        if not isinstance(message, Reply) or message.id != HANDSHAKE_ID:
            raise self._fail(f"the other end sent {type(message).__name__} during the "
                             "handshake")
        if not message.ok:
            raise self._fail("the other end refused the token")
        if self.state is HandshakeState.CHALLENGED:
            theirs, answer = message.payload[:NONCE_BYTES], message.payload[NONCE_BYTES:]
            if len(theirs) != NONCE_BYTES or not hmac.compare_digest(
                    answer, proof(self._key, b"server", self._nonce, theirs)):
                self._fail("")
                raise ServerUnproven("the other end could not prove that it knows the token")
            self._move(HandshakeState.PROVED)
            return [Rpc(id=HANDSHAKE_ID, method=AUTHENTICATE,
                        payload=proof(self._key, b"client", theirs, self._nonce))]
        if self.state is HandshakeState.PROVED:
            self._move(HandshakeState.DONE)
            return []
        raise self._fail(f"a reply in state {self.state.value}")


class ServerHandshake(_Handshake):
    """The end that accepts: answers a challenge, then checks the client's proof."""

    def __init__(self, token: str, nonce: bytes) -> None:
        super().__init__(token, nonce, HandshakeState.LISTENING)
        self._theirs = b""

    def receive(self, message: Message) -> list[Message]:
        """The client's next frame; returns what to send. Raises HandshakeFailed (then
        the shell may send its own refusal for an `Rpc` and closes the link)."""
        if not isinstance(message, Rpc):
            raise self._fail(f"the other end sent {type(message).__name__} before it "
                             "proved that it knows the token")
        if (self.state is HandshakeState.LISTENING and message.method == CHALLENGE
                and len(message.payload) == NONCE_BYTES):
            self._theirs = message.payload
            self._move(HandshakeState.ANSWERED)
            answer = self._nonce + proof(self._key, b"server", self._theirs, self._nonce)
            return [Reply(id=message.id, ok=True, payload=answer)]
        if (self.state is HandshakeState.ANSWERED and message.method == AUTHENTICATE
                and hmac.compare_digest(message.payload, proof(self._key, b"client",
                                                               self._nonce, self._theirs))):
            self._move(HandshakeState.DONE)
            return [Reply(id=message.id, ok=True, payload=b"")]
        raise self._fail(f"the other end sent {message.method!r} without a valid proof of "
                         "the token")
