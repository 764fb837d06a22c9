"""Stored responses of the Responses API, in the one store (shared by every replica)."""

from redline.responses.records import ResponseRecord, ResponseRecords

__all__ = ["ResponseRecord", "ResponseRecords"]
