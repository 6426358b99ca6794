"""Doubles for the progress tests: a recording card writer, a scripted SubagentSource, toy card builders.

Named test_scheduler_* to stay inside the progress area of the suite; it holds no tests itself.
"""

from __future__ import annotations

import random
from collections import defaultdict, deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from feishu_progress.backoff import BackoffPolicy
from feishu_progress.cards.builder import BuiltCard
from feishu_progress.config import RateSettings
from feishu_progress.domain import CardModel, SubagentSummary, TaskStatus
from feishu_progress.metrics import Metrics
from feishu_progress.ports import Clock, OutcomeKind, WriteOutcome
from feishu_progress.progress.breaker import OutageBreaker
from feishu_progress.progress.live_card import CardContext, LiveCard
from feishu_progress.progress.rate_budget import BudgetTable
from feishu_progress.progress.scheduler import DeliveryScheduler
from feishu_progress.progress.writer import Calls, CardVersions, Delivery, DeliveryGate, WriteChoices
from tests.fakes import FakeClock, card_state


def build_card(model: CardModel) -> BuiltCard:
    """A toy builder that exposes what the real one would render from."""
    return BuiltCard(toy_card(model))


def toy_card(model: CardModel) -> dict[str, Any]:
    return {
        "kind": "full",
        "status": model.panels.status.value,
        "round": model.panels.round,
        "content": model.content,
        "subagents": [s.task_id for s in model.subagents],
        "elapsed_ms": model.elapsed_ms,
        "disliked": model.panels.disliked,
        "notice": None if model.panels.notice is None else model.panels.notice.value,
        "error": model.panels.error,
        "asks": [a.ask_id for a in model.panels.pending_asks],
        "approvals": [a.approval_id for a in model.panels.pending_approvals],
        "image_keys": dict(model.panels.image_keys),
    }


def build_degraded_card(model: CardModel) -> BuiltCard:
    """A toy minimal card: status only."""
    return BuiltCard({"kind": "degraded", "status": model.panels.status.value, "content": model.content})


@dataclass
class PatchRecord:
    message_id: str
    card: dict[str, Any]
    started: float
    ended: float | None = None
    outcome: WriteOutcome | None = None


class FakeSink:
    """Records every write; answers scripted outcomes per message (DELIVERED otherwise) after ``delay``.

    ``writer(message_id)`` is a card's writer (the ``CardWriter`` port) over it, one PATCH-like call a
    write, through the flight's gate like the real writers.
    """

    def __init__(self, clock: FakeClock, delay: float = 0.0) -> None:
        self.clock = clock
        self.delay = delay
        self.records: list[PatchRecord] = []
        self.script: dict[str, deque[WriteOutcome | Exception]] = defaultdict(deque)
        self.always: dict[str, WriteOutcome] = {}
        self._in_flight: dict[str, int] = defaultdict(int)
        self.max_in_flight_per_message = 0

    def answer(self, message_id: str, *outcomes: WriteOutcome | Exception) -> None:
        """Queue the next answers for ``message_id``."""
        self.script[message_id].extend(outcomes)

    async def patch_card(self, message_id: str, card: Mapping[str, Any]) -> WriteOutcome:
        record = PatchRecord(message_id, dict(card), self.clock.monotonic())
        self.records.append(record)
        self._in_flight[message_id] += 1
        self.max_in_flight_per_message = max(self.max_in_flight_per_message, self._in_flight[message_id])
        try:
            if self.delay:
                await self.clock.sleep(self.delay)
        finally:
            self._in_flight[message_id] -= 1
            record.ended = self.clock.monotonic()
        queued = self.script[message_id]
        answer = queued.popleft() if queued else self.always.get(message_id, WriteOutcome.delivered())
        if isinstance(answer, Exception):
            raise answer
        record.outcome = answer
        return answer

    def of(self, message_id: str) -> list[PatchRecord]:
        """The PATCHes of one message, in start order."""
        return [r for r in self.records if r.message_id == message_id]

    def writer(self, message_id: str, interval: float = 0.25) -> FakeWriter:
        return FakeWriter(self, message_id, interval)


class FakeWriter:
    """A card's writer over a FakeSink: one call a write (the budget and the gate of ``patch``)."""

    apis = ("patch",)
    answers_clicks = True
    refuses_stale_writes = False

    def __init__(self, sink: FakeSink, message_id: str, interval: float) -> None:
        self.sink = sink
        self.message_id = message_id
        self.interval = interval

    def choices(self, card: CardVersions, *, urgent: bool) -> WriteChoices:
        return WriteChoices((self.apis,))

    async def write(self, delivery: Delivery, *, urgent: bool, calls: Calls) -> WriteOutcome:
        async with calls.call("patch") as allowed:
            if not allowed:
                return WriteOutcome(OutcomeKind.NOT_NOW)
            return await self.sink.patch_card(self.message_id, delivery.built.card)


class SplitWriter(FakeWriter):
    """A writer with two ways, as a CardKit card has: the whole card by ``card_update`` (best), or the
    text alone by ``card_content``, which leaves the rest owed (PARTIAL) until a whole write."""

    apis = ("card_content", "card_update")

    def __init__(self, sink: FakeSink, message_id: str, interval: float) -> None:
        super().__init__(sink, message_id, interval)
        self.calls: list[tuple[str, float]] = []  # (API, when) of every call made
        self.text_version = -1  # the card's text version Feishu shows

    def choices(self, card: CardVersions, *, urgent: bool) -> WriteChoices:
        if card.text_version == self.text_version:  # nothing new to stream: only the rest is owed
            return WriteChoices((("card_update",),))
        return WriteChoices((("card_update",), ("card_content",)))

    async def write(self, delivery: Delivery, *, urgent: bool, calls: Calls) -> WriteOutcome:
        api = "card_update" if calls.allows("card_update") else "card_content"
        async with calls.call(api) as allowed:
            if not allowed:
                return WriteOutcome(OutcomeKind.NOT_NOW)
            self.calls.append((api, self.sink.clock.monotonic()))
            self.text_version = delivery.text_version
        return WriteOutcome.delivered() if api == "card_update" else WriteOutcome(OutcomeKind.PARTIAL)


def outcome(kind: OutcomeKind, retry_after: float = 0.0, reason: str = "") -> WriteOutcome:
    return WriteOutcome(kind, retry_after=retry_after, code=1, reason=reason)


class FakeSubagents:
    """A SubagentSource answering scripted lists (or raising), optionally after a delay."""

    def __init__(self, clock: FakeClock, delay: float = 0.0) -> None:
        self.clock = clock
        self.delay = delay
        self.calls = 0
        self.answers: deque[list[SubagentSummary] | Exception] = deque()
        self.fallback: list[SubagentSummary] = []
        self.in_flight = 0
        self.max_in_flight = 0

    async def list_running(self, parent_session_id: int) -> list[SubagentSummary]:
        self.calls += 1
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            if self.delay:
                await self.clock.sleep(self.delay)
        finally:
            self.in_flight -= 1
        answer = self.answers.popleft() if self.answers else self.fallback
        if isinstance(answer, Exception):
            raise answer
        return answer

    async def list_running_many(self, parent_session_ids: Iterable[int]) -> dict[int, list[SubagentSummary]]:
        return {sid: await self.list_running(sid) for sid in parent_session_ids}


def subagent(task_id: int, title: str = "调研卡片") -> SubagentSummary:
    return SubagentSummary(task_id=task_id, agent_type="explorer", title=title, status="RUNNING", round=1)


class Harness:
    """A started scheduler over a FakeSink and a FakeClock; ``async with`` stops it."""

    def __init__(
        self,
        *,
        delay: float = 0.0,
        rate: RateSettings | None = None,
        backoff: BackoffPolicy | None = None,
        breaker: OutageBreaker | None = None,
        gate: DeliveryGate | None = None,
    ) -> None:
        self.clock = FakeClock(start=1000.0)
        self.sink = FakeSink(self.clock, delay)
        self.metrics = Metrics()
        self.rate = rate or RateSettings()
        self._stopped: list[tuple[str, str]] = []
        self._finals: list[str] = []
        self._next_session = 1
        self.scheduler = DeliveryScheduler(
            BudgetTable(self.rate),
            clock=self.clock,
            metrics=self.metrics,
            backoff=backoff,
            rng=random.Random(7),
            breaker=breaker,
            gate=gate,
        )

    def _hear_ends(self) -> None:
        ends = self.scheduler.ends
        while not ends.empty():
            end = ends.get_nowait()
            if end is None:
                continue  # the scheduler stopped
            if end.reason is None:
                self._finals.append(end.card.message_id)
            else:
                self._stopped.append((end.card.message_id, end.reason))

    @property
    def finals(self) -> list[str]:
        """The cards whose final state was delivered, in order (the scheduler's ``ends``)."""
        self._hear_ends()
        return self._finals

    @property
    def stopped(self) -> list[tuple[str, str]]:
        """The cards that can never be written again, and why."""
        self._hear_ends()
        return self._stopped

    def card(
        self,
        message_id: str = "om_1",
        subagents: FakeSubagents | None = None,
        writer: FakeWriter | None = None,
    ) -> LiveCard:
        self._next_session += 1
        return LiveCard(
            CardContext(session_id=self._next_session, message_id=message_id, started_at=self.clock.wall()),
            writer=writer or self.sink.writer(message_id, self.rate.message_interval_ms / 1000),
            clock=self.clock,
            build_card=build_card,
            build_degraded_card=build_degraded_card,
            subagents=subagents,
            scheduler=self.scheduler,
        )

    async def __aenter__(self) -> Harness:
        self.scheduler.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.scheduler.stop()


def push(card: LiveCard, *, urgent: bool = False, **changes: Any) -> None:
    """Record a change the way the task service does: a whole new CardState through ``record``."""
    card.record(card_state(card.state, **changes), urgent=urgent)


def step(card: LiveCard, n: int) -> None:
    push(card, status=TaskStatus.RUNNING, round=n, content=f"step {n}")


def finish(card: LiveCard, status: TaskStatus, clock: Clock, **changes: Any) -> None:
    """The task's end as the task service records it (questions closed, elapsed time frozen)."""
    ended = {"pending_asks": (), "pending_approvals": (), "notice": None, "finished_at": clock.wall()}
    push(card, urgent=True, status=status, **(ended | changes))
