"""A CardKit card entity: the ``CardWriter`` whose answer text streams into one element.

Each write makes the calls ``progress/card_stream.plan`` chose (text by the element-content API, the
whole card by the card-update API, streaming switched by the settings API), each passing the flight's
gate right before it goes out. Every Feishu-side failure becomes a WriteOutcome (classified once, in
feishu/errors.py), as for a PATCHed card. One exception is handled here because only the writer can:
streaming found closed (200850 after Feishu's 10-minute window, 300309) makes the next write re-open it
and send the newest text again (its settings call in that write's budget) — never the same call retried
blindly, which is how peers lose the final answer; found closed again right after a re-open, it is a
failure like any other.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from itertools import takewhile
from typing import Any, Protocol

from feishu_progress.cards.builder import ANSWER_ELEMENT_ID
from feishu_progress.config import CardKitSettings
from feishu_progress.errors import FeishuAPIError, FeishuProgressError
from feishu_progress.feishu.errors import STREAM_CLOSED_CODES, failed_write
from feishu_progress.ports import Clock, OutcomeKind, WriteOutcome
from feishu_progress.progress.card_stream import (
    OP_API,
    WRITE_APIS,
    CardStream,
    Op,
    Pacing,
    SequenceExhausted,
    Shown,
    choices_of,
    plan,
    plan_ahead,
)
from feishu_progress.progress.writer import Calls, CardVersions, Delivery, WriteChoices

log = logging.getLogger(__name__)


class CardKitClient(Protocol):
    """The part of FeishuClient the CardKit writer needs."""

    async def update_card_entity(
        self, card_id: str, card: Mapping[str, Any], sequence: int, uuid: str
    ) -> None: ...

    async def set_card_streaming(self, card_id: str, streaming: bool, sequence: int, uuid: str) -> None: ...

    async def stream_card_text(
        self, card_id: str, element_id: str, content: str, sequence: int, uuid: str
    ) -> None: ...


def pacing_of(settings: CardKitSettings) -> Pacing:
    return Pacing(
        panel_interval=settings.panel_interval_ms / 1000,
        streaming_window=settings.streaming_window_seconds,
    )


def streaming_config(settings: CardKitSettings) -> dict[str, Any]:
    """The client's typewriter, chosen for reading comfort (``fast``: a newer text never queues)."""
    return {
        "print_frequency_ms": {"default": settings.print_frequency_ms},
        "print_step": {"default": settings.print_step},
        "print_strategy": "fast",
    }


def entity_card(card: Mapping[str, Any], *, streams: bool, typewriter: Mapping[str, Any]) -> dict[str, Any]:
    """``card`` as a card entity shows it: with its streaming mode (and typewriter) in its config."""
    config = {**(card.get("config") or {}), "streaming_mode": streams, "streaming_config": dict(typewriter)}
    return {**card, "config": config}


@dataclass(frozen=True, slots=True)
class CardKitStyle:
    """What every card entity of one app is written with (``CardKitWriter`` holds one, shared)."""

    client: CardKitClient
    clock: Clock
    pacing: Pacing
    typewriter: Mapping[str, Any]
    interval: float  # between two writes of a card (its text streams): FP_CARDKIT__TEXT_INTERVAL_MS
    message_interval: float  # how long a per-card rate limit (230020) makes a write wait

    @classmethod
    def of(
        cls, client: CardKitClient, settings: CardKitSettings, *, clock: Clock, message_interval: float
    ) -> CardKitStyle:
        return cls(
            client,
            clock,
            pacing_of(settings),
            streaming_config(settings),
            settings.text_interval_ms / 1000,
            message_interval,
        )


@dataclass(frozen=True, slots=True)
class _Write:
    """One write of one card: the card as the entity shows it, and what it shows."""

    card: Mapping[str, Any]
    shown: Shown


class CardKitWriter:
    """Brings one card entity up to date (``progress/writer.CardWriter``); never raises for a
    Feishu-side failure."""

    __slots__ = ("_style", "stream")

    apis = WRITE_APIS
    answers_clicks = False  # a streaming entity cannot be updated from a callback answer
    refuses_stale_writes = True  # sequences at the new fence count above every one the old holder sent

    def __init__(self, style: CardKitStyle, stream: CardStream) -> None:
        self._style = style
        self.stream = stream

    @property
    def interval(self) -> float:
        return self._style.interval

    def choices(self, card: CardVersions, *, urgent: bool) -> WriteChoices:
        """The Open APIs the next write may call, known before the card is built, best first (the
        scheduler takes the budgets of the first that has room in each)."""
        plans = plan_ahead(
            self.stream,
            panel_version=card.panel_version,
            text_version=card.text_version,
            streams=card.streams,
            urgent=urgent,
            now=self._style.clock.monotonic(),
            pacing=self._style.pacing,
        )
        return choices_of(plans)

    async def write(self, delivery: Delivery, *, urgent: bool, calls: Calls) -> WriteOutcome:
        """Send what the built card changes on the entity: PARTIAL when its panels wait for later.

        Only calls whose budget the flight holds are made; another waits for the next write, which
        ``plan_ahead`` then sees owed.
        """
        built, stream, now = delivery.built, self.stream, self._style.clock.monotonic()
        seen = Shown(
            delivery.panel_version, built.answer, delivery.streams, delivery.text_version, built.cut_chars
        )
        chosen = plan(
            stream,
            panel_version=delivery.panel_version,
            text=built.answer,
            streams=delivery.streams,
            urgent=urgent,
            now=now,
            pacing=self._style.pacing,
            cut=built.cut_chars,
            whole=calls.allows(OP_API[Op.FULL]),
            text_alone=calls.allows(OP_API[Op.TEXT]),
        )
        ops = tuple(takewhile(lambda op: calls.allows(OP_API[op]), chosen.ops))
        if not ops and chosen.owed_at is not None:
            # The text's turn had nothing to send (a cut answer's head did not change): the panels go
            # next, or the card would ask for the text's budget again and again.
            stream.whole_last = False
        job = _Write(
            entity_card(built.card, streams=delivery.streams, typewriter=self._style.typewriter), seen
        )
        failed = await self._run(job, ops, calls)
        if failed is not None:
            return failed
        if len(ops) < len(chosen.ops):  # a call nobody budgeted: the next write, at once
            if Op.FULL in chosen.ops[len(ops) :]:
                stream.panels_due = now
            return WriteOutcome(OutcomeKind.PARTIAL)
        if chosen.owed_at is not None:
            stream.panels_due = chosen.owed_at  # owed even when no version says so (the cut moved)
            return WriteOutcome(OutcomeKind.PARTIAL, retry_after=max(0.0, chosen.owed_at - now))
        return WriteOutcome.delivered()

    async def _run(self, job: _Write, ops: tuple[Op, ...], calls: Calls) -> WriteOutcome | None:
        """Make the calls in order; the outcome of the first that failed (None: all accepted)."""
        stream = self.stream
        for n, op in enumerate(ops):
            async with calls.call(OP_API[op]) as allowed:
                if not allowed:  # no lease now: what went is recorded, the rest is owed
                    if Op.FULL in ops[n:]:
                        stream.panels_due = self._style.clock.monotonic()
                    return WriteOutcome(OutcomeKind.NOT_NOW)
                failed = await self._call_once(job, op, ops)
            if failed is not None:
                return failed
        return None

    async def _call_once(self, job: _Write, op: Op, ops: tuple[Op, ...]) -> WriteOutcome | None:
        stream = self.stream
        try:
            await self._call(job, op)
        except FeishuAPIError as exc:
            if op is not Op.TEXT or exc.code not in STREAM_CLOSED_CODES or Op.STREAM_ON in ops:
                return self._failed(op, exc)
            # Closed by Feishu's window: the next write re-opens it (its own settings call, in its
            # budget) and sends the newest text again; never the same call retried blindly.
            log.info("streaming of card %s was closed (%s): re-opening it", stream.card_id, exc.code)
            stream.streaming = None
            return WriteOutcome(OutcomeKind.PARTIAL)
        except FeishuProgressError as exc:
            return self._failed(op, exc)
        except SequenceExhausted as exc:
            return WriteOutcome(OutcomeKind.STOP, reason=str(exc))
        return None

    async def _call(self, job: _Write, op: Op) -> None:
        stream, client = self.stream, self._style.client
        sequence = stream.next_sequence()
        uuid = f"fp-{sequence}-{stream.card_id[-24:]}"  # unique: the sequence never repeats on a card
        if op is Op.FULL:
            await client.update_card_entity(stream.card_id, job.card, sequence, uuid)
        elif op is Op.TEXT:
            content = job.shown.text or ""
            await client.stream_card_text(stream.card_id, ANSWER_ELEMENT_ID, content, sequence, uuid)
        else:
            await client.set_card_streaming(stream.card_id, op is Op.STREAM_ON, sequence, uuid)
        stream.done(op, now=self._style.clock.monotonic(), shown=job.shown)

    def _failed(self, op: Op, exc: BaseException) -> WriteOutcome:
        ids = {"card_id": self.stream.card_id}
        return failed_write(
            exc, f"CardKit {op.value}", message_interval=self._style.message_interval, ids=ids
        )
