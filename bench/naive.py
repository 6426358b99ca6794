"""The naive baseline: seed 002's design taken literally, as a stand-in service with the same runtime API.

- every card has its own 250 ms timer (a task per card) that PATCHes the newest card if it changed;
- there is no app-wide budget: a rejected PATCH (230020, 99991400/429) is logged and dropped, like the
  seed's throttled closure — the next change produces the next PATCH;
- every card reloads its running subagents once per second (``SubagentManager.list_running``, per parent);
- the card is built (``build_progress_card``) after every event, whether or not it is ever sent.

It reuses the project's event models, TaskState, card builder, repositories and FeishuClient, so the
only differences from the real service are the delivery and query designs above. It does not persist
the card snapshot per batch (the seed has no restart story), which favours it on event throughput.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from aiohttp import web

from feishu_progress.cards.builder import build_progress_card
from feishu_progress.config import FeishuSettings
from feishu_progress.db.engine import Database
from feishu_progress.db.migrate import upgrade
from feishu_progress.db.repo import NewTask, SubagentRepository, TaskRepository
from feishu_progress.domain import SubagentSummary
from feishu_progress.errors import FeishuProgressError
from feishu_progress.feishu.client import FeishuClient
from feishu_progress.ports import Clock
from feishu_progress.progress.live_card import CardContext
from feishu_progress.runtime import events as ev
from feishu_progress.runtime.state import TaskState
from feishu_progress.subagents.manager import SubagentManager

log = logging.getLogger(__name__)

TICK_SECONDS = 0.25
SUBAGENT_RELOAD_SECONDS = 1.0


@dataclass
class NaiveCard:
    state: TaskState
    card: dict[str, Any]
    dirty: bool = False
    subagents: tuple[SubagentSummary, ...] = ()
    refs: dict[str, int] = field(default_factory=dict)
    timers: list[asyncio.Task[None]] = field(default_factory=list)


@dataclass
class NaiveCounters:
    events: int = 0
    builds: int = 0
    patches: int = 0
    patch_failures: int = 0
    subagent_queries: int = 0


def _utc(ts: float) -> datetime:
    return datetime.fromtimestamp(ts, UTC)


class NaiveService:
    """The seed's per-card design behind ``POST /v1/tasks`` and ``POST /v1/tasks/{id}/events``."""

    def __init__(self, database_url: str, feishu: FeishuSettings, clock: Clock) -> None:
        self.database_url = database_url
        self.feishu = feishu
        self.clock = clock
        self.cards: dict[int, NaiveCard] = {}
        self.counters = NaiveCounters()
        self.db: Database | None = None
        self.client: FeishuClient | None = None
        self.tasks_repo: TaskRepository | None = None
        self.subagent_repo: SubagentRepository | None = None
        self.manager: SubagentManager | None = None

    def app(self) -> web.Application:
        app = web.Application(client_max_size=8 * 1024 * 1024)
        app.router.add_post("/v1/tasks", self.create_task)
        app.router.add_post("/v1/tasks/{session_id}/events", self.post_events)
        app.cleanup_ctx.append(self._lifecycle)
        return app

    async def _lifecycle(self, app: web.Application) -> AsyncIterator[None]:
        await upgrade(self.database_url)
        self.db = Database.open(self.database_url)
        self.client = await FeishuClient.open(self.feishu)
        self.tasks_repo = TaskRepository(self.db)
        self.subagent_repo = SubagentRepository(self.db)
        self.manager = SubagentManager(self.db)
        yield
        timers = [t for card in self.cards.values() for t in card.timers]
        for timer in timers:
            timer.cancel()
        await asyncio.gather(*timers, return_exceptions=True)
        await self.client.close()
        await self.db.close()

    def _model(self, card: NaiveCard) -> Any:
        state = card.state
        context = CardContext(
            state.session_id, state.message_id or "", state.title, started_at=state.started_at
        )
        return context.model(state.card_state(), tuple(card.subagents), self.clock.wall())

    async def create_task(self, request: web.Request) -> web.Response:
        assert self.tasks_repo is not None and self.client is not None
        body = ev.parse_model(ev.CreateTaskRequest, await request.json())
        now = self.clock.wall()
        session_id = await self.tasks_repo.create_task(
            NewTask(
                title=body.title,
                receive_id=body.receive_id,
                receive_id_type=body.receive_id_type,
                requester_open_id=body.requester_open_id,
                now=_utc(now),
            )
        )
        state = TaskState(
            session_id=session_id,
            requester_open_id=body.requester_open_id,
            receive_id=body.receive_id,
            receive_id_type=body.receive_id_type,
            title=body.title,
            started_at=now,
            last_event_at=now,
        )
        card = NaiveCard(state=state, card={})
        card.card = build_progress_card(self._model(card))
        message_id = await self.client.send_card(
            body.receive_id, body.receive_id_type, card.card, f"naive-{session_id}"
        )
        state.sent_as(message_id)
        self.cards[session_id] = card
        card.timers = [
            asyncio.create_task(self._patch_every_tick(card)),
            asyncio.create_task(self._reload_subagents_every_second(card)),
        ]
        return web.json_response({"session_id": session_id, "message_id": message_id}, status=201)

    async def post_events(self, request: web.Request) -> web.Response:
        session_id = int(request.match_info["session_id"])
        card = self.cards.get(session_id)
        if card is None:
            return web.json_response({"error": "unknown_task"}, status=404)
        batch = ev.parse_model(ev.EventBatch, await request.json())
        for event in batch.events:
            await self._apply(card, event)
            # The seed's update(): build the card for every change.
            card.card = build_progress_card(self._model(card))
            card.dirty = True
            self.counters.builds += 1
        self.counters.events += len(batch.events)
        return web.json_response({"accepted": len(batch.events)}, status=202)

    async def _apply(self, card: NaiveCard, event: ev.Event) -> None:
        assert self.subagent_repo is not None and self.manager is not None
        state = card.state
        if isinstance(event, ev.SubagentStartedEvent):
            execution_id = await self.subagent_repo.start(
                parent_session_id=state.session_id,
                task_ref=event.task_id,
                child_external_id=event.child_session_id,
                agent_type=event.agent_type,
                title=event.title,
                task_description=event.task_description,
                invocation_type=event.invocation_type,
                now=_utc(self.clock.wall()),
            )
            card.refs[event.task_id] = execution_id
            self.manager.track(execution_id, state.session_id)
        elif isinstance(event, ev.SubagentRoundEvent):
            if event.task_id in card.refs:
                self.manager.set_round(card.refs[event.task_id], event.round)
        elif isinstance(event, ev.SubagentFinishedEvent):
            execution_id = card.refs.pop(event.task_id, None)
            if execution_id is not None:
                await self.subagent_repo.finish(
                    execution_id, event.status, event.total_rounds, _utc(self.clock.wall())
                )
                self.manager.untrack(execution_id)
        else:
            state.apply(event)

    async def _patch_every_tick(self, card: NaiveCard) -> None:
        assert self.client is not None
        message_id = card.state.message_id or ""
        while True:
            await self.clock.sleep(TICK_SECONDS)
            if not card.dirty:
                if card.state.status.is_terminal:
                    return
                continue
            card.dirty = False
            self.counters.patches += 1
            try:
                await self.client.patch_card(message_id, card.card)
            except FeishuProgressError as exc:  # the seed's closure logs and moves on
                self.counters.patch_failures += 1
                log.debug("naive PATCH of %s failed: %s", message_id, exc)

    async def _reload_subagents_every_second(self, card: NaiveCard) -> None:
        assert self.manager is not None
        while not card.state.status.is_terminal:
            self.counters.subagent_queries += 1
            with contextlib.suppress(Exception):
                card.subagents = tuple(await self.manager.list_running(card.state.session_id))
            await self.clock.sleep(SUBAGENT_RELOAD_SECONDS)

    def stats(self) -> dict[str, Any]:
        c = self.counters
        return {
            "events": c.events,
            "builds": c.builds,
            "patch_attempts": c.patches,
            "patch_failures": c.patch_failures,
            "subagent_queries": c.subagent_queries,
            "live_cards": len(self.cards),
            "time": time.monotonic(),
        }
