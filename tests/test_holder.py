"""Single mode: one process owns a database (feishu_progress/holder.py), on SQLite and MariaDB.

The row logic runs against both backends through the ``db`` fixture; "another host" is a holder built
with another host name. ``serve`` refusing a held database as a user sees it: tests/test_serve_start.py.
"""

from __future__ import annotations

import os
import subprocess
import sys
from datetime import UTC, timedelta
from pathlib import Path

import pytest
from sqlalchemy import select, update

from feishu_progress.db.engine import Database
from feishu_progress.db.models import InstanceHolder, utc_now
from feishu_progress.holder import DatabaseHeld, DatabaseHolder

REPO = Path(__file__).resolve().parent.parent


def on_host(db: Database, host: str, instance_id: str = "fp-a", pid: int = 4242) -> DatabaseHolder:
    return DatabaseHolder(db, instance_id, host=host, pid=pid)


async def age_heartbeat(db: Database, seconds: float) -> None:
    """Move the holder's heartbeat ``seconds`` into the past on the database's clock (a silent holder)."""
    async with db.engine.begin() as connection:
        now = await connection.scalar(select(utc_now()))
        assert now is not None
        when = now.replace(tzinfo=UTC) - timedelta(seconds=seconds)
        await connection.execute(update(InstanceHolder).values(heartbeat_at=when))


async def holder_row(db: Database) -> tuple[str, str, int] | None:
    async with db.engine.connect() as connection:
        row = (
            await connection.execute(
                select(InstanceHolder.instance_id, InstanceHolder.host, InstanceHolder.pid)
            )
        ).first()
    return None if row is None else (row[0], row[1], row[2])


async def test_a_fresh_holder_refuses_a_second_process_naming_it(db: Database) -> None:
    first = on_host(db, "host-a", "fp-a", 4242)
    await first.claim()
    second = on_host(db, "host-b", "fp-b", 99)
    with pytest.raises(DatabaseHeld) as refused:
        await second.claim()
    message = str(refused.value)
    assert "fp-a" in message and "host host-a" in message and "pid 4242" in message
    assert "FP_DATABASE_URL" in message and "FP_REDIS_URL" in message  # the fixes
    assert await holder_row(db) == ("fp-a", "host-a", 4242)  # untouched
    assert await first.heartbeat() and first.lost is None


async def test_a_stale_holder_is_taken_over_and_finds_out_at_its_next_beat(db: Database) -> None:
    crashed = on_host(db, "host-a")
    await crashed.claim()
    await age_heartbeat(db, crashed.stale_after + 5)
    successor = on_host(db, "host-b", "fp-b", 99)
    await successor.claim()
    assert await holder_row(db) == ("fp-b", "host-b", 99)
    assert not await crashed.heartbeat()  # it was only hung: now it knows
    assert crashed.lost is not None and "another process" in crashed.lost
    assert await successor.heartbeat()


async def test_a_heartbeat_keeps_the_holder_fresh(db: Database) -> None:
    holder = on_host(db, "host-a")
    await holder.claim()
    await age_heartbeat(db, holder.stale_after - 1)
    assert await holder.heartbeat()
    with pytest.raises(DatabaseHeld) as refused:
        await on_host(db, "host-b").claim()
    assert refused.value.holder.heartbeat_age_seconds < holder.stale_after - 1  # renewed, not the old age


async def test_this_hosts_dead_process_is_taken_over_at_once(db: Database) -> None:
    gone = subprocess.Popen([sys.executable, "-c", "pass"])  # a pid of this host that no longer runs
    gone.wait()
    await on_host(db, "host-a", "fp-old", gone.pid).claim()  # crashed: its heartbeat is still fresh
    await on_host(db, "host-a", "fp-new", os.getpid()).claim()
    assert await holder_row(db) == ("fp-new", "host-a", os.getpid())
    # A live process on this host is another serve: refused like any other.
    with pytest.raises(DatabaseHeld):
        await on_host(db, "host-a", "fp-third", os.getppid()).claim()


async def test_a_released_database_is_claimed_without_waiting(db: Database) -> None:
    first = on_host(db, "host-a")
    await first.claim()
    await first.release()
    assert await holder_row(db) is None
    await on_host(db, "host-b").claim()
    await first.release()  # releases only its own claim
    assert await holder_row(db) is not None
