"""Runtime events → a task's state, its subagent rows, its live card and its snapshot.

A batch is checked whole against the task's state before anything is applied (a refused batch changes
nothing), then applied in order under the task's lock. Subagent events are stored as rows the
running-subagents query reads (seed 002 §4.1); failing to store one degrades the subagent section and
is logged, it never fails the batch.

Attach mode (``FP_SUBAGENTS__DATABASE_URL``, no ``subagent_rows``): the agent's own database already has
the rows and is what the card shows, so nothing is written. There the runtime sends the execution's
``id`` in that database as ``task_id``: ``subagent_round`` overlays that execution's live round,
``subagent_finished`` drops the overlay, and every subagent event tells the card to reload its list.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable

from feishu_progress.db.repo import LoggedBatch, SubagentRepository
from feishu_progress.db.times import utc_datetime
from feishu_progress.domain import TaskStatus
from feishu_progress.errors import REUSED_KEY, EventRejected, NotWritableHere, TaskConflict
from feishu_progress.metrics import Metrics
from feishu_progress.ports import Clock
from feishu_progress.runtime import events as ev
from feishu_progress.runtime.event_log import LoggedBatches
from feishu_progress.runtime.images import ImageKeys
from feishu_progress.runtime.snapshots import Saved, SnapshotStore
from feishu_progress.runtime.state import batch_digest
from feishu_progress.runtime.task import Task
from feishu_progress.subagents.manager import SubagentManager

log = logging.getLogger(__name__)

SubagentEvent = ev.SubagentRoundEvent | ev.SubagentStatusEvent | ev.SubagentFinishedEvent
AnySubagentEvent = ev.SubagentStartedEvent | SubagentEvent
MAX_EXECUTION_ID_DIGITS = 19  # a signed BIGINT


def attached_execution_id(task_id: str) -> int | None:
    """The agent database's execution id a runtime sent as ``task_id`` (attach mode); None if not one."""
    if not task_id.isascii() or not task_id.isdigit() or len(task_id) > MAX_EXECUTION_ID_DIGITS:
        return None
    value = int(task_id)
    return value if 0 < value < 2**63 else None


class EventApplier:
    def __init__(
        self,
        *,
        subagent_rows: SubagentRepository | None,
        manager: SubagentManager,
        images: Callable[[Task], ImageKeys],
        snapshots: SnapshotStore,
        clock: Clock,
        metrics: Metrics,
        event_log: LoggedBatches,
        durable: bool,
    ) -> None:
        """``event_log``: batches other instances stored for this instance's cards (cluster mode; single
        mode's is always empty). ``durable``: save every batch before answering (cluster mode)."""
        self._rows = subagent_rows
        self._manager = manager
        self._images = images
        self._snapshots = snapshots
        self._clock = clock
        self._metrics = metrics
        self._event_log = event_log
        self._durable = durable

    async def apply(
        self, task: Task, batch: ev.EventBatch, idempotency_key: str | None = None, body: str | None = None
    ) -> int:
        """Apply a validated batch in order; returns how many events were applied.

        A batch sent again with the same ``idempotency_key`` (a retry after an answer that was lost, or
        a batch another instance also put in the event log) is answered as the first time and not
        applied again; the same key with other events (``body``: their ``request_digest``) is refused
        (EventRejected on ``Idempotency-Key``). Cluster mode: batches in the event log go first (they
        were accepted earlier).
        """
        async with task.lock:
            before = task.state.status
            drained = await self._drain_log(task)
            try:
                applied = await self._apply_batch(task, batch, idempotency_key, body)
            finally:
                if drained:  # the logged batches are in, whatever becomes of this one
                    await self._settle(task, before, drained=True)
            if applied and not drained:
                await self._settle(task, before)
        return len(batch.events)

    async def catch_up(self, task: Task) -> int:
        """Apply the task's batches in the event log (a nudge, a takeover); how many there were."""
        async with task.lock:
            before = task.state.status
            drained = await self._drain_log(task)
            if drained:
                await self._settle(task, before, drained=True)
        return drained

    async def _apply_batch(
        self, task: Task, batch: ev.EventBatch, idempotency_key: str | None, body: str | None = None
    ) -> bool:
        """Check the batch whole, then apply it (False: a repeat of an applied Idempotency-Key).

        ``body``: the request's digest, kept with the key; None (a logged copy) checks nothing.
        """
        state = task.state
        digest = None if idempotency_key is None else batch_digest(idempotency_key)
        if digest is not None and digest in state.applied_batches:
            if state.reused_key(digest, body):
                raise EventRejected("Idempotency-Key", REUSED_KEY)
            return False
        state.check_batch(batch.events)
        for event in batch.events:
            await self._apply_one(task, event)
        if digest is not None:
            state.remember_batch(digest, body)
        state.end_batch(self._clock.wall())
        self._metrics.events.inc(len(batch.events))
        return True

    async def _settle(self, task: Task, before: TaskStatus, *, drained: bool = False) -> None:
        """Show what was applied; save it (before the 202 in cluster mode), then forget logged batches."""
        state = task.state
        task.sync_card(urgent=state.status.is_terminal)
        if state.status is not before or self._durable:
            # A restart must re-attach at the right status; in cluster mode a dead instance's cards
            # are taken over from what it saved, so every accepted event is saved before the 202.
            if await self._snapshots.save_now(task) is Saved.LOST:
                raise NotWritableHere(f"task {task.session_id} is written by another instance now")
            if drained:
                await self._forget_logged(task)
        else:
            self._snapshots.mark_dirty(task)

    async def _forget_logged(self, task: Task) -> None:
        """Delete the applied (and saved) logged batches; left behind, they are skipped by seq anyway."""
        try:
            await self._event_log.forget_through(task.session_id, task.state.events_applied)
        except Exception as exc:  # the batch is applied and saved: its answer stays a 202
            log.warning(
                "applied logged batches of session %s not deleted: %s", task.session_id, type(exc).__name__
            )

    async def _drain_log(self, task: Task) -> int:
        """Apply the logged batches this state has not seen, in order; a refused one is skipped."""
        if await self._event_log.newest(task.session_id) <= task.state.events_applied:
            return 0
        drained = 0
        while entries := await self._event_log.after(task.session_id, task.state.events_applied):
            for entry in entries:
                await self._apply_logged(task, entry)
                task.state.logged_batch_applied(entry.seq)
            drained += len(entries)
        return drained

    async def _apply_logged(self, task: Task, entry: LoggedBatch) -> None:
        try:
            batch = ev.parse_model(ev.EventBatch, json.loads(entry.body))
            await self._apply_batch(task, batch, entry.idempotency_key)
        except (EventRejected, TaskConflict, ValueError) as exc:
            # It was valid on arrival; the task's state refused it here (a 409/422 had it come direct).
            log.warning(
                "logged batch %d of session %s refused: %s", entry.seq, task.session_id, type(exc).__name__
            )

    async def _apply_one(self, task: Task, event: ev.Event) -> None:
        if isinstance(event, AnySubagentEvent):
            if self._rows is None:
                self._attached_subagent_event(task, event)
            elif isinstance(event, ev.SubagentStartedEvent):
                await self._stored(task, self._subagent_started(self._rows, task, event))
            else:
                await self._stored(task, self._subagent_changed(self._rows, task, event))
        else:
            task.state.apply(event)
            if isinstance(event, ev.ToolFinishedEvent):
                self._collect_images(task, event.call_id)

    def _collect_images(self, task: Task, call_id: str) -> None:
        call = task.state.tools.get(call_id)
        if call is None:
            return

        async def ready(keys: dict[str, str]) -> None:
            # Under the task's lock, like every change of the state: a batch may be mid-apply.
            async with task.lock:
                task.state.add_result_images(keys)
                task.sync_card()
            self._snapshots.mark_dirty(task)

        async def settled() -> None:
            async with task.lock:
                task.state.images_settled(uploading)
                task.sync_card()

        # Until settled, the card says these images are on their way rather than unreachable.
        uploading = self._images(task).collect(call, ready, task.session_id, settled=settled)
        task.state.images_on_their_way(uploading)

    async def _stored(self, task: Task, work: Awaitable[None]) -> None:
        try:
            await work
        except Exception as exc:
            log.warning(
                "subagent event of session %s could not be stored: %s", task.session_id, type(exc).__name__
            )

    def _attached_subagent_event(self, task: Task, event: AnySubagentEvent) -> None:
        # subagent_started only reloads: tracking it would show round 0 over the row's total_rounds.
        if isinstance(event, ev.SubagentRoundEvent | ev.SubagentFinishedEvent):
            execution_id = attached_execution_id(event.task_id)
            if execution_id is None:
                log.warning(
                    "subagent event of session %s: task_id %r is not an execution id of the agent's database",
                    task.session_id,
                    event.task_id,
                )
            elif isinstance(event, ev.SubagentRoundEvent):
                self._manager.track(execution_id, task.session_id)
                self._manager.set_round(execution_id, event.round)
            else:
                self._manager.untrack(execution_id)
        task.card.subagents_changed()

    async def _subagent_started(
        self, rows: SubagentRepository, task: Task, event: ev.SubagentStartedEvent
    ) -> None:
        parent = task.session_id
        execution_id = await rows.start(
            parent_session_id=parent,
            task_ref=event.task_id,
            child_external_id=event.child_session_id,
            agent_type=event.agent_type,
            title=event.title,
            task_description=event.task_description,
            invocation_type=event.invocation_type,
            now=utc_datetime(self._clock.wall()),
        )
        task.subagent_ids[event.task_id] = execution_id
        self._manager.track(execution_id, parent)
        task.card.subagents_changed()

    async def _subagent_changed(self, rows: SubagentRepository, task: Task, event: SubagentEvent) -> None:
        execution_id = await _execution_id(rows, task, event.task_id)
        if execution_id is None:
            log.warning("subagent event for unknown task_id %r of session %s", event.task_id, task.session_id)
            return
        if isinstance(event, ev.SubagentRoundEvent):
            self._manager.set_round(execution_id, event.round)
        elif isinstance(event, ev.SubagentStatusEvent):
            await rows.set_status(execution_id, event.status)
        else:
            now = utc_datetime(self._clock.wall())
            await rows.finish(execution_id, event.status, event.total_rounds, now)
            self._manager.untrack(execution_id)
        task.card.subagents_changed()


async def _execution_id(rows: SubagentRepository, task: Task, task_ref: str) -> int | None:
    if task_ref in task.subagent_ids:
        return task.subagent_ids[task_ref]
    found = await rows.find(task.session_id, task_ref)
    if found is not None:
        task.subagent_ids[task_ref] = found
    return found
