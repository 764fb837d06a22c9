"""The queue is huey's storage (SQLite file, or a Redis list shared by every worker).
It carries job ids only; the job book holds the truth. huey drops an entry when it is
dequeued, so a worker that dies between dequeue and claim loses the entry: the reaper
(worker.py) enqueues such jobs again, and a duplicate entry is harmless (the claim
refuses a job that is not queued)."""

from __future__ import annotations

import asyncio

from huey import RedisHuey, SqliteHuey
from huey.api import Huey
from redis import ConnectionPool

NAME = "redline-jobs"


def open_huey(url: str | None, sqlite_path: str, durable: bool = True,
              timeout_s: float = 2.0) -> Huey:
    if url and url.startswith(("redis://", "rediss://", "unix://")):
        # non-blocking pops: a blocked BRPOP would hold a thread of the event loop's pool;
        # timeouts: a paused Redis fails an enqueue in seconds (a 503), not in minutes
        pool = ConnectionPool.from_url(url, socket_connect_timeout=timeout_s,
                                       socket_timeout=timeout_s)
        return RedisHuey(NAME, connection_pool=pool, blocking=False)
    # durable: fsync each enqueue (synchronous=FULL), as the job record is, so a 202
    # survives a power cut; else fsync off, which WAL still makes survive a process kill
    return SqliteHuey(NAME, filename=sqlite_path, fsync=durable)


class JobQueue:
    def __init__(self, huey: Huey) -> None:
        self.huey = huey
        self.storage = huey.storage

    async def push(self, job_id: str) -> None:
        await asyncio.to_thread(self.storage.enqueue, job_id.encode())

    async def pop(self) -> str | None:
        data = await asyncio.to_thread(self.storage.dequeue)
        return None if data is None else bytes(data).decode()

    async def size(self) -> int:
        return int(await asyncio.to_thread(self.storage.queue_size))

    def close(self) -> None:
        close = getattr(self.storage, "close", None)
        if close is not None:
            close()
