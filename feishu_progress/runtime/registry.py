"""The one owner of "the live cards": the tasks this process holds in memory, by session and by message.

A task is held while it can still change what its card shows. Once its final state has reached Feishu
(the scheduler says so) it is evicted; the database keeps it, and a later click or request loads it
again (``TaskService.task``). So a process that ran for a month holds its live tasks, not its history.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator

from feishu_progress.apps import AppRegistry
from feishu_progress.cards.builder import build_card, build_degraded
from feishu_progress.config import Settings
from feishu_progress.feishu.writers import FirstBuild
from feishu_progress.metrics import Metrics
from feishu_progress.ports import Clock, SubagentSource
from feishu_progress.progress.live_card import CardContext, LiveCard
from feishu_progress.runtime.state import TaskState
from feishu_progress.runtime.task import Task

log = logging.getLogger(__name__)


def card_locales(settings: Settings, locale: str | None) -> tuple[str, ...]:
    """The card's languages: the requester's first (it is the card's default content), then the rest."""
    locales = settings.card.locales
    if locale and locale in locales:
        return (locale, *[code for code in locales if code != locale])
    return locales


def card_context(settings: Settings, state: TaskState, message_id: str) -> CardContext:
    return CardContext(
        session_id=state.session_id,
        message_id=message_id,
        title=state.title,
        locales=card_locales(settings, state.locale),
        session_detail_url=settings.card.session_detail_url,
        started_at=state.started_at,
    )


class TaskRegistry:
    """Tasks in memory and their live cards; keeps ``fp_live_cards`` equal to how many there are."""

    def __init__(
        self,
        *,
        settings: Settings,
        clock: Clock,
        apps: AppRegistry,
        subagents: SubagentSource,
        metrics: Metrics,
    ) -> None:
        self._settings = settings
        self._clock = clock
        self._apps = apps
        self._subagents = subagents
        self._metrics = metrics
        self._tasks: dict[int, Task] = {}
        self._by_message: dict[str, int] = {}

    def attach(self, state: TaskState, *, created: FirstBuild | None = None) -> Task:
        """Hold ``state`` (its first card exists) with a new live card; replaces an earlier one.

        The card is written by its app's scheduler, by the writer its row names (a CardKit entity at this
        holder's fence, or the message PATCHed whole); UnknownApp when the app is no longer configured.
        ``created``: its CardKit entity was just created, showing that first build.
        """
        if state.message_id is None:
            raise ValueError(f"task {state.session_id} has no message yet")
        app = self._apps.get(state.app)
        card = LiveCard(
            card_context(self._settings, state, state.message_id),
            writer=app.writers.for_card(state.message_id, state.card_id, state.fence, created=created),
            clock=self._clock,
            build_card=build_card,
            build_degraded_card=build_degraded,
            subagents=self._subagents,
            scheduler=app.scheduler,
            state=state.card_state(),
            metrics=self._metrics,
        )
        if state.stop_reason is not None:
            card.mark_stopped(state.stop_reason)  # recalled, expired...: never sent again
        task = Task(state=state, card=card)
        self.evict(state.session_id)
        self._tasks[state.session_id] = task
        self._by_message[state.message_id] = state.session_id
        self._publish()
        return task

    def get(self, session_id: int) -> Task | None:
        return self._tasks.get(session_id)

    def by_message(self, message_id: str) -> Task | None:
        session_id = self._by_message.get(message_id)
        return None if session_id is None else self._tasks.get(session_id)

    def evict(self, session_id: int) -> Task | None:
        """Stop holding a task (the database still has it)."""
        task = self._tasks.pop(session_id, None)
        if task is not None:
            self._by_message.pop(task.card.message_id, None)
            self._publish()
        return task

    def drop(self, session_ids: Iterable[int]) -> None:
        """Stop holding tasks another instance writes now, and stop writing their cards (cluster mode)."""
        for session_id in session_ids:
            task = self.evict(session_id)
            if task is not None:
                self._apps.get(task.state.app).scheduler.drop(task.card.message_id)

    def __len__(self) -> int:
        return len(self._tasks)

    def __iter__(self) -> Iterator[Task]:
        return iter(list(self._tasks.values()))

    def _publish(self) -> None:
        self._metrics.live_cards.set(len(self._tasks))
