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
        lines = (pending + data).split(b"\n")
        pending = lines.pop()
        payloads = [line[5:].strip() for line in lines if line.startswith(b"data:")]
        if payloads:
            yield payloads
