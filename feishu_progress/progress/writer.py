"""The card-writer port: how one card's newest state reaches Feishu. Pure declarations.

A card is written one way, chosen once when it is attached (``runtime/registry.py``): a message PATCHed
whole (``feishu/patch_writer.py``), or a CardKit card entity whose answer text streams into one element
and whose panels are rewritten at their own pace (``feishu/cardkit_writer.py``). The scheduler paces,
budgets and breaks, and asks the card's writer only what does not depend on the transport:

- ``apis``: every Open API its writes may spend (a pass stops early once each of them is spent);
- ``interval``: the least time between two of its writes' starts;
- ``choices``: before a write, which APIs it may call, best first (the scheduler takes the budgets of
  the first choice whose APIs all have room — all or none);
- ``write``: the write itself, from a built card that keeps the answer text apart from the panels; each
  call passes the flight's ``Calls`` right before it goes out (its budget held, the cluster's gate).

Every Feishu-side failure comes back as an ``Outcome`` (classified once, ``feishu/errors.py``); a writer
never raises for one.
"""

from __future__ import annotations

import math
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import Protocol

from feishu_progress.cards.builder import BuiltCard
from feishu_progress.ports import WriteOutcome


@dataclass(frozen=True, slots=True)
class Delivery:
    """One built card, the versions it was built from, and when its newest change was recorded."""

    version: int
    changed_at: float
    built: BuiltCard
    panel_version: int = 0  # the version of everything but the answer text
    text_version: int = 0  # the version of the answer text
    streams: bool = False  # whether the card's text streams in this state (only while the task runs)


@dataclass(frozen=True, slots=True)
class WriteChoices:
    """The Open APIs a card's next write may call, best first, and when the choice may change by itself
    (a CardKit card's panels fall due): a card whose every choice is over budget is looked at then."""

    apis: tuple[tuple[str, ...], ...]
    changes_at: float = math.inf


class CardVersions(Protocol):
    """What a writer reads off the live card before it is built (``LiveCard`` has it)."""

    @property
    def panel_version(self) -> int: ...

    @property
    def text_version(self) -> int: ...

    @property
    def streams(self) -> bool: ...


class Calls(Protocol):
    """One write's way out: which APIs' budgets it holds, and the gate each call passes right before
    it goes out (cluster mode: the lease and the shared budget, granted per call so a grant is never
    stale by the time its request arrives)."""

    def allows(self, api: str) -> bool: ...

    def call(self, api: str) -> AbstractAsyncContextManager[bool]:
        """Enter before one request of ``api``; False: this instance may not write now (send nothing)."""
        ...


class DeliveryGate(Protocol):
    """What a call must pass right before it goes out (cluster mode: the lease, the budget shared by all
    instances; single mode has none). ``enter`` answers a grant, or None when this instance may not
    write now."""

    async def enter(self, api: str, *, urgent: bool) -> object | None: ...

    def leave(self, grant: object) -> None: ...

    def paused(self, api: str, seconds: float) -> None: ...


class CardWriter(Protocol):
    """Brings one card on Feishu up to date; never raises for a Feishu-side failure."""

    @property
    def apis(self) -> tuple[str, ...]: ...

    @property
    def interval(self) -> float: ...

    @property
    def answers_clicks(self) -> bool:
        """Whether a click's answer may carry the new card (a streaming CardKit entity cannot be
        updated from a callback answer: its change is written instead)."""
        ...

    @property
    def refuses_stale_writes(self) -> bool:
        """Whether Feishu itself refuses a write an earlier holder of the card still had in flight (a
        CardKit sequence below the new fence's); when not, a card taken from a dead instance waits out
        that write (``DeliveryScheduler.hold``)."""
        ...

    def choices(self, card: CardVersions, *, urgent: bool) -> WriteChoices: ...

    async def write(self, delivery: Delivery, *, urgent: bool, calls: Calls) -> WriteOutcome: ...


__all__ = [
    "BuiltCard",
    "Calls",
    "CardVersions",
    "CardWriter",
    "Delivery",
    "DeliveryGate",
    "WriteChoices",
]
