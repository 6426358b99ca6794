"""Adapters from the core's ports to the Feishu client: CardSink and ImageUploader."""

from __future__ import annotations

import hashlib
import logging
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any, Protocol

from feishu_progress.errors import FeishuAPIError, FeishuProgressError
from feishu_progress.feishu.errors import DEFAULT_MESSAGE_RETRY_SECONDS, classify
from feishu_progress.ports import PatchOutcome

log = logging.getLogger(__name__)

DEFAULT_IMAGE_CACHE_SIZE = 1024


class CardPatcher(Protocol):
    """The part of FeishuClient the card sink needs."""

    async def patch_card(self, message_id: str, card: Mapping[str, Any]) -> None: ...


class ImageClient(Protocol):
    """The part of FeishuClient the image uploader needs."""

    async def upload_image(self, data: bytes) -> str: ...


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


class CachingImageUploader:
    """ports.ImageUploader that uploads each distinct content once (cache keyed by sha256)."""

    def __init__(self, client: ImageClient, *, max_entries: int = DEFAULT_IMAGE_CACHE_SIZE) -> None:
        self._client = client
        self._max_entries = max_entries
        self._keys: OrderedDict[str, str] = OrderedDict()

    async def upload_image(self, data: bytes) -> str:
        """The image_key for ``data``, uploading only if this content was not uploaded before."""
        digest = hashlib.sha256(data).hexdigest()
        cached = self._keys.get(digest)
        if cached is not None:
            self._keys.move_to_end(digest)
            return cached
        image_key = await self._client.upload_image(data)
        self._keys[digest] = image_key
        if len(self._keys) > self._max_entries:
            self._keys.popitem(last=False)
        return image_key


def _log_id(exc: BaseException) -> str:
    return exc.log_id if isinstance(exc, FeishuAPIError) else ""
