"""Ports: the Protocols the core talks through. Adapters live at the edge (feishu/, subagents/).

The core never sees a Feishu error code: a card's writer (``progress/writer.py``, the port; its PATCH
and CardKit adapters in ``feishu/``) classifies every outcome once (``feishu/errors.py``) and hands the
scheduler a decision it can act on.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable
from dataclasses import dataclass
from enum import StrEnum
from typing import Protocol

from feishu_progress.domain import SubagentSummary


class OutcomeKind(StrEnum):
    """What the scheduler should do after one write of a card."""

    DELIVERED = "delivered"
    RETRY_MESSAGE = "retry_message"  # per-message limit (230020): retry the newest state after retry_after
    PAUSE_APP = "pause_app"  # gateway limit (99991400 / 429): pause the whole budget for retry_after
    BACKOFF = "backoff"  # 5xx, timeout, connection error: bounded backoff with jitter
    STOP = "stop"  # expired / recalled / deleted: never write this card again
    DEGRADE = "degrade"  # too large / invalid card: resend once as a minimal card
    PARTIAL = "partial"  # the write went out, but the writer owes more of the card after retry_after
    NOT_NOW = "not_now"  # this instance may not write now (cluster mode: no lease): the state waits


@dataclass(frozen=True, slots=True)
class WriteOutcome:
    """How one write of a card went, as the scheduler acts on it."""

    kind: OutcomeKind
    retry_after: float = 0.0  # seconds; meaningful for RETRY_MESSAGE, PAUSE_APP and PARTIAL
    code: int | None = None  # the Feishu code or HTTP status behind it, for logs and metrics
    reason: str = ""

    @classmethod
    def delivered(cls) -> WriteOutcome:
        return cls(OutcomeKind.DELIVERED)


class SubagentSource(Protocol):
    """Read-only view of the running subagents of parent sessions (seed 002 §4.1)."""

    async def list_running(self, parent_session_id: int) -> list[SubagentSummary]: ...

    async def list_running_many(
        self, parent_session_ids: Iterable[int]
    ) -> dict[int, list[SubagentSummary]]: ...


class Deduper(Protocol):
    """Remembers keys (a click's event id and callback token) for a while: the one callback dedupe port.

    In memory (``feishu/callback.MemoryDeduper``), memory warmed from and written to the database
    (``runtime/dedupe.PersistentDeduper``), or shared by every instance (cluster mode's ``ClusterDeduper``).
    """

    async def first_seen(self, key: str) -> bool:
        """Record ``key``; True if it was not seen within the dedupe window."""
        ...

    async def warm(self) -> int:
        """Load the keys storage still holds (at startup); returns how many."""
        ...


class ImageUploader(Protocol):
    """Uploads image bytes and returns the Feishu image_key."""

    async def upload_image(self, data: bytes) -> str: ...


class Clock(Protocol):
    """Monotonic time and sleeping, injectable so tests never wait on the wall clock."""

    def monotonic(self) -> float: ...

    def wall(self) -> float: ...

    async def sleep(self, seconds: float) -> None: ...


class SystemClock:
    """The real clock."""

    def monotonic(self) -> float:
        return time.monotonic()

    def wall(self) -> float:
        return time.time()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(max(0.0, seconds))
