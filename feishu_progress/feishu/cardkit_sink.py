"""Writes a built card to its CardKit card entity: the calls ``progress/card_stream.plan`` chose.

Every Feishu-side failure becomes a PatchOutcome (classified once, in feishu/errors.py), like the PATCH
sink. One exception is handled here because only the writer can: streaming found closed (200850 after
Feishu's 10-minute window, 300309) makes the next write re-open it and send the newest text again (its
settings call in that write's budget) — never the same call retried blindly, which is how peers lose the
final answer; found closed again right after a re-open, it is a failure like any other.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from itertools import takewhile
from typing import Any, Protocol

from feishu_progress.cards.builder import ANSWER_CUT_ELEMENT_ID, ANSWER_ELEMENT_ID
from feishu_progress.config import CardKitSettings
from feishu_progress.errors import FeishuAPIError, FeishuProgressError
from feishu_progress.feishu.errors import STREAM_CLOSED_CODES, classify
from feishu_progress.ports import Clock, OutcomeKind, PatchOutcome
from feishu_progress.progress.card_stream import (
    OP_API,
    CardStream,
    Op,
    Pacing,
    SequenceExhausted,
    Shown,
    WriteChoices,
    choices_of,
    plan,
    plan_ahead,
)

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


def _element(card: Mapping[str, Any], element_id: str) -> Mapping[str, Any] | None:
    body = card.get("body")
    elements = body.get("elements") if isinstance(body, Mapping) else None
    for element in elements if isinstance(elements, list) else ():
        if isinstance(element, Mapping) and element.get("element_id") == element_id:
            return element
    return None


def answer_text(card: Mapping[str, Any]) -> str | None:
    """The streamed answer element's text in a built card (None: this card has no answer element)."""
    element = _element(card, ANSWER_ELEMENT_ID)
    content = element.get("content") if element is not None else None
    return content if isinstance(content, str) else None


def answer_cut(card: Mapping[str, Any]) -> str | None:
    """The cut marker after the answer (…已截断 N 字…) as the built card has it, None when uncut."""
    element = _element(card, ANSWER_CUT_ELEMENT_ID)
    return None if element is None else json.dumps(element, ensure_ascii=False, sort_keys=True)


@dataclass(frozen=True, slots=True)
class _Write:
    """One write of one card: the entity, the card as it shows it, and what it shows."""

    stream: CardStream
    card: Mapping[str, Any]
    shown: Shown


class CardKitWriter:
    """Brings card entities up to date; never raises for a Feishu-side failure."""

    def __init__(
        self,
        client: CardKitClient,
        settings: CardKitSettings,
        *,
        clock: Clock,
        message_interval: float,
    ) -> None:
        self._client = client
        self._pacing = pacing_of(settings)
        self._typewriter = streaming_config(settings)
        self._clock = clock
        self._message_interval = message_interval

    def plan_write(
        self, stream: CardStream, *, panel_version: int, text_version: int, streams: bool, urgent: bool
    ) -> WriteChoices:
        """The Open APIs the next write of ``stream`` may call, known before the card is built, best
        first (the scheduler takes the budgets of the first that has room in each)."""
        plans = plan_ahead(
            stream,
            panel_version=panel_version,
            text_version=text_version,
            streams=streams,
            urgent=urgent,
            now=self._clock.monotonic(),
            pacing=self._pacing,
        )
        return choices_of(plans)

    async def write(
        self,
        stream: CardStream,
        card: Mapping[str, Any],
        *,
        panel_version: int,
        streams: bool,
        urgent: bool,
        text_version: int | None = None,
        allowed: Collection[str] | None = None,
    ) -> PatchOutcome:
        """Send what ``card`` (just built) changes on the entity: PARTIAL when its panels wait for later.

        ``allowed``: the Open APIs whose budget this write holds (None: any); a call to another waits
        for the next write, which ``plan_ahead`` then sees owed.
        """
        text = answer_text(card)
        seen = Shown(panel_version, text, streams, text_version, answer_cut(card))
        now = self._clock.monotonic()
        chosen = plan(
            stream,
            panel_version=panel_version,
            text=text,
            streams=streams,
            urgent=urgent,
            now=now,
            pacing=self._pacing,
            cut=seen.cut,
            whole=allowed is None or OP_API[Op.FULL] in allowed,
            text_alone=allowed is None or OP_API[Op.TEXT] in allowed,
        )
        ops = (
            chosen.ops if allowed is None else tuple(takewhile(lambda op: OP_API[op] in allowed, chosen.ops))
        )
        job = _Write(stream, entity_card(card, streams=streams, typewriter=self._typewriter), seen)
        failed = await self._run(job, ops)
        if failed is not None:
            return failed
        if len(ops) < len(chosen.ops):  # a call nobody budgeted: the next write, at once
            if Op.FULL in chosen.ops[len(ops) :]:
                stream.panels_due = now
            return PatchOutcome(OutcomeKind.PARTIAL)
        if chosen.owed_at is not None:
            stream.panels_due = chosen.owed_at  # owed even when no version says so (the cut moved)
            return PatchOutcome(OutcomeKind.PARTIAL, retry_after=max(0.0, chosen.owed_at - now))
        return PatchOutcome.delivered()

    async def _run(self, job: _Write, ops: tuple[Op, ...]) -> PatchOutcome | None:
        """Make the calls in order; the outcome of the first that failed (None: all accepted)."""
        stream = job.stream
        for op in ops:
            try:
                await self._call(job, op)
            except FeishuAPIError as exc:
                if op is not Op.TEXT or exc.code not in STREAM_CLOSED_CODES or Op.STREAM_ON in ops:
                    return self._failed(stream, op, exc)
                # Closed by Feishu's window: the next write re-opens it (its own settings call, in its
                # budget) and sends the newest text again; never the same call retried blindly.
                log.info("streaming of card %s was closed (%s): re-opening it", stream.card_id, exc.code)
                stream.streaming = None
                return PatchOutcome(OutcomeKind.PARTIAL)
            except FeishuProgressError as exc:
                return self._failed(stream, op, exc)
            except SequenceExhausted as exc:
                return PatchOutcome(OutcomeKind.STOP, reason=str(exc))
        return None

    async def _call(self, job: _Write, op: Op) -> None:
        stream = job.stream
        sequence = stream.next_sequence()
        uuid = f"fp-{sequence}-{stream.card_id[-24:]}"  # unique: the sequence never repeats on a card
        if op is Op.FULL:
            await self._client.update_card_entity(stream.card_id, job.card, sequence, uuid)
        elif op is Op.TEXT:
            content = job.shown.text or ""
            await self._client.stream_card_text(stream.card_id, ANSWER_ELEMENT_ID, content, sequence, uuid)
        else:
            await self._client.set_card_streaming(stream.card_id, op is Op.STREAM_ON, sequence, uuid)
        stream.done(op, now=self._clock.monotonic(), shown=job.shown)

    def _failed(self, stream: CardStream, op: Op, exc: BaseException) -> PatchOutcome:
        outcome = classify(exc, message_interval=self._message_interval)
        log.warning(
            "CardKit %s failed: %s",
            op.value,
            outcome.kind,
            extra={
                "card_id": stream.card_id,
                "code": outcome.code,
                "log_id": exc.log_id if isinstance(exc, FeishuAPIError) else "",
                "outcome": str(outcome.kind),
                "reason": outcome.reason,
            },
        )
        return outcome
