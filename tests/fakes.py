"""Test doubles shared by the suite. Production code never imports this module."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import heapq
import itertools
from collections.abc import AsyncIterator, Callable
from typing import Any

from feishu_progress.cards.builder import BuiltCard
from feishu_progress.config import ApiLimit, RateSettings
from feishu_progress.domain import CardModel, CardPanels, CardState
from feishu_progress.ports import WriteOutcome
from feishu_progress.progress.writer import CardWriter, Delivery


class FakeClock:
    """A Clock whose time moves only when a test calls ``advance``.

    ``sleep`` parks the caller until fake time reaches its deadline; ``advance`` walks time forward
    deadline by deadline, letting the event loop run the woken tasks in between, so code under test
    sees the same ordering it would see on a real clock, without any wall-clock wait.
    """

    def __init__(self, start: float = 1000.0, wall_start: float = 1_780_000_000.0) -> None:
        self._now = start
        self._wall_offset = wall_start - start
        self._sleepers: list[tuple[float, int, asyncio.Future[None]]] = []
        self._seq = itertools.count()

    def monotonic(self) -> float:
        return self._now

    def wall(self) -> float:
        return self._now + self._wall_offset

    async def sleep(self, seconds: float) -> None:
        if seconds <= 0:
            await asyncio.sleep(0)
            return
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._sleepers, (self._now + seconds, next(self._seq), future))
        await future

    @property
    def sleepers(self) -> int:
        return sum(1 for _, _, f in self._sleepers if not f.done())

    async def settle(self, rounds: int = 20) -> None:
        """Let every ready task run (no fake time passes)."""
        for _ in range(rounds):
            await asyncio.sleep(0)

    async def advance(self, seconds: float) -> None:
        """Move fake time forward by ``seconds``, waking sleepers in deadline order."""
        target = self._now + seconds
        await self.settle()
        while self._sleepers and self._sleepers[0][0] <= target:
            deadline, _, future = heapq.heappop(self._sleepers)
            self._now = max(self._now, deadline)
            if not future.done():
                future.set_result(None)
            await self.settle()
        self._now = target
        await self.settle()


class InstantClock:
    """A Clock whose ``sleep`` returns at once, moving its own time forward by what was asked.

    For code that backs off between attempts of real I/O (Feishu calls over HTTP to the sandbox): the
    backoff costs no wall time and stays in order with the I/O, and ``sleeps`` records every wait asked for.
    """

    def __init__(self, start: float = 1000.0, wall_start: float = 1_780_000_000.0) -> None:
        self._now = start
        self._wall_offset = wall_start - start
        self.sleeps: list[float] = []
        # Runs at each sleep, before it returns: a test changes the world "while the code waits".
        self.on_sleep: Callable[[float], None] | None = None

    def monotonic(self) -> float:
        return self._now

    def wall(self) -> float:
        return self._now + self._wall_offset

    async def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self._now += max(0.0, seconds)
        if self.on_sleep is not None:
            self.on_sleep(seconds)
        await asyncio.sleep(0)


_PANEL_FIELDS = frozenset(field.name for field in dataclasses.fields(CardPanels))


def _panels_apart(fields: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    panels = {name: value for name, value in fields.items() if name in _PANEL_FIELDS}
    return panels, {name: value for name, value in fields.items() if name not in _PANEL_FIELDS}


def card_state(base: CardState | None = None, **changes: Any) -> CardState:
    """``base`` (or an empty state) with ``changes`` written flat, as tests think of them: the panel
    fields among them go into its CardPanels (no ``dataclasses.replace`` of the whole: drives call this
    for every update of hundreds of cards)."""
    base = CardState() if base is None else base
    panels, text = _panels_apart(changes)
    return CardState(
        dataclasses.replace(base.panels, **panels) if panels else base.panels,
        text.get("content", base.content),
        text.get("content_chars", base.content_chars),
    )


def card_model(**fields: Any) -> CardModel:
    """A CardModel from flat fields (``status=``, ``tools=``... go into its CardPanels)."""
    panels, rest = _panels_apart(fields)
    return CardModel(panels=CardPanels(**panels), **rest)


class OpenCalls:
    """A write's way out that holds every API's budget and passes no gate: a card writer tested alone
    (the scheduler's ``FlightCalls`` is the real one)."""

    def allows(self, api: str) -> bool:
        return True

    @contextlib.asynccontextmanager
    async def call(self, api: str) -> AsyncIterator[bool]:
        yield True


async def write_once(writer: CardWriter, card: dict[str, Any]) -> WriteOutcome:
    """One write of ``card`` by ``writer``, every budget held."""
    return await writer.write(Delivery(1, 0.0, BuiltCard(card)), urgent=False, calls=OpenCalls())


def rate_with_api(name: str, per_second: float, per_minute: float) -> RateSettings:
    """The default budgets, with one Open API's own limit set (the rest as Feishu documents them)."""
    rate = RateSettings()
    limit = ApiLimit(per_second=per_second, per_minute=per_minute)
    return rate.model_copy(update={"api": rate.api.model_copy(update={name: limit})})


class TurnCounter:
    """The number of the loop's current iteration, counted by a self-rescheduling callback."""

    def __init__(self) -> None:
        self.turn = 0
        self._running = True
        asyncio.get_running_loop().call_soon(self._tick)

    def _tick(self) -> None:
        self.turn += 1
        if self._running:
            asyncio.get_running_loop().call_soon(self._tick)

    def stop(self) -> None:
        self._running = False
