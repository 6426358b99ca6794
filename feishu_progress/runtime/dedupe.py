"""Callback dedupe that survives a restart: memory first, the ``callback_seen`` table behind it.

The memory layer answers repeats at once. A key it has not seen is checked against the database with a
short deadline, so a click Feishu redelivers after a restart is still caught; if the database is slow or
down, the memory answer stands (the action log's unique dedupe key is the last line of defence).
"""

from __future__ import annotations

import asyncio
import logging
from datetime import UTC, datetime

from feishu_progress.db.repo import CallbackDedupeRepository
from feishu_progress.feishu.callback import MemoryDeduper
from feishu_progress.ports import Clock

log = logging.getLogger(__name__)

DB_CHECK_SECONDS = 0.5


class PersistentDeduper:
    def __init__(self, repo: CallbackDedupeRepository, ttl_seconds: int, clock: Clock) -> None:
        self.memory = MemoryDeduper(ttl_seconds)
        self.repo = repo
        self.ttl_seconds = ttl_seconds
        self.clock = clock

    async def first_seen(self, key: str) -> bool:
        if not await self.memory.first_seen(key):
            return False
        now = datetime.fromtimestamp(self.clock.wall(), UTC).replace(tzinfo=None)
        try:
            return await asyncio.wait_for(self.repo.first_seen(key, self.ttl_seconds, now), DB_CHECK_SECONDS)
        except Exception as exc:  # the memory answer stands
            log.warning("callback dedupe table unavailable (%s); using memory only", type(exc).__name__)
            return True
