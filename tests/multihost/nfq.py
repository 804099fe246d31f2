"""`tc netem loss X delay Y` for kernels without sch_netem: NFQUEUE verdicts from userspace.

    python -m tests.multihost.nfq --queue 0 --loss 0.2 --delay 0.1   # inside the namespace

An iptables rule (`-t mangle -A PREROUTING -i eth0 -j NFQUEUE --queue-num 0
--queue-bypass`, made by netns.Network.impaired) hands each packet the host receives to
this process, which answers with a verdict over netlink (NETLINK_NETFILTER, the
nfnetlink_queue protocol, spoken here with `struct`: no library needed): NF_DROP at once
for a fraction `loss` of them (a seeded draw), NF_ACCEPT `delay` seconds after it saw the
others. The delay is the same for every packet, so order is kept, as netem's is.

It prints "ready" once bound. On SIGTERM it lets every held packet go, unbinds and exits
(and with --queue-bypass, packets pass unqueued once it is gone).
"""

from __future__ import annotations

import argparse
import collections
import errno
import random
import select
import signal
import socket
import struct
import sys
import time

NETLINK_NETFILTER = 12
SOL_NETLINK = 270
NETLINK_NO_ENOBUFS = 5
SO_RCVBUFFORCE = 33
NFNL_SUBSYS_QUEUE = 3
NFQNL_MSG_PACKET, NFQNL_MSG_VERDICT, NFQNL_MSG_CONFIG = 0, 1, 2
NFQA_PACKET_HDR = 1
NFQA_VERDICT_HDR = 2
NFQA_CFG_CMD, NFQA_CFG_PARAMS, NFQA_CFG_QUEUE_MAXLEN = 1, 2, 3
NFQA_CFG_MASK, NFQA_CFG_FLAGS = 4, 5
NFQA_CFG_F_FAIL_OPEN = 1
NFQNL_CFG_CMD_BIND, NFQNL_CFG_CMD_UNBIND = 1, 2
NFQNL_COPY_META = 1
NF_DROP, NF_ACCEPT = 0, 1
NLM_F_REQUEST, NLM_F_ACK = 1, 4
NLMSG_ERROR = 2
QUEUE_MAXLEN = 20_000  # packets held at once; past it the kernel lets them pass (fail open)


def _attr(kind: int, payload: bytes) -> bytes:
    length = 4 + len(payload)
    return struct.pack("=HH", length, kind) + payload + b"\0" * (-length % 4)


def _message(msg: int, queue: int, attrs: bytes, flags: int = NLM_F_REQUEST,
             seq: int = 0, family: int = socket.AF_UNSPEC) -> bytes:
    body = struct.pack("=BBH", family, 0, socket.htons(queue)) + attrs
    return struct.pack("=IHHII", 16 + len(body), (NFNL_SUBSYS_QUEUE << 8) | msg,
                       flags, seq, 0) + body


def _attrs(data: bytes) -> dict[int, bytes]:
    found, offset = {}, 0
    while offset + 4 <= len(data):
        length, kind = struct.unpack_from("=HH", data, offset)
        if length < 4:
            break
        found[kind & 0x7FFF] = data[offset + 4:offset + length]
        offset += (length + 3) & ~3
    return found


class Queue:
    def __init__(self, number: int) -> None:
        self.number = number
        self.sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_NETFILTER)
        self.sock.setsockopt(socket.SOL_SOCKET, SO_RCVBUFFORCE, 16 << 20)
        self.sock.setsockopt(SOL_NETLINK, NETLINK_NO_ENOBUFS, 1)
        self.sock.bind((0, 0))
        self.seq = 0
        self.pending: list[int] = []

    def _config(self, attrs: bytes) -> None:
        self.seq += 1
        self.sock.send(_message(NFQNL_MSG_CONFIG, self.number, attrs,
                                NLM_F_REQUEST | NLM_F_ACK, self.seq))
        while True:  # until its ack; packets read meanwhile are kept for packets()
            code = self._read(self.sock.recv(1 << 20), self.seq)
            if code is not None:
                if code:
                    raise OSError(-code, f"nfqueue config: {errno.errorcode.get(-code)}")
                return

    def _read(self, data: bytes, ack_seq: int = -1) -> int | None:
        """Keep the packet ids in `data`; the error code of the ack for `ack_seq`, if
        there is one in it."""
        offset, code = 0, None
        while offset + 16 <= len(data):
            length, kind, _, seq, _ = struct.unpack_from("=IHHII", data, offset)
            if length < 16:
                break
            if kind == (NFNL_SUBSYS_QUEUE << 8) | NFQNL_MSG_PACKET:
                header = _attrs(data[offset + 20:offset + length]).get(NFQA_PACKET_HDR)
                if header is not None:
                    self.pending.append(struct.unpack_from("!I", header)[0])
            elif kind == NLMSG_ERROR and seq == ack_seq:
                (code,) = struct.unpack_from("=i", data, offset + 16)
            offset += (length + 3) & ~3
        return code

    def bind(self) -> None:
        # one message: the kernel binds first, then applies the parameters
        self._config(_attr(NFQA_CFG_CMD, struct.pack("=BxH", NFQNL_CFG_CMD_BIND,
                                                     socket.htons(socket.AF_INET)))
                     + _attr(NFQA_CFG_PARAMS, struct.pack("!IB", 0, NFQNL_COPY_META))
                     + _attr(NFQA_CFG_QUEUE_MAXLEN, struct.pack("!I", QUEUE_MAXLEN))
                     + _attr(NFQA_CFG_FLAGS, struct.pack("!I", NFQA_CFG_F_FAIL_OPEN))
                     + _attr(NFQA_CFG_MASK, struct.pack("!I", NFQA_CFG_F_FAIL_OPEN)))

    def unbind(self) -> None:
        self._config(_attr(NFQA_CFG_CMD, struct.pack("=BxH", NFQNL_CFG_CMD_UNBIND,
                                                     socket.htons(socket.AF_INET))))

    def packets(self) -> list[int]:
        """The ids of the packets queued to us so far (reads without blocking)."""
        while True:
            try:
                self._read(self.sock.recv(1 << 20, socket.MSG_DONTWAIT))
            except BlockingIOError:
                break
        ids, self.pending = self.pending, []
        return ids

    def verdict(self, packet_id: int, verdict: int) -> None:
        self.sock.send(_message(NFQNL_MSG_VERDICT, self.number,
                                _attr(NFQA_VERDICT_HDR, struct.pack("!II", verdict,
                                                                    packet_id))))


def serve(queue: Queue, loss: float, delay_s: float, rng: random.Random) -> None:
    held: collections.deque[tuple[float, int]] = collections.deque()
    stopping = False

    def stop(signum: int, frame: object) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    while not stopping:
        timeout = max(held[0][0] - time.monotonic(), 0.0) if held else 0.5
        readable, _, _ = select.select([queue.sock], [], [], timeout)
        now = time.monotonic()
        if readable:
            for packet_id in queue.packets():
                if rng.random() < loss:
                    queue.verdict(packet_id, NF_DROP)
                else:
                    held.append((now + delay_s, packet_id))
        while held and held[0][0] <= now:
            queue.verdict(held.popleft()[1], NF_ACCEPT)
    for _, packet_id in held:
        queue.verdict(packet_id, NF_ACCEPT)
    queue.unbind()
    for packet_id in queue.packets():  # what came while unbinding
        queue.verdict(packet_id, NF_ACCEPT)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--queue", type=int, default=0)
    parser.add_argument("--loss", type=float, default=0.0, help="fraction dropped, 0..1")
    parser.add_argument("--delay", type=float, default=0.0, help="seconds held")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    queue = Queue(args.queue)
    queue.bind()
    print("ready", flush=True)
    serve(queue, args.loss, args.delay, random.Random(args.seed))
    return 0


if __name__ == "__main__":
    sys.exit(main())
