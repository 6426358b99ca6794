"""The live card: one per task. Records the newest state; builds only when the scheduler is about to send.

Seed 002 §4.3 generalised: ``update`` and the finer setters only record and wake the scheduler;
``render_current`` builds synchronously from the last state and the cached subagent list (card callbacks
must answer without I/O); ``refresh`` forces a subagent reload and asks for an urgent delivery. Subagents
are loaded only while RUNNING, cached for one second, one load at a time; a failing load keeps the last
list; leaving RUNNING clears it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from feishu_progress.domain import (
    CardModel,
    Notice,
    PendingApproval,
    PendingAsk,
    SubagentSummary,
    TaskStatus,
    ToolCall,
)
from feishu_progress.domain import CardState as CardState  # noqa: PLC0414 (re-export: moved to domain.py)
from feishu_progress.metrics import Metrics
from feishu_progress.ports import Clock, SubagentSource
from feishu_progress.progress.scheduler import Delivery, DeliveryScheduler

log = logging.getLogger(__name__)

BuildCard = Callable[[CardModel], dict[str, Any]]
SUBAGENT_CACHE_SECONDS = 1.0


@dataclass(frozen=True, slots=True)
class CardContext:
    """What never changes for a task's card. ``started_at`` is wall-clock epoch seconds."""

    session_id: int
    message_id: str
    title: str = ""
    locales: tuple[str, ...] = ("zh_cn", "en_us")
    session_detail_url: str | None = None  # already formatted for this session
    started_at: float = 0.0


class LiveCard:
    """One task's card: newest state, cached subagents, and the builders to turn them into card JSON."""

    def __init__(
        self,
        context: CardContext,
        *,
        clock: Clock,
        build_card: BuildCard,
        build_degraded_card: BuildCard,
        subagents: SubagentSource | None = None,
        scheduler: DeliveryScheduler | None = None,
        on_change: Callable[[LiveCard], None] | None = None,
        state: CardState | None = None,
        subagent_cache_seconds: float = SUBAGENT_CACHE_SECONDS,
        metrics: Metrics | None = None,
    ) -> None:
        self.context = context
        self.on_change = on_change
        self.stopped_reason: str | None = None
        self._clock = clock
        self._build_card = build_card
        self._build_degraded_card = build_degraded_card
        self._source = subagents
        self._scheduler = scheduler
        self._cache_seconds = subagent_cache_seconds
        self._state = state if state is not None else CardState()
        self._version = 0
        self._changed_at = clock.monotonic()
        self._subagents: tuple[SubagentSummary, ...] = ()
        self._subagents_loaded_at: float | None = None
        self._loads_done = 0
        self._subagent_generation = 0  # bumped by subagents_changed(): a load that spans a bump is stale
        self._load_lock = asyncio.Lock()
        self._metrics = metrics

    # -- read side --------------------------------------------------------------------------------

    @property
    def message_id(self) -> str:
        """The Feishu message the card lives in."""
        return self.context.message_id

    @property
    def session_id(self) -> int:
        """The task's session id."""
        return self.context.session_id

    @property
    def state(self) -> CardState:
        """The newest recorded state (immutable snapshot)."""
        return self._state

    @property
    def version(self) -> int:
        """Grows by one on every recorded change; the scheduler compares it with what it delivered."""
        return self._version

    @property
    def changed_at(self) -> float:
        """Monotonic time of the newest recorded change."""
        return self._changed_at

    @property
    def is_terminal(self) -> bool:
        """True once the task has ended."""
        return self._state.status.is_terminal

    @property
    def subagents(self) -> tuple[SubagentSummary, ...]:
        """The cached running-subagent list (empty unless RUNNING)."""
        return self._subagents

    def render_current(self) -> dict[str, Any]:
        """Build the card now from the last state and the cached subagents. Never does I/O."""
        return self._build_card(self._model())

    async def build_for_delivery(self, *, degraded: bool = False) -> Delivery:
        """Load subagents (cached, RUNNING only), then build the newest state for one PATCH."""
        # The version is taken before the load: anything recorded while the load runs (a subagent that
        # just started, a new update) makes this delivery out of date, so the scheduler sends once more.
        version, changed_at = self._version, self._changed_at
        if self._state.status is TaskStatus.RUNNING:
            await self._load_subagents(force=False)
        model = self._model()
        builder = self._build_degraded_card if degraded else self._build_card
        return Delivery(version=version, changed_at=changed_at, card=builder(model))

    # -- write side: record and wake, never build or send -----------------------------------------

    def update(self, status: TaskStatus, round: int, content: str, tools: Iterable[ToolCall]) -> None:
        """Record the main agent's progress (seed 002 §4.3 shape)."""
        self._record(replace(self._state, status=status, round=round, content=content, tools=tuple(tools)))

    def set_pending_asks(self, asks: Iterable[PendingAsk]) -> None:
        """Record the questions the agent waits on."""
        self._record(replace(self._state, pending_asks=tuple(asks)))

    def set_approvals(self, approvals: Iterable[PendingApproval]) -> None:
        """Record the tool calls waiting for approval."""
        self._record(replace(self._state, pending_approvals=tuple(approvals)))

    def set_notice(self, notice: Notice | None) -> None:
        """Show (or clear) the transient line after a click."""
        self._record(replace(self._state, notice=notice))

    def set_disliked(self, disliked: bool = True) -> None:
        """Record the requester's dislike."""
        self._record(replace(self._state, disliked=disliked))

    def set_image_keys(self, image_keys: Mapping[str, str]) -> None:
        """Record uploaded images (path or URL -> Feishu image_key)."""
        self._record(replace(self._state, image_keys=dict(image_keys)))

    def set_error(self, error: str) -> None:
        """Record the error text shown on the card."""
        self._record(replace(self._state, error=error))

    def finish(self, status: TaskStatus, content: str | None = None, error: str | None = None) -> None:
        """Record the task's end; the terminal state always goes out, ahead of ordinary updates."""
        if not status.is_terminal:
            raise ValueError(f"finish needs a terminal status, not {status}")
        finished_at = self._state.finished_at if self._state.finished_at is not None else self._clock.wall()
        self._record(
            replace(
                self._state,
                status=status,
                content=self._state.content if content is None else content,
                error=self._state.error if error is None else error,
                pending_asks=(),
                pending_approvals=(),
                finished_at=finished_at,
            )
        )

    def record(self, state: CardState, *, urgent: bool = False) -> None:
        """Record a whole new state at once (the task service keeps the authoritative copy)."""
        self._record(state)
        if urgent and state.status.is_terminal:
            self._touch(urgent=True)

    def subagents_changed(self) -> None:
        """A subagent started, moved or ended: drop the 1 s cache so the next delivery reloads it."""
        self._subagent_generation += 1
        self._subagents_loaded_at = None
        if self._state.status is TaskStatus.RUNNING:
            self._touch(urgent=False)

    async def refresh(self) -> None:
        """Reload subagents now (user-triggered) and ask for an urgent delivery."""
        if self._state.status is TaskStatus.RUNNING:
            await self._load_subagents(force=True)
        self._touch(urgent=True)

    def mark_stopped(self, reason: str) -> None:
        """The scheduler will never PATCH this message again (expired, recalled, rejected)."""
        self.stopped_reason = reason

    # -- internals --------------------------------------------------------------------------------

    def _record(self, new_state: CardState) -> None:
        if new_state == self._state:
            return  # nothing the card shows changed: no PATCH for it
        if new_state.status is not TaskStatus.RUNNING:
            # Seed 002 §4.3/§5.5: the list is shown only while RUNNING; a later RUNNING reloads it.
            self._subagents = ()
            self._subagents_loaded_at = None
        self._state = new_state
        if self.on_change is not None:
            try:
                self.on_change(self)
            except Exception:
                log.exception("on_change hook failed for session %s", self.session_id)
        self._touch(urgent=False)

    def _touch(self, *, urgent: bool) -> None:
        self._version += 1
        self._changed_at = self._clock.monotonic()
        if self._scheduler is not None:
            self._scheduler.notify(self, urgent=urgent)

    def _model(self) -> CardModel:
        state, ctx = self._state, self.context
        end = state.finished_at if state.finished_at is not None else self._clock.wall()
        return CardModel(
            session_id=ctx.session_id,
            status=state.status,
            round=state.round,
            content=state.content,
            title=ctx.title,
            tools=state.tools,
            subagents=self._subagents if state.status is TaskStatus.RUNNING else (),
            elapsed_ms=max(0, int((end - ctx.started_at) * 1000)),
            pending_asks=state.pending_asks,
            pending_approvals=state.pending_approvals,
            disliked=state.disliked,
            notice=state.notice,
            error=state.error,
            locales=ctx.locales,
            session_detail_url=ctx.session_detail_url,
            image_keys=state.image_keys,
        )

    def _cache_fresh(self) -> bool:
        loaded_at = self._subagents_loaded_at
        return loaded_at is not None and self._clock.monotonic() - loaded_at < self._cache_seconds

    async def _load_subagents(self, *, force: bool) -> None:
        if self._source is None:
            return
        loads_before = self._loads_done
        async with self._load_lock:  # at most one load in flight per card
            if self._loads_done != loads_before and self._cache_fresh():
                return  # a load finished while we waited: it is as fresh as ours would be
            if not force and self._cache_fresh():
                self._count_cache("hit")
                return
            self._count_cache("miss")
            await self._run_load(self._source)

    def _count_cache(self, result: str) -> None:
        if self._metrics is not None:
            self._metrics.subagent_cache.labels(result=result).inc()

    async def _run_load(self, source: SubagentSource) -> None:
        generation = self._subagent_generation
        try:
            loaded = await source.list_running(self.session_id)
        except Exception:
            # Seed 002 §5.1: subagents are a nice-to-have; keep the last list, never block the card.
            log.warning(
                "loading subagents of session %s failed; keeping the last list",
                self.session_id,
                exc_info=True,
                extra={"session_id": self.session_id},
            )
        else:
            if self._state.status is TaskStatus.RUNNING:  # the task may have ended during the load
                self._subagents = tuple(loaded)
        finally:
            running = self._state.status is TaskStatus.RUNNING
            # A subagent changed while we were reading: this list may predate it, so it is not cached
            # (the change bumped the version, so the scheduler delivers again with a fresh load).
            stale = generation != self._subagent_generation
            if running and not stale:  # a failed load is cached too: no hammering
                self._subagents_loaded_at = self._clock.monotonic()
            self._loads_done += 1
