"""A message PATCHed whole: the ``CardWriter`` of a card that is not a CardKit entity.

One call per write (the message PATCH API's budget); the whole card goes every time, at most every
``FP_RATE__MESSAGE_INTERVAL_MS`` (Feishu allows 5 PATCHes a second per message).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

from feishu_progress.errors import FeishuProgressError
from feishu_progress.feishu.errors import failed_write
from feishu_progress.ports import OutcomeKind, WriteOutcome
from feishu_progress.progress.writer import Calls, CardVersions, Delivery, WriteChoices

PATCH = "patch"  # the budget (and the cluster budget's API) of message PATCHes
_CHOICES = WriteChoices(((PATCH,),))  # every write of a PATCHed card


class CardPatcher(Protocol):
    """The part of FeishuClient a PATCHed card needs."""

    async def patch_card(self, message_id: str, card: Mapping[str, Any]) -> None: ...


class PatchWriter:
    """Writes one message's card whole; never raises for a Feishu-side failure."""

    __slots__ = ("_client", "_message_id", "interval")

    apis = (PATCH,)
    answers_clicks = True  # a click's answer carries the new card itself
    refuses_stale_writes = False  # a PATCH has no fence: a late one from a dead holder would land

    def __init__(self, client: CardPatcher, message_id: str, *, interval: float) -> None:
        self._client = client
        self._message_id = message_id
        self.interval = interval

    def choices(self, card: CardVersions, *, urgent: bool) -> WriteChoices:
        return _CHOICES

    async def write(self, delivery: Delivery, *, urgent: bool, calls: Calls) -> WriteOutcome:
        """PATCH the built card and say what happened."""
        async with calls.call(PATCH) as allowed:
            if not allowed:
                return WriteOutcome(OutcomeKind.NOT_NOW)
            try:
                await self._client.patch_card(self._message_id, delivery.built.card)
            except FeishuProgressError as exc:
                ids = {"message_id": self._message_id}
                return failed_write(exc, "card PATCH", message_interval=self.interval, ids=ids)
        return WriteOutcome.delivered()
