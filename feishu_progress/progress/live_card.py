"""The live card: one per task. Records the newest state; builds only when the scheduler is about to send.

Seed 002 §4.3 generalised. The task service calls two things: ``record(state)`` when the task's state
changed and ``subagents_changed()`` when a subagent started, moved or ended. Neither builds or sends:
they bump the card's version and wake the scheduler. ``render_current`` builds synchronously from the
last state and the cached subagent list (card callbacks answer without I/O); ``build_for_delivery`` is
what the scheduler calls right before a send: it loads the running subagents (only while RUNNING,
cached one second, one load at a time) and builds.

A failing subagent load degrades here and only here: the first load shows no subagents, a later one
keeps the last list; the failure is cached like a success, so a broken database is asked once a second.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from feishu_progress.cards.builder import BuiltCard
from feishu_progress.domain import CardModel, CardState, SubagentSummary, TaskStatus
from feishu_progress.ports import Clock, SubagentSource
from feishu_progress.progress.writer import CardWriter, Delivery

if TYPE_CHECKING:
    from feishu_progress.metrics import Metrics

log = logging.getLogger(__name__)

BuildCard = Callable[[CardModel], BuiltCard]
SUBAGENT_CACHE_SECONDS = 1.0
_VERSIONS = itertools.count(1)  # every card version in this process is distinct (see LiveCard)


class Notifier(Protocol):
    """What the card wakes when it changes (the delivery scheduler)."""

    def notify(self, card: Any, *, urgent: bool = False) -> None: ...


@dataclass(frozen=True, slots=True)
class CardContext:
    """What never changes for a task's card. ``started_at`` is wall-clock epoch seconds."""

    session_id: int
    message_id: str
    title: str = ""
    locales: tuple[str, ...] = ("zh_cn", "en_us")
    session_detail_url: str | None = None
    started_at: float = 0.0

    def model(self, state: CardState, subagents: tuple[SubagentSummary, ...], now: float) -> CardModel:
        """This card's CardModel for ``state`` (CardModel.from_state is the one constructor)."""
        return CardModel.from_state(
            state,
            session_id=self.session_id,
            title=self.title,
            locales=self.locales,
            session_detail_url=self.session_detail_url,
            started_at=self.started_at,
            now=now,
            subagents=subagents,
        )


class LiveCard:
    """One task's card: newest state, cached subagents, and the builders to turn them into card JSON."""

    def __init__(
        self,
        context: CardContext,
        *,
        writer: CardWriter,
        clock: Clock,
        build_card: BuildCard,
        build_degraded_card: BuildCard,
        subagents: SubagentSource | None = None,
        scheduler: Notifier | None = None,
        state: CardState | None = None,
        metrics: Metrics | None = None,
    ) -> None:
        self.context = context
        self.stopped_reason: str | None = None
        # How the card reaches Feishu (a PATCHed message or a CardKit entity), chosen when it was attached.
        self.writer = writer
        self._clock = clock
        self._build_card = build_card
        self._build_degraded_card = build_degraded_card
        self._source = subagents
        self._scheduler = scheduler
        self._state = state if state is not None else CardState()
        # Versions come from one process-wide counter: a card re-attached under a new LiveCard (a click on
        # an evicted task, a retry that revives one, a takeover) never repeats a version the scheduler
        # already settled for the message, which made it think the new state was delivered.
        self._version = next(_VERSIONS)
        self._panel_version = 0  # grows when anything but the answer text changes
        self._text_version = 0  # grows when the answer text changes
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
        return self.context.message_id

    @property
    def session_id(self) -> int:
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
    def panel_version(self) -> int:
        """Grows on every change of what the card shows besides its answer text (a CardKit card streams
        the text on its own and rewrites the rest at a slower pace)."""
        return self._panel_version

    @property
    def text_version(self) -> int:
        """Grows on every change of the answer text (a CardKit writer knows before building whether the
        next write streams text, so it takes that API's budget)."""
        return self._text_version

    @property
    def streams(self) -> bool:
        """Whether a CardKit card streams its text now: only while the task runs (not while it waits)."""
        return self._state.status is TaskStatus.RUNNING

    @property
    def changed_at(self) -> float:
        """Monotonic time of the newest recorded change."""
        return self._changed_at

    @property
    def is_terminal(self) -> bool:
        return self._state.status.is_terminal

    @property
    def subagents(self) -> tuple[SubagentSummary, ...]:
        """The cached running-subagent list (empty unless RUNNING)."""
        return self._subagents

    def render_current(self) -> dict[str, Any]:
        """Build the card now from the last state and the cached subagents. Never does I/O."""
        return self._build_card(self._model()).card

    def callback_card(self) -> dict[str, Any] | None:
        """The card a click's answer carries: the current one, or None when its writer cannot take it that
        way (a CardKit entity is not updated from a callback answer while it streams: the click's change
        is written to it)."""
        return self.render_current() if self.writer.answers_clicks else None

    async def build_for_delivery(self, *, degraded: bool = False) -> Delivery:
        """Load subagents (cached, RUNNING only), then build the newest state for one send."""
        # The version is taken before the load: anything recorded while the load runs (a subagent that
        # just started, a new update) makes this delivery out of date, so the scheduler sends once more.
        version, changed_at = self._version, self._changed_at
        if self._state.status is TaskStatus.RUNNING:
            await self._load_subagents()
        builder = self._build_degraded_card if degraded else self._build_card
        return Delivery(
            version=version,
            changed_at=changed_at,
            built=builder(self._model()),
            panel_version=self._panel_version,  # after the load: a list it changed is a panel change
            streams=self.streams,
            text_version=self._text_version,
        )

    # -- write side: record and wake, never build or send -----------------------------------------

    def record(self, state: CardState, *, urgent: bool = False) -> None:
        """The task's newest state. Nothing the card shows changed: nothing happens."""
        if state == self._state:
            return
        if state.status is not TaskStatus.RUNNING:
            # Seed 002 §4.3/§5.5: the list is shown only while RUNNING; a later RUNNING reloads it.
            self._subagents = ()
            self._subagents_loaded_at = None
        if not _same_panels(state, self._state):
            self._panel_version += 1
        if state.content != self._state.content or state.content_chars != self._state.content_chars:
            self._text_version += 1
        self._state = state
        self._touch(urgent=urgent)

    def subagents_changed(self) -> None:
        """A subagent started, moved or ended: drop the 1 s cache so the next delivery reloads it."""
        self._subagent_generation += 1
        self._subagents_loaded_at = None
        if self._state.status is TaskStatus.RUNNING:
            self._panel_version += 1
            self._touch(urgent=False)

    def resend(self, *, urgent: bool = False) -> None:
        """Send the newest state again though nothing changed: after a restart or a takeover, what Feishu
        shows may be older than what was saved (or newer, from a writer that is gone)."""
        self._panel_version += 1
        self._touch(urgent=urgent or self.is_terminal)

    def mark_stopped(self, reason: str) -> None:
        """The scheduler will never send this card again (expired, recalled, rejected)."""
        self.stopped_reason = reason

    # -- internals --------------------------------------------------------------------------------

    def _touch(self, *, urgent: bool) -> None:
        self._version = next(_VERSIONS)
        self._changed_at = self._clock.monotonic()
        if self._scheduler is not None:
            self._scheduler.notify(self, urgent=urgent)

    def _model(self) -> CardModel:
        return self.context.model(self._state, self._subagents, self._clock.wall())

    def _cache_fresh(self) -> bool:
        loaded_at = self._subagents_loaded_at
        return loaded_at is not None and self._clock.monotonic() - loaded_at < SUBAGENT_CACHE_SECONDS

    async def _load_subagents(self) -> None:
        if self._source is None:
            return
        loads_before = self._loads_done
        async with self._load_lock:  # at most one load in flight per card
            if self._loads_done != loads_before and self._cache_fresh():
                return  # a load finished while we waited: it is as fresh as ours would be
            if self._cache_fresh():
                self._count_cache("hit")
                return
            self._count_cache("miss")
            await self._run_load(self._source)

    def _show_subagents(self, loaded: tuple[SubagentSummary, ...]) -> None:
        # A list that changed without an event (attach mode: a row turned COMPLETED in the agent's own
        # database) changes the panels: a CardKit card must rewrite them, not only stream the text.
        if loaded != self._subagents:
            self._panel_version += 1
        self._subagents = loaded

    def _count_cache(self, result: str) -> None:
        if self._metrics is not None:
            self._metrics.subagent_cache.labels(result=result).inc()

    async def _run_load(self, source: SubagentSource) -> None:
        generation = self._subagent_generation
        try:
            loaded = await source.list_running(self.session_id)
        except Exception:
            # Seed 002 §5.1: subagents are a nice-to-have; keep the last list, never block the card.
            # The manager has logged the failure once; this layer only decides what the card shows.
            log.debug("subagents of session %s unavailable; keeping the last list", self.session_id)
        else:
            if self._state.status is TaskStatus.RUNNING:  # the task may have ended during the load
                self._show_subagents(tuple(loaded))
        finally:
            running = self._state.status is TaskStatus.RUNNING
            # A subagent changed while we were reading: this list may predate it, so it is not cached
            # (the change bumped the version, so the scheduler delivers again with a fresh load).
            stale = generation != self._subagent_generation
            if running and not stale:  # a failed load is cached too: no hammering
                self._subagents_loaded_at = self._clock.monotonic()
            self._loads_done += 1


def _answer_shown(state: CardState) -> bool:
    """Whether the card shows answer text (the first text replaces its placeholder and removes the first
    card's received line, which only a whole write can)."""
    return bool(state.content.strip())


def _same_panels(new: CardState, old: CardState) -> bool:
    """Whether two states differ in their answer text at most (text appearing or going is a panel change)."""
    return new.panels == old.panels and _answer_shown(new) == _answer_shown(old)
