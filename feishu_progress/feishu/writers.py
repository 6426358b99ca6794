"""An app's card writers: the one place that picks how a card is written, once, when it is attached.

A card whose task row names a CardKit entity (``task_card.card_id``, saved when the entity was created)
is written as that entity, at the fence its holder loaded it with; any other is a message PATCHed whole.
Which one a new task gets is decided at its creation (``runtime/creation.py``: the ``cardkit``
transport, unless the app lacks the CardKit scope — the documented fallback); nothing switches a card's
writer afterwards.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from feishu_progress.config import CardKitSettings
from feishu_progress.feishu.cardkit_writer import CardKitClient, CardKitStyle, CardKitWriter
from feishu_progress.feishu.patch_writer import CardPatcher, PatchWriter
from feishu_progress.ports import Clock
from feishu_progress.progress.card_stream import CardStream
from feishu_progress.progress.writer import CardWriter


@dataclass(frozen=True, slots=True)
class FirstBuild:
    """What a card entity was created showing: its answer element's text (None: it has none)."""

    answer: str | None


class OpenApiWriter(CardPatcher, CardKitClient, Protocol):
    """The part of FeishuClient both writers need."""


class CardWriters:
    """Makes each card's writer, over the app's client."""

    def __init__(
        self, client: OpenApiWriter, cardkit: CardKitSettings, *, clock: Clock, message_interval: float
    ) -> None:
        self._client = client
        self._message_interval = message_interval
        self._cardkit = CardKitStyle.of(client, cardkit, clock=clock, message_interval=message_interval)

    def for_card(
        self, message_id: str, card_id: str | None, fence: int, *, created: FirstBuild | None = None
    ) -> CardWriter:
        """The writer of the card on ``message_id`` (a CardKit entity when ``card_id`` names one;
        ``created``: this process just created that entity, showing the card's first build)."""
        if card_id is None:
            return PatchWriter(self._client, message_id, interval=self._message_interval)
        if created is None:
            return CardKitWriter(self._cardkit, CardStream(card_id, fence))
        now = self._cardkit.clock.monotonic()
        return CardKitWriter(self._cardkit, CardStream.created(card_id, fence, text=created.answer, now=now))


__all__ = ["CardWriters", "FirstBuild"]
