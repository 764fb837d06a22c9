"""Stored responses of the Responses API and its conversations, in the one store
(shared by every replica)."""

from redline.responses.conversations import Conversation, Conversations
from redline.responses.records import ResponseRecord, ResponseRecords

__all__ = ["Conversation", "Conversations", "ResponseRecord", "ResponseRecords"]
