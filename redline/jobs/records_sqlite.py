"""Job records in SQLite (the embedded default): WAL, so a committed write survives a
kill -9 of any process (and, durable, a power cut); several processes on one machine
may share the file."""

from __future__ import annotations

import sqlite3
import threading

from redline.jobs.records import Txn, Write

_SCHEMA = (
    "create table if not exists kv (key text primary key, value blob not null)",
    "create table if not exists idx (name text not null, member text not null, "
    "score real not null, primary key (name, member))",
    "create index if not exists idx_score on idx (name, score)",
)


class SQLiteRecords:
    def __init__(self, path: str, durable: bool = True) -> None:
        self.url = f"sqlite:///{path}"
        self._lock = threading.Lock()  # one connection, used from worker threads
        self._db = sqlite3.connect(path, timeout=30, check_same_thread=False,
                                   isolation_level=None)
        self._db.execute("pragma journal_mode=wal")
        # FULL: the WAL is fsynced at each commit, so an accepted job survives a power
        # cut; NORMAL: no fsync per commit, durable against a process crash only (the
        # WAL is in the OS page cache). docs/BENCHMARKS.md has what FULL costs.
        self._db.execute(f"pragma synchronous={'full' if durable else 'normal'}")
        for sql in _SCHEMA:
            self._db.execute(sql)

    def get(self, key: str) -> bytes | None:
        with self._lock:
            row = self._db.execute("select value from kv where key = ?", (key,)).fetchone()
        return None if row is None else bytes(row[0])

    def put(self, key: str, value: bytes) -> None:
        with self._lock:
            self._db.execute("insert or replace into kv (key, value) values (?, ?)", (key, value))

    def delete(self, key: str) -> None:
        with self._lock:
            self._db.execute("delete from kv where key = ?", (key,))

    def transact(self, key: str, fn: Txn) -> Write | None:
        with self._lock:
            db = self._db
            db.execute("begin immediate")  # takes the write lock before the read
            try:
                row = db.execute("select value from kv where key = ?", (key,)).fetchone()
                write = fn(None if row is None else bytes(row[0]))
                if write is not None:
                    db.execute("insert or replace into kv (key, value) values (?, ?)",
                               (key, write.value))
                    for name, score in write.indexes.items():
                        if score is None:
                            db.execute("delete from idx where name = ? and member = ?", (name, key))
                        else:
                            db.execute("insert or replace into idx (name, member, score) "
                                       "values (?, ?, ?)", (name, key, score))
            except BaseException:
                db.execute("rollback")
                raise
            db.execute("commit")
            return write

    def members(self, index: str) -> list[tuple[str, float]]:
        with self._lock:
            rows = self._db.execute("select member, score from idx where name = ? "
                                    "order by score, member", (index,)).fetchall()
        return [(str(m), float(s)) for m, s in rows]

    def page(self, index: str, limit: int, after: str | None = None) -> list[tuple[str, float]]:
        with self._lock:
            if after is None:
                rows = self._db.execute("select member, score from idx where name = ? "
                                        "order by score desc, member desc limit ?",
                                        (index, limit)).fetchall()
            else:
                at = self._db.execute("select score from idx where name = ? and member = ?",
                                      (index, after)).fetchone()
                if at is None:
                    return []
                rows = self._db.execute(
                    "select member, score from idx where name = ? and (score < ? or "
                    "(score = ? and member < ?)) order by score desc, member desc limit ?",
                    (index, at[0], at[0], after, limit)).fetchall()
        return [(str(m), float(s)) for m, s in rows]

    def count(self, index: str) -> int:
        with self._lock:
            row = self._db.execute("select count(*) from idx where name = ?", (index,)).fetchone()
        return int(row[0])

    def close(self) -> None:
        with self._lock:
            self._db.close()
