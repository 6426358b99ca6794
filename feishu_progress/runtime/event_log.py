"""The event log as the card's writer reads it (cluster mode; the table is db/repo.EventLogRepository).

Before each batch it applies, the writer looks whether other instances logged batches for the task
that it has not applied (they go first). That look is one query per batch; it is group-read, so the
batches of many tasks arriving together share one query (as clicks share one group commit).

Single mode has ``NO_EVENT_LOG``: one instance takes every batch itself, so none is ever logged.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from feishu_progress.background import BackgroundTasks
from feishu_progress.db.repo import EventLogRepository, LoggedBatch
from feishu_progress.group_commit import GroupCommit


class LoggedBatches(Protocol):
    """What the event applier reads of the event log (``EventLog``, or ``NO_EVENT_LOG``)."""

    async def newest(self, session_id: int) -> int: ...

    async def after(self, session_id: int, after_seq: int) -> list[LoggedBatch]: ...

    async def forget_through(self, session_id: int, seq: int) -> None: ...


class NoEventLog:
    """Single mode: nothing is ever logged for a task (this instance took every batch itself)."""

    async def newest(self, session_id: int) -> int:
        return 0

    async def after(self, session_id: int, after_seq: int) -> list[LoggedBatch]:
        return []

    async def forget_through(self, session_id: int, seq: int) -> None:
        return None


NO_EVENT_LOG = NoEventLog()


class EventLog:
    def __init__(self, repo: EventLogRepository, background: BackgroundTasks) -> None:
        self.repo = repo
        self._looks: GroupCommit[int, int] = GroupCommit(self._newest_many, background, name="event-log")

    async def newest(self, session_id: int) -> int:
        """The task's newest logged seq (0: none in the log), read after this call began."""
        return await self._looks.submit(session_id)

    async def after(self, session_id: int, after_seq: int) -> list[LoggedBatch]:
        return await self.repo.after(session_id, after_seq)

    async def forget_through(self, session_id: int, seq: int) -> None:
        await self.repo.forget_through(session_id, seq)

    async def _newest_many(self, session_ids: Sequence[int]) -> list[int]:
        newest = await self.repo.newest_of(sorted(set(session_ids)))
        return [newest.get(session_id, 0) for session_id in session_ids]
