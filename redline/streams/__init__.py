"""Resumable streams: the journal, the live buffer, progress and countdown."""

from redline.streams.manager import StreamManager
from redline.streams.progress import Progress

__all__ = ["StreamManager", "Progress"]
