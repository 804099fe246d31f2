"""JSON lines between the bench's processes (never between surge's own: those speak
surge's protocol). Each process writes events on stdout and reads commands on stdin."""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any

__all__ = ["emit", "next_command", "read_commands"]


def emit(event: str, **fields: Any) -> None:
    sys.stdout.write(json.dumps({"ev": event, **fields}) + "\n")
    sys.stdout.flush()


async def read_commands() -> asyncio.StreamReader:
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=1 << 24)
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    return reader


async def next_command(reader: asyncio.StreamReader) -> dict[str, Any] | None:
    line = await reader.readline()
    if not line:
        return None
    command: dict[str, Any] = json.loads(line)
    return command
