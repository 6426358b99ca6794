"""Periodic care: tasks whose runtime went silent close as 失去联系, finished tasks leave memory, old
callback dedupe keys leave the database."""

from __future__ import annotations

import logging

from feishu_progress.db.repo import CallbackDedupeRepository
from feishu_progress.db.times import utc_datetime
from feishu_progress.ports import Clock
from feishu_progress.runtime.registry import TaskRegistry
from feishu_progress.runtime.snapshots import SnapshotStore
from feishu_progress.runtime.task import Task
from feishu_progress.waiting import Stopper

log = logging.getLogger(__name__)

# A finished task whose final card could not be confirmed delivered (stopped card, failed sends) still
# leaves memory after this long without a change.
FINISHED_IDLE_SECONDS = 120.0


class Housekeeping:
    def __init__(
        self,
        *,
        registry: TaskRegistry,
        snapshots: SnapshotStore,
        dedupe: CallbackDedupeRepository,
        stale_after: float,
        clock: Clock,
    ) -> None:
        self._registry = registry
        self._snapshots = snapshots
        self._dedupe = dedupe
        self._stale_after = stale_after
        self._clock = clock

    async def close_stale(self) -> int:
        """Close every task with no event for FP_TASK__STALE_AFTER as 失去联系; returns how many."""
        cutoff = self._clock.wall() - self._stale_after
        closed = 0
        for task in self._registry:
            if task.state.status.is_terminal or task.state.last_event_at > cutoff:
                continue
            async with task.lock:
                if task.state.status.is_terminal:  # finished while we waited for the lock
                    continue
                task.state.mark_lost(self._clock.wall())
                task.sync_card(urgent=True)
                await self._snapshots.save_now(task)
            closed += 1
        return closed

    def evict_finished(self, task: Task) -> bool:
        """Let a finished task leave memory once nothing of it is left to save (the database keeps it)."""
        if not task.state.status.is_terminal or self._snapshots.is_dirty(task.session_id):
            return False
        self._registry.evict(task.session_id)
        return True

    def sweep_finished(self) -> int:
        """Evict finished tasks that have been idle a while (their final delivery never confirmed)."""
        idle_since = self._clock.monotonic() - FINISHED_IDLE_SECONDS
        return sum(self.evict_finished(task) for task in self._registry if task.card.changed_at < idle_since)

    async def run(self, stopper: Stopper) -> None:
        """One pass every min(60 s, stale_after / 4) until the stopper says stop."""
        interval = min(60.0, self._stale_after / 4)
        while await stopper.pause(interval):
            try:
                closed = await self.close_stale()
                if closed:
                    log.info("closed %d silent task(s) as LOST", closed)
                self.sweep_finished()
                await self._dedupe.purge_expired(utc_datetime(self._clock.wall()))
            except Exception:  # the loop must survive a bad pass
                log.exception("housekeeping pass failed")
