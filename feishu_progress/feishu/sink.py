"""Adapter from the core's CardSink port to the Feishu client (images: feishu_progress/images/uploads.py)."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any, Protocol

from feishu_progress.errors import FeishuAPIError, FeishuProgressError
from feishu_progress.feishu.errors import DEFAULT_MESSAGE_RETRY_SECONDS, classify
from feishu_progress.ports import PatchOutcome

log = logging.getLogger(__name__)


class CardPatcher(Protocol):
    """The part of FeishuClient the card sink needs."""

    async def patch_card(self, message_id: str, card: Mapping[str, Any]) -> None: ...


class FeishuCardSink:
    """ports.CardSink over the Open API: every Feishu-side failure becomes a PatchOutcome."""

    def __init__(
        self, client: CardPatcher, *, message_interval: float = DEFAULT_MESSAGE_RETRY_SECONDS
    ) -> None:
        self._client = client
        self._message_interval = message_interval

    async def patch_card(self, message_id: str, card: Mapping[str, Any]) -> PatchOutcome:
        """PATCH the card and say what happened; never raises for a Feishu-side failure."""
        try:
            await self._client.patch_card(message_id, card)
        except FeishuProgressError as exc:
            outcome = classify(exc, message_interval=self._message_interval)
            log.warning(
                "card PATCH failed: %s",
                outcome.kind,
                extra={
                    "message_id": message_id,
                    "code": outcome.code,
                    "log_id": _log_id(exc),
                    "outcome": str(outcome.kind),
                    "reason": outcome.reason,
                },
            )
            return outcome
        return PatchOutcome.delivered()


def _log_id(exc: BaseException) -> str:
    return exc.log_id if isinstance(exc, FeishuAPIError) else ""
