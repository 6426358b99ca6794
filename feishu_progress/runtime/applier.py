"""Runtime events → a task's state, its subagent rows, its live card and its snapshot.

A batch is checked whole against the task's state before anything is applied (a refused batch changes
nothing), then applied in order under the task's lock. Subagent events are stored as rows the
running-subagents query reads (seed 002 §4.1); failing to store one degrades the subagent section and
is logged, it never fails the batch.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable

from feishu_progress.db.repo import SubagentRepository
from feishu_progress.db.times import utc_datetime
from feishu_progress.metrics import Metrics
from feishu_progress.ports import Clock
from feishu_progress.runtime import events as ev
from feishu_progress.runtime.images import ImageKeys
from feishu_progress.runtime.snapshots import SnapshotStore
from feishu_progress.runtime.task import Task
from feishu_progress.subagents.manager import SubagentManager

log = logging.getLogger(__name__)

SubagentEvent = ev.SubagentRoundEvent | ev.SubagentStatusEvent | ev.SubagentFinishedEvent


class EventApplier:
    def __init__(
        self,
        *,
        subagent_rows: SubagentRepository,
        manager: SubagentManager,
        images: ImageKeys,
        snapshots: SnapshotStore,
        clock: Clock,
        metrics: Metrics,
    ) -> None:
        self._rows = subagent_rows
        self._manager = manager
        self._images = images
        self._snapshots = snapshots
        self._clock = clock
        self._metrics = metrics

    async def apply(self, task: Task, batch: ev.EventBatch) -> int:
        """Apply a validated batch in order; returns how many events were applied."""
        async with task.lock:
            state = task.state
            state.check_batch(batch.events)
            before = state.status
            for event in batch.events:
                await self._apply_one(task, event)
            state.end_batch(self._clock.wall())
            self._metrics.events.inc(len(batch.events))
            task.sync_card(urgent=state.status.is_terminal)
            if state.status is not before:
                await self._snapshots.save_now(task)  # a restart must re-attach at the right status
            else:
                self._snapshots.mark_dirty(task)
        return len(batch.events)

    async def _apply_one(self, task: Task, event: ev.Event) -> None:
        if isinstance(event, ev.SubagentStartedEvent):
            await self._stored(task, self._subagent_started(task, event))
        elif isinstance(event, SubagentEvent):
            await self._stored(task, self._subagent_changed(task, event))
        else:
            task.state.apply(event)
            if isinstance(event, ev.ToolFinishedEvent):
                self._collect_images(task, event.call_id)

    def _collect_images(self, task: Task, call_id: str) -> None:
        call = task.state.tools.get(call_id)
        if call is None:
            return

        def ready(keys: dict[str, str]) -> None:
            task.state.image_keys.update(keys)
            task.sync_card()
            self._snapshots.mark_dirty(task)

        self._images.collect(call, ready, task.session_id)

    async def _stored(self, task: Task, work: Awaitable[None]) -> None:
        try:
            await work
        except Exception as exc:
            log.warning(
                "subagent event of session %s could not be stored: %s", task.session_id, type(exc).__name__
            )

    async def _subagent_started(self, task: Task, event: ev.SubagentStartedEvent) -> None:
        parent = task.session_id
        execution_id = await self._rows.start(
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

    async def _subagent_changed(self, task: Task, event: SubagentEvent) -> None:
        execution_id = await self._execution_id(task, event.task_id)
        if execution_id is None:
            log.warning("subagent event for unknown task_id %r of session %s", event.task_id, task.session_id)
            return
        if isinstance(event, ev.SubagentRoundEvent):
            self._manager.set_round(execution_id, event.round)
        elif isinstance(event, ev.SubagentStatusEvent):
            await self._rows.set_status(execution_id, event.status)
        else:
            now = utc_datetime(self._clock.wall())
            await self._rows.finish(execution_id, event.status, event.total_rounds, now)
            self._manager.untrack(execution_id)
        task.card.subagents_changed()

    async def _execution_id(self, task: Task, task_ref: str) -> int | None:
        if task_ref in task.subagent_ids:
            return task.subagent_ids[task_ref]
        found = await self._rows.find(task.session_id, task_ref)
        if found is not None:
            task.subagent_ids[task_ref] = found
        return found
