"""Callback dedupe: answered from memory at once, persisted in the background, warmed after a restart."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from datetime import datetime

from feishu_progress.background import BackgroundTasks
from feishu_progress.db.engine import Database
from feishu_progress.db.repo import CallbackDedupeRepository
from feishu_progress.feishu.callback import MemoryDeduper
from feishu_progress.ports import Deduper
from feishu_progress.runtime.dedupe import PersistentDeduper
from tests.fakes import FakeClock


class BlockedRepo(CallbackDedupeRepository):
    """A database that never answers."""

    def __init__(self) -> None:
        self.stuck = asyncio.Event()

    async def first_seen(self, key: str, ttl_seconds: int, now: datetime) -> bool:
        await self.stuck.wait()
        return True

    async def first_seen_many(self, keys: Sequence[str], ttl_seconds: int, now: datetime) -> list[bool]:
        await self.stuck.wait()
        return [True] * len(keys)


async def test_a_click_is_answered_without_waiting_on_the_database() -> None:
    background = BackgroundTasks()
    deduper = PersistentDeduper(BlockedRepo(), 3600, FakeClock(), background)
    assert await asyncio.wait_for(deduper.first_seen("event:1"), 0.1) is True
    assert await asyncio.wait_for(deduper.first_seen("event:1"), 0.1) is False
    assert len(background) == 2  # the write is still pending: the key's store and the group commit under it
    await background.drain(0)


async def test_a_redelivery_after_a_restart_is_still_a_duplicate(db: Database) -> None:
    clock = FakeClock()
    before = BackgroundTasks()
    first = PersistentDeduper(CallbackDedupeRepository(db), 3600, clock, before)
    long_key = "token:" + "x" * 300  # stored hashed: the warmed form must match
    assert await first.first_seen("event:abc")
    assert await first.first_seen(long_key)
    await before.drain(5)

    restarted = PersistentDeduper(CallbackDedupeRepository(db), 3600, clock, BackgroundTasks())
    assert await restarted.warm() == 2
    assert await restarted.first_seen("event:abc") is False
    assert await restarted.first_seen(long_key) is False
    assert await restarted.first_seen("event:new") is True


async def test_expired_keys_are_not_warmed(db: Database) -> None:
    clock = FakeClock()
    background = BackgroundTasks()
    first = PersistentDeduper(CallbackDedupeRepository(db), 60, clock, background)
    assert await first.first_seen("event:old")
    await background.drain(5)
    await clock.advance(61)
    restarted = PersistentDeduper(CallbackDedupeRepository(db), 60, clock, BackgroundTasks())
    assert await restarted.warm() == 0
    assert await restarted.first_seen("event:old") is True


async def test_every_deduper_the_service_uses_answers_the_one_port_alike(db: Database) -> None:
    # ports.Deduper: the pipeline is handed any of these; a click seen once is a duplicate after, in all.
    background = BackgroundTasks()
    dedupers: list[Deduper] = [
        MemoryDeduper(60, now=FakeClock().monotonic),
        PersistentDeduper(CallbackDedupeRepository(db), 60, FakeClock(), background),
    ]
    for deduper in dedupers:
        assert await deduper.warm() == 0
        assert await deduper.first_seen("event:port") is True
        assert await deduper.first_seen("event:port") is False
        assert await deduper.first_seen("token:port") is True
    await background.drain(5)
