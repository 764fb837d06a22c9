"""Reading server-sent events as a client: the `data:` payloads of a byte stream."""

from __future__ import annotations

from collections.abc import AsyncIterator


async def data_payloads(chunks: AsyncIterator[bytes]) -> AsyncIterator[list[bytes]]:
    """The `data:` payloads (stripped) of an SSE byte stream, one list per read: whatever
    the socket gave at once is split here, one wake-up per read rather than per line.
    Reads to the end of the body (callers skip what comes after `[DONE]`), so that an
    HTTP/1.1 connection can go back to its pool."""
    pending = b""
    async for data in chunks:
        payloads, pending = split_payloads(pending, data)
        if payloads:
            yield payloads


def split_payloads(pending: bytes, data: bytes) -> tuple[list[bytes], bytes]:
    """The complete `data:` payloads in `pending + data`, and the incomplete line left."""
    lines = (pending + data).split(b"\n")
    pending = lines.pop()
    return [line[5:].strip() for line in lines if line.startswith(b"data:")], pending
