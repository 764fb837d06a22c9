"""A job record and its states. Status moves one way:

    queued ─claim─► running ─finish─► succeeded | failed | cancelled
       ▲              │ lease expired (worker died) or retryable error
       └──────────────┘
    queued ─cancel─► cancelled

`attempts` fences writers: only the run that holds the current attempt may finish it.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

Status = Literal["queued", "running", "succeeded", "failed", "cancelled"]
Kind = Literal["completion", "batch", "response"]  # response: a background /v1/responses
OPEN: tuple[Status, ...] = ("queued", "running")
FINAL: tuple[Status, ...] = ("succeeded", "failed", "cancelled")
STATUSES: tuple[Status, ...] = OPEN + FINAL

def tenant_index(tenant: str, kind: str) -> str:
    """The index of one tenant's objects of one kind (batches, files): lists page
    through it instead of loading every record."""
    return f"tenant:{tenant}:{kind}"


# notification state per channel: pending → sending (leased) → sent | failed
NOTIFY_INDEX = "notify"


@dataclass
class Job:
    id: str
    kind: Kind
    spec: dict[str, Any]  # JobSpec.to_dict() for a completion; batch parameters for a batch
    status: Status = "queued"
    created_at: float = field(default_factory=time.time)
    enqueued_at: float = field(default_factory=time.time)
    started_at: float | None = None
    finished_at: float | None = None
    result: dict[str, Any] | None = None
    error: dict[str, Any] | None = None
    attempts: int = 0
    owner: str | None = None  # the worker holding the lease (not the tenant)
    tenant: str = "anonymous"  # whose job: every read, list and cancel checks it
    lease_until: float = 0.0
    cancel_requested: bool = False
    cancelled_at: float | None = None
    notify: dict[str, str] = field(default_factory=dict)  # channel → webhook URL / address
    notified: dict[str, str] = field(default_factory=dict)  # channel → state
    sending_until: dict[str, float] = field(default_factory=dict)
    progress: dict[str, Any] = field(default_factory=dict)  # batch request counts
    meta: dict[str, Any] = field(default_factory=dict)  # batch: metadata, file ids

    @property
    def final(self) -> bool:
        return self.status in FINAL

    def dumps(self) -> bytes:
        return json.dumps(asdict(self), separators=(",", ":")).encode()

    @classmethod
    def loads(cls, raw: bytes) -> Job:
        d = json.loads(raw)
        # a record from before jobs had a tenant field: its spec has always carried it
        d.setdefault("tenant", (d.get("spec") or {}).get("tenant", "anonymous"))
        return cls(**d)

    def public(self) -> dict[str, Any]:
        """The job object of API.md."""
        out: dict[str, Any] = {
            "id": self.id, "object": "job", "status": self.status,
            "created_at": int(self.created_at),
            "finished_at": None if self.finished_at is None else int(self.finished_at),
            "result": self.result,
        }
        if self.error is not None:
            out["error"] = self.error
        if self.notify:
            out["notifications"] = dict(self.notified)
        return out
