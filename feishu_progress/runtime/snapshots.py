"""What survives a restart: each task's state saved to ``task_card``, and loaded back.

Cadence: a new status (WAITING, a terminal state...) is saved at once; rounds, streamed text and tool
arguments at most once per ``PERSIST_INTERVAL`` (``run``), all dirty tasks in one statement — a busy bot
starts a new round every few seconds per task, and a write per round put the database on the event path
(measured: ~450 writes/s at 1000 live cards). A failed save never loses the state: the task stays dirty
and the next pass tries again, and when a whole batch fails its rows are retried one by one, so one bad
row never blocks the others. A pass dumps its snapshots on the loop in slices of ``DUMP_SLICE_SECONDS``,
and the loop gets its turns between two slices (tool values are capped at 16 KiB, so no single dump is
long). Each snapshot is dumped whole within one slice, so it is always one moment of its task.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import fields
from datetime import datetime
from enum import StrEnum

from feishu_progress.background import BackgroundTasks
from feishu_progress.db.repo import StateRow, TaskRecord, TaskRepository
from feishu_progress.db.times import utc_datetime
from feishu_progress.group_commit import GroupCommit
from feishu_progress.ports import Clock
from feishu_progress.runtime.state import TaskState, dump_snapshot, restore
from feishu_progress.runtime.task import Task
from feishu_progress.waiting import Stopper

log = logging.getLogger(__name__)

PERSIST_INTERVAL = 1.0  # seconds between saves of a task's round, streamed text and tool arguments
# How long a pass dumps snapshots before the loop gets a turn. The pass at 1,000 busy cards dumps for
# ~16 ms; in one stretch it was the loop's longest (a worker thread needed a copy of each state made on
# the loop first, 13 ms for 1,000, and its dumps then held the GIL against the loop anyway).
DUMP_SLICE_SECONDS = 0.004
MAX_STOP_REASON_CHARS = 255  # the column's size


class Saved(StrEnum):
    """What ``save_now`` achieved."""

    NOW = "now"
    LATER = "later"  # the database failed: the task stays dirty and the next pass tries again
    LOST = "lost"  # cluster mode: another instance writes this card now; nothing was saved


class SnapshotStore:
    """Dirty tracking, the periodic save, saves on a status change, and loading tasks back."""

    def __init__(
        self,
        repo: TaskRepository,
        clock: Clock,
        background: BackgroundTasks,
        *,
        owner: str | None,
        on_lost: Callable[[list[int]], None],
    ) -> None:
        """``owner``: cluster mode's instance id: saves are conditioned on this instance still writing the
        card at its fence, and ``on_lost`` hears of the cards taken from it (a paused or cut-off
        instance). Single mode (None): every save is by primary key, and nothing is ever lost."""
        self._repo = repo
        self._clock = clock
        self._dirty: dict[int, Task] = {}
        self._saving: set[int] = set()  # written right now: not safe to forget yet
        self._failing = False
        # Saves at once (status changes; in cluster mode every batch) from many requests share a statement.
        self._writes: GroupCommit[StateRow, bool] = GroupCommit(
            self._write_rows, background, name="snapshots"
        )
        self._owner = owner
        self._on_lost = on_lost

    def mark_dirty(self, task: Task) -> None:
        """Save this task on the next pass."""
        self._dirty[task.session_id] = task

    def forget(self, session_id: int) -> None:
        """Nothing of this task is saved from here any more (another instance writes it)."""
        self._dirty.pop(session_id, None)

    def is_dirty(self, session_id: int) -> bool:
        """Whether the task has changes the database does not have yet (or is being written)."""
        return session_id in self._dirty or session_id in self._saving

    async def save_now(self, task: Task) -> Saved:
        """Save one task at once (a status change; every batch in cluster mode), group-committed."""
        self._dirty.pop(task.session_id, None)
        self._saving.add(task.session_id)
        try:
            (row,) = await self._rows([task.state])
            saved = await self._writes.submit(row)
        except Exception as exc:
            self._dirty[task.session_id] = task
            self._log_failure("saving task %s failed (%s): retried on the next pass", task.session_id, exc)
            return Saved.LATER
        finally:
            self._saving.discard(task.session_id)
        return Saved.NOW if saved else Saved.LOST

    async def flush(self) -> int:
        """Save every dirty task (one statement, or row by row if that fails); returns how many were saved."""
        dirty, self._dirty = self._dirty, {}
        if not dirty:
            return 0
        self._saving.update(dirty)
        try:
            rows = await self._rows([task.state for task in dirty.values()])
            try:
                await self._save(rows)
            except Exception:
                saved = await self._one_by_one(rows, dirty)
            else:
                saved = len(rows)
        finally:
            self._saving.difference_update(dirty)
        if saved == len(rows) and self._failing:
            log.info("task snapshots are being saved again")
            self._failing = False
        return saved

    async def _one_by_one(self, rows: Sequence[StateRow], dirty: dict[int, Task]) -> int:
        saved = 0
        for row in rows:
            try:
                await self._save([row])
            except Exception as exc:
                self._dirty.setdefault(row.session_id, dirty[row.session_id])
                self._log_failure("saving task %s failed (%s): retried on the next pass", row.session_id, exc)
            else:
                saved += 1
        return saved

    async def _write_rows(self, rows: Sequence[StateRow]) -> list[bool]:
        lost = set(await self._save(rows))
        return [row.session_id not in lost for row in rows]

    async def _save(self, rows: Sequence[StateRow]) -> list[int]:
        lost = await self._repo.save_states(rows, self._owner)
        if lost:
            log.warning("%d card(s) are written by another instance now: dropping them here", len(lost))
            for session_id in lost:
                self.forget(session_id)
            self._on_lost(lost)
        return lost

    def _log_failure(self, message: str, session_id: int, exc: BaseException) -> None:
        # Once per outage, not once per task per second.
        if not self._failing:
            log.warning(message, session_id, type(exc).__name__)
        self._failing = True

    async def run(self, stopper: Stopper) -> None:
        """``flush`` every PERSIST_INTERVAL until the stopper says stop."""
        while await stopper.pause(PERSIST_INTERVAL):
            try:
                await self.flush()
            except Exception:  # the loop must survive a bad pass
                log.exception("saving task snapshots failed")

    async def _rows(self, states: Sequence[TaskState]) -> list[StateRow]:
        rows: list[StateRow] = []
        slice_ends = time.perf_counter() + DUMP_SLICE_SECONDS
        for state in states:
            if time.perf_counter() >= slice_ends:
                await asyncio.sleep(0)  # the states dumped later may change meanwhile: they stay whole
                slice_ends = time.perf_counter() + DUMP_SLICE_SECONDS
            rows.append(_state_row(state, dump_snapshot(state)))
        return rows

    # -- loading --------------------------------------------------------------------------------

    async def load_unfinished(self) -> list[TaskState]:
        """Every RUNNING or WAITING task that has a card, oldest first (re-attached after a restart)."""
        return [
            state_from_record(record) for record in await self._repo.list_unfinished() if record.message_id
        ]

    async def new_epoch(self, state: TaskState) -> bool:
        """Before writing a CardKit card loaded from the database: a new fence, so this writer's sequences
        count above every earlier writer's (Feishu refuses a sequence that does not rise). False: the
        card's fence moved meanwhile (another instance took it)."""
        if state.card_id is None:
            return True
        fence = await self._repo.next_fence(state.session_id, state.fence)
        if fence is None:
            return False
        state.hold_at(fence)
        return True

    async def new_epochs(self, states: list[TaskState]) -> None:
        """Single mode, at start: ``new_epoch`` for every CardKit card of ``states`` in one statement."""
        streamed = [state for state in states if state.card_id is not None]
        await self._repo.next_fences([state.session_id for state in streamed])
        for state in streamed:
            state.hold_at(state.fence + 1)

    async def load(self, session_id: int) -> TaskState | None:
        """One task from the database (an evicted one a click or request asks about)."""
        record = await self._repo.get(session_id)
        if record is None or record.message_id is None:
            return None
        return state_from_record(record)


def _state_row(state: TaskState, snapshot: str) -> StateRow:
    return StateRow(
        session_id=state.session_id,
        status=state.status.value,
        round=state.round,
        snapshot=snapshot,
        last_event_at=utc_datetime(state.last_event_at),
        finished_at=utc_datetime(state.finished_at) if state.finished_at is not None else None,
        disliked=state.disliked,
        stop_reason=None if state.stop_reason is None else state.stop_reason[:MAX_STOP_REASON_CHARS],
        fence=state.fence,
    )


# The card row's values a TaskState declares too, by name (the rest of the row is not the task's state).
_ROW_FIELDS = tuple(sorted({f.name for f in fields(TaskRecord)} & {f.name for f in fields(TaskState)}))


def state_from_record(record: TaskRecord) -> TaskState:
    """The task as its card row and the snapshot saved in it describe it (a damaged snapshot is logged)."""
    row = {name: _plain(value) for name in _ROW_FIELDS if (value := getattr(record, name)) is not None}
    state, damaged = restore(row, record.snapshot)
    if damaged:
        log.warning("task %s: damaged snapshot dropped: %s", record.session_id, ", ".join(sorted(damaged)))
    return state


def _plain(value: object) -> object:
    """A column's value as TaskState holds it: times as epoch seconds."""
    return value.timestamp() if isinstance(value, datetime) else value
