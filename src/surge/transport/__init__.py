"""Framed, multiplexed messages over persistent TCP connections.

Every frame is a 4-byte big-endian length and a msgpack-encoded message (one of the
typed structs in `messages`). Many requests share one connection, told apart by id;
writes made in one event-loop turn leave in one syscall.
"""
