"""Writes a built card to its CardKit card entity: the calls ``progress/card_stream.plan`` chose.

Every Feishu-side failure becomes a PatchOutcome (classified once, in feishu/errors.py), like the PATCH
sink. One exception is handled here because only the writer can: streaming found closed (200850 after
Feishu's 10-minute window, 300309) is re-opened once and the newest text sent again — never retried
blindly, which is how peers lose the final answer.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from feishu_progress.cards.builder import ANSWER_CUT_ELEMENT_ID, ANSWER_ELEMENT_ID
from feishu_progress.config import CardKitSettings
from feishu_progress.errors import FeishuAPIError, FeishuProgressError
from feishu_progress.feishu.errors import STREAM_CLOSED_CODES, classify
from feishu_progress.ports import Clock, OutcomeKind, PatchOutcome
from feishu_progress.progress.card_stream import CardStream, Op, Pacing, SequenceExhausted, plan

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
    """One write of one card: the entity, the card as it shows it, its answer text, the state's marks."""

    stream: CardStream
    card: Mapping[str, Any]
    text: str | None
    streams: bool
    panel_version: int
    cut: str | None


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

    async def write(
        self,
        stream: CardStream,
        card: Mapping[str, Any],
        *,
        panel_version: int,
        streams: bool,
        urgent: bool,
    ) -> PatchOutcome:
        """Send what ``card`` (just built) changes on the entity: PARTIAL when its panels wait for later."""
        text, cut = answer_text(card), answer_cut(card)
        now = self._clock.monotonic()
        chosen = plan(
            stream,
            panel_version=panel_version,
            text=text,
            streams=streams,
            urgent=urgent,
            now=now,
            pacing=self._pacing,
            cut=cut,
        )
        shown = entity_card(card, streams=streams, typewriter=self._typewriter)
        job = _Write(stream, shown, text, streams, panel_version, cut)
        reopened = Op.STREAM_ON in chosen.ops
        for op in chosen.ops:
            try:
                await self._call(job, op)
            except FeishuAPIError as exc:
                if op is not Op.TEXT or exc.code not in STREAM_CLOSED_CODES or reopened:
                    return self._failed(stream, op, exc)
                reopened = True  # closed by Feishu's window: re-open once, send the newest text again
                log.info("streaming of card %s was closed (%s): re-opening it", stream.card_id, exc.code)
                try:
                    await self._call(job, Op.STREAM_ON)
                    await self._call(job, Op.TEXT)
                except FeishuProgressError as again:
                    return self._failed(stream, op, again)
            except FeishuProgressError as exc:
                return self._failed(stream, op, exc)
            except SequenceExhausted as exc:
                return PatchOutcome(OutcomeKind.STOP, reason=str(exc))
        if chosen.owed_at is not None:
            return PatchOutcome(OutcomeKind.PARTIAL, retry_after=max(0.0, chosen.owed_at - now))
        return PatchOutcome.delivered()

    async def _call(self, job: _Write, op: Op) -> None:
        stream = job.stream
        sequence = stream.next_sequence()
        uuid = f"fp-{sequence}-{stream.card_id[-24:]}"  # unique: the sequence never repeats on a card
        if op is Op.FULL:
            await self._client.update_card_entity(stream.card_id, job.card, sequence, uuid)
        elif op is Op.TEXT:
            content = job.text or ""
            await self._client.stream_card_text(stream.card_id, ANSWER_ELEMENT_ID, content, sequence, uuid)
        else:
            await self._client.set_card_streaming(stream.card_id, op is Op.STREAM_ON, sequence, uuid)
        now = self._clock.monotonic()
        stream.done(
            op, now=now, panel_version=job.panel_version, text=job.text, streams=job.streams, cut=job.cut
        )

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
