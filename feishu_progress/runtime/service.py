"""The task service: runtime events → task state → live card; user actions → the action log.

One object per process. It owns the in-memory tasks (state + live card), writes what must survive a
restart to the database, and never lets a failing database or Feishu call crash a request: the card
degrades, the failure is logged, the final state still goes out.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Coroutine, Iterable
from dataclasses import dataclass, field
from datetime import UTC
from typing import Any, Protocol

from feishu_progress.cards.builder import build_degraded_card, build_progress_card
from feishu_progress.config import Settings
from feishu_progress.db.repo import (
    ActionRepository,
    CallbackDedupeRepository,
    StateRow,
    SubagentRepository,
    TaskRepository,
)
from feishu_progress.db.times import naive_utc_from_timestamp
from feishu_progress.domain import CardModel, TaskStatus
from feishu_progress.errors import EventRejected, FeishuProgressError, UnknownTask
from feishu_progress.metrics import Metrics
from feishu_progress.ports import Clock, SubagentSource
from feishu_progress.progress.live_card import CardContext, LiveCard
from feishu_progress.progress.scheduler import DeliveryScheduler
from feishu_progress.runtime import events as ev
from feishu_progress.runtime.background import BackgroundTasks
from feishu_progress.runtime.images import ImageKeys
from feishu_progress.runtime.state import TaskState
from feishu_progress.subagents.manager import SubagentManager

log = logging.getLogger(__name__)

PERSIST_INTERVAL = 1.0  # seconds between saves of a task's round, streamed text and tool arguments


class CardSender(Protocol):
    """Sends the first card of a task (the Feishu client satisfies it)."""

    async def send_card(
        self, receive_id: str, receive_id_type: str, card: dict[str, Any], uuid: str
    ) -> str: ...

    async def reply_card(
        self, message_id: str, card: dict[str, Any], uuid: str, in_thread: bool = False
    ) -> str: ...


@dataclass(frozen=True, slots=True)
class Repos:
    """The repositories the service writes through."""

    tasks: TaskRepository
    subagents: SubagentRepository
    actions: ActionRepository
    dedupe: CallbackDedupeRepository


class TaskConflict(FeishuProgressError):
    """Events for a task that has already finished (and no retry was asked for)."""


@dataclass(frozen=True, slots=True)
class CreatedTask:
    session_id: int
    message_id: str | None


@dataclass
class Task:
    state: TaskState
    card: LiveCard
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    actions_changed: asyncio.Event = field(default_factory=asyncio.Event)
    subagent_ids: dict[str, int] = field(default_factory=dict)  # runtime task_ref -> execution id


# Naive UTC datetimes, as the database stores them (one helper, in db/times.py).
utc = naive_utc_from_timestamp


class TaskService:
    """Applies runtime events and user actions to tasks and their live cards."""

    def __init__(
        self,
        *,
        settings: Settings,
        repos: Repos,
        subagents: SubagentManager,
        scheduler: DeliveryScheduler,
        card_subagents: SubagentSource | None = None,
        sender: CardSender,
        images: ImageKeys | None = None,
        clock: Clock,
        metrics: Metrics,
        background: BackgroundTasks,
    ) -> None:
        self.settings = settings
        self.repos = repos
        self.subagents = subagents
        # What live cards load from: the manager, possibly wrapped (e.g. timed for metrics).
        self.card_subagents: SubagentSource = card_subagents or subagents
        self.scheduler = scheduler
        self.sender = sender
        self.clock = clock
        self.metrics = metrics
        self.background = background
        self.images = images if images is not None else ImageKeys(None, background)
        self.tasks: dict[int, Task] = {}
        self._dirty: set[int] = set()
        self._stopping = asyncio.Event()

    # ------------------------------------------------------------------ lookup
    def get(self, session_id: int) -> Task:
        task = self.tasks.get(session_id)
        if task is None:
            raise UnknownTask(session_id)
        return task

    def locales_for(self, state: TaskState) -> tuple[str, ...]:
        locales = self.settings.card.locales
        if state.locale and state.locale in locales:
            # The requester's language first: it is the card's default content.
            return (state.locale, *[code for code in locales if code != state.locale])
        return locales

    # ------------------------------------------------------------------ create
    async def create_task(self, request: ev.CreateTaskRequest) -> CreatedTask:
        now = self.clock.wall()
        session_id = await self.repos.tasks.create_task(
            title=request.title,
            receive_id=request.receive_id,
            receive_id_type=request.receive_id_type,
            requester_open_id=request.requester_open_id,
            reply_to_message_id=request.reply_to_message_id,
            locale=request.locale,
            now=utc(now),
        )
        state = TaskState(
            session_id=session_id,
            requester_open_id=request.requester_open_id,
            receive_id=request.receive_id,
            receive_id_type=request.receive_id_type,
            title=request.title,
            locale=request.locale,
            started_at=now,
            last_event_at=now,
        )
        first = build_progress_card(self._first_model(state))
        uuid = f"fp-task-{session_id}"
        try:
            if request.reply_to_message_id:
                message_id = await self.sender.reply_card(request.reply_to_message_id, first, uuid)
            else:
                message_id = await self.sender.send_card(
                    request.receive_id, request.receive_id_type, first, uuid
                )
        except FeishuProgressError as exc:
            log.warning("first card of task %s could not be sent: %s", session_id, exc)
            state.status = TaskStatus.LOST
            state.finished_at = now
            await self._persist(state, finished=True, stop_reason=f"send failed: {exc}"[:255])
            raise
        state.message_id = message_id
        self._attach(state)
        await self.repos.tasks.set_message_id(session_id, message_id)
        return CreatedTask(session_id, message_id)

    def _first_model(self, state: TaskState) -> CardModel:
        return state.card_model(
            elapsed_ms=0,
            subagents=(),
            locales=self.locales_for(state),
            session_detail_url=self.settings.card.session_detail_url,
        )

    def _attach(self, state: TaskState) -> Task:
        """Create the task's live card (its message exists) and register it."""
        assert state.message_id is not None
        context = CardContext(
            session_id=state.session_id,
            message_id=state.message_id,
            title=state.title,
            locales=self.locales_for(state),
            session_detail_url=self.settings.card.session_detail_url,
            started_at=state.started_at,
        )
        card = LiveCard(
            context,
            clock=self.clock,
            build_card=build_progress_card,
            build_degraded_card=build_degraded_card,
            subagents=self.card_subagents,
            scheduler=self.scheduler,
            state=state.card_state(),
            metrics=self.metrics,
        )
        task = Task(state=state, card=card)
        self.tasks[state.session_id] = task
        self.metrics.live_cards.set(len(self.tasks))
        return task

    def sync_card(self, task: Task, *, urgent: bool = False) -> None:
        """Hand the task's newest state to its live card (which wakes the scheduler)."""
        task.card.record(task.state.card_state(), urgent=urgent)

    # ------------------------------------------------------------------ events
    async def apply_events(self, session_id: int, batch: ev.EventBatch) -> int:
        """Apply a validated batch in order; returns how many events were applied."""
        task = self.get(session_id)
        async with task.lock:
            self._check_accepts(task.state, batch.events)
            before = task.state.status
            for event in batch.events:
                await self._apply_one(task, event)
            now = self.clock.wall()
            task.state.last_event_at = now
            terminal = task.state.status.is_terminal
            if terminal and task.state.finished_at is None:
                task.state.finished_at = now
            self.metrics.events.inc(len(batch.events))
            self.sync_card(task, urgent=terminal)
            if task.state.status is not before:
                # A new status (WAITING, a terminal state...) is saved at once; rounds, streamed text and
                # tool arguments at most once per PERSIST_INTERVAL (persist_loop): a busy bot starts a
                # new round every few seconds per task, and a write per round put the database on the
                # event hot path (measured: ~450 writes/s at 1000 live cards).
                self._dirty.discard(session_id)
                await self._persist(task.state, finished=terminal)
            else:
                self._dirty.add(session_id)
        return len(batch.events)

    async def flush_dirty(self) -> int:
        """Save every task whose streamed state changed since its last save, in one statement."""
        dirty, self._dirty = self._dirty, set()
        rows = [
            self._state_row(self.tasks[session_id].state) for session_id in dirty if session_id in self.tasks
        ]
        try:
            await self.repos.tasks.save_states(rows)
        except Exception:  # the live cards still carry the state; try again on the next pass
            log.exception("saving %d task snapshot(s) failed", len(rows))
            self._dirty |= dirty
            return 0
        return len(rows)

    def _state_row(self, state: TaskState) -> StateRow:
        return StateRow(
            session_id=state.session_id,
            status=state.status.value,
            round=state.round,
            snapshot=state.to_snapshot(),
            last_event_at=utc(state.last_event_at),
            finished_at=utc(state.finished_at) if state.finished_at is not None else None,
        )

    async def persist_loop(self) -> None:
        """Run ``flush_dirty`` every PERSIST_INTERVAL seconds until ``stop_loops``."""
        while await self._pause(PERSIST_INTERVAL):
            try:
                await self.flush_dirty()
            except Exception:  # the loop must survive a bad pass
                log.exception("saving task snapshots failed")

    def _check_accepts(self, state: TaskState, events: Iterable[ev.Event]) -> None:
        ordered = list(events)
        if state.status.is_terminal:
            reviving = (
                state.retry_requested
                and isinstance(ordered[0], ev.StatusEvent)
                and state.status in (TaskStatus.FAILED, TaskStatus.CANCELLED)
            )
            if not reviving:
                raise TaskConflict(f"task {state.session_id} has finished ({state.status.value})")
        for index, event in enumerate(ordered[:-1]):
            if isinstance(event, ev.FinishedEvent):
                raise EventRejected(f"events[{index + 1}]", "no event may follow 'finished' in a batch")

    async def _apply_one(self, task: Task, event: ev.Event) -> None:
        if isinstance(event, ev.SubagentStartedEvent):
            await self._guarded(task, self._subagent_started(task, event))
        elif isinstance(event, ev.SubagentRoundEvent | ev.SubagentStatusEvent | ev.SubagentFinishedEvent):
            await self._guarded(task, self._subagent_changed(task, event))
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
            self.sync_card(task)

        self.images.collect(call, ready, task.state.session_id)

    async def _guarded(self, task: Task, work: Coroutine[Any, Any, None]) -> None:
        """Subagent bookkeeping is a nice-to-have for the card: a database failure degrades, never fails."""
        try:
            await work
        except Exception:
            log.exception("subagent event of session %s could not be stored", task.state.session_id)

    async def _subagent_started(self, task: Task, event: ev.SubagentStartedEvent) -> None:
        parent = task.state.session_id
        execution_id = await self.repos.subagents.start(
            parent_session_id=parent,
            task_ref=event.task_id,
            child_external_id=event.child_session_id,
            agent_type=event.agent_type,
            title=event.title,
            task_description=event.task_description,
            invocation_type=event.invocation_type,
            now=utc(self.clock.wall()),
        )
        task.subagent_ids[event.task_id] = execution_id
        self.subagents.track(execution_id, parent)
        task.card.subagents_changed()

    async def _subagent_changed(
        self, task: Task, event: ev.SubagentRoundEvent | ev.SubagentStatusEvent | ev.SubagentFinishedEvent
    ) -> None:
        execution_id = await self._execution_id(task, event.task_id)
        if execution_id is None:
            log.warning(
                "subagent event for unknown task_id %r of session %s", event.task_id, task.state.session_id
            )
            return
        if isinstance(event, ev.SubagentRoundEvent):
            self.subagents.set_round(execution_id, event.round)
        elif isinstance(event, ev.SubagentStatusEvent):
            await self.repos.subagents.set_status(execution_id, event.status)
        else:
            await self.repos.subagents.finish(
                execution_id, event.status, event.total_rounds, utc(self.clock.wall())
            )
            self.subagents.untrack(execution_id)
        task.card.subagents_changed()

    async def _execution_id(self, task: Task, task_ref: str) -> int | None:
        if task_ref in task.subagent_ids:
            return task.subagent_ids[task_ref]
        found: int | None = await self.repos.subagents.find(task.state.session_id, task_ref)
        if found is not None:
            task.subagent_ids[task_ref] = found
        return found

    async def persist(self, state: TaskState) -> None:
        """Save the task's state (and snapshot) now."""
        await self._persist(state, finished=state.status.is_terminal)

    async def _persist(self, state: TaskState, *, finished: bool, stop_reason: str | None = None) -> None:
        try:
            await self.repos.tasks.save_state(
                state.session_id,
                status=state.status.value,
                round=state.round,
                snapshot=state.to_snapshot(),
                last_event_at=utc(state.last_event_at),
                finished_at=utc(self.clock.wall()) if finished else None,
            )
            if stop_reason:
                await self.repos.tasks.set_stop_reason(state.session_id, stop_reason)
        except Exception:  # the live card still carries the state
            log.exception("task %s state could not be saved", state.session_id)

    # ------------------------------------------------------------------ views
    def describe(self, session_id: int) -> dict[str, Any]:
        task = self.get(session_id)
        state = task.state
        return {
            "session_id": state.session_id,
            "status": state.status.value,
            "round": state.round,
            "message_id": state.message_id,
            "disliked": state.disliked,
            "stop_reason": task.card.stopped_reason,
            "card": task.card.render_current(),
        }

    async def wait_actions(
        self, session_id: int, after: int, wait: float
    ) -> tuple[list[dict[str, Any]], int]:
        task = self.get(session_id)
        deadline = self.clock.monotonic() + wait
        while True:
            task.actions_changed.clear()
            records = await self.repos.actions.list_after(session_id, after)
            if records or self.clock.monotonic() >= deadline:
                break
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(task.actions_changed.wait(), deadline - self.clock.monotonic())
        actions = [
            {
                "cursor": record.id,
                "kind": record.kind,
                "operator_open_id": record.operator_open_id,
                "payload": json.loads(record.payload) if isinstance(record.payload, str) else record.payload,
                "created_at": record.created_at.isoformat() + "Z",
            }
            for record in records
        ]
        return actions, (records[-1].id if records else after)

    # ------------------------------------------------------------------ lifecycle
    def stop_loops(self) -> None:
        """Ask the periodic loops to end after their current pass (never cut a database call short)."""
        self._stopping.set()

    async def _pause(self, seconds: float) -> bool:
        """Sleep ``seconds`` of clock time; False as soon as ``stop_loops`` was called."""
        if self._stopping.is_set():
            return False
        sleeper = asyncio.ensure_future(self.clock.sleep(seconds))
        stopper = asyncio.ensure_future(self._stopping.wait())
        try:
            await asyncio.wait({sleeper, stopper}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for waiter in (sleeper, stopper):
                waiter.cancel()
            await asyncio.gather(sleeper, stopper, return_exceptions=True)
        return not self._stopping.is_set()

    async def restore(self) -> int:
        """Re-attach every unfinished task's live card after a restart; returns how many."""
        records = await self.repos.tasks.list_unfinished()
        for record in records:
            state = TaskState(
                session_id=record.session_id,
                requester_open_id=record.requester_open_id,
                receive_id=record.receive_id,
                receive_id_type=record.receive_id_type,
                title=record.title or "",
                locale=record.locale,
                message_id=record.message_id,
                status=TaskStatus(record.status),
                round=record.round,
                disliked=record.disliked,
                started_at=record.started_at.replace(tzinfo=UTC).timestamp(),
                last_event_at=record.last_event_at.replace(tzinfo=UTC).timestamp(),
            )
            state.restore_snapshot(record.snapshot or "")
            if state.message_id:
                task = self._attach(state)
                # Elapsed time moved on while we were down: show the card is alive again.
                task.card.subagents_changed()
        self.metrics.live_cards.set(len(self.tasks))
        return len(records)

    async def close_stale(self) -> int:
        """Close every task with no event for FP_TASK__STALE_AFTER as 失去联系; returns how many."""
        cutoff = self.clock.wall() - self.settings.task.stale_after
        closed = 0
        for task in list(self.tasks.values()):
            if task.state.status.is_terminal or task.state.last_event_at > cutoff:
                continue
            async with task.lock:
                task.state.status = TaskStatus.LOST
                task.state.pending_asks.clear()
                task.state.approvals.clear()
                task.state.notice = None
                task.state.finished_at = self.clock.wall()
                self.sync_card(task, urgent=True)
                await self._persist(task.state, finished=True)
            closed += 1
        return closed

    async def watch_stale(self) -> None:
        """Run ``close_stale`` periodically until ``stop_loops``."""
        interval = min(60.0, self.settings.task.stale_after / 4)
        while await self._pause(interval):
            try:
                closed = await self.close_stale()
                if closed:
                    log.info("closed %d silent task(s) as LOST", closed)
                await self.repos.dedupe.purge_expired(utc(self.clock.wall()))
            except Exception:  # the watcher must survive a bad pass
                log.exception("stale-task pass failed")
