"""Stored responses of the Responses API and its conversations, and stored chat
completions, in the one store (shared by every replica)."""

from redline.responses.completions import StoredCompletion, StoredCompletions
from redline.responses.conversations import Conversation, Conversations
from redline.responses.records import ResponseRecord, ResponseRecords

__all__ = ["Conversation", "Conversations", "ResponseRecord", "ResponseRecords",
           "StoredCompletion", "StoredCompletions"]
