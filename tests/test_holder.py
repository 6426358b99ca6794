"""Single mode: one process owns a database (feishu_progress/holder.py), on SQLite and MariaDB.

The row logic runs against both backends through the ``db`` fixture; "another host" is a holder built
with another host name. The last tests run ``serve`` as a user does (subprocesses): a second one on the
same database refuses in one line naming the first, and busy ports name their setting.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import AsyncIterator, Mapping
from datetime import UTC, timedelta
from pathlib import Path

import aiohttp
import pytest
from sqlalchemy import select, update

from feishu_progress.db.engine import Database
from feishu_progress.db.models import InstanceHolder, utc_now
from feishu_progress.holder import DatabaseHeld, DatabaseHolder
from tests.service_process import free_port

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


# --- serve, as a user runs it ---------------------------------------------------------------------------


def serve_env(tmp_path: Path, db_name: str, port: int, admin_port: int) -> dict[str, str]:
    env = {key: value for key, value in os.environ.items() if not key.startswith("FP_")}
    env.update(
        PYTHONPATH=str(REPO),
        FP_DATABASE_URL=f"sqlite+aiosqlite:///{tmp_path / db_name}",
        FP_HTTP__PORT=str(port),
        FP_ADMIN__PORT=str(admin_port),
        FP_INSTANCE_ID="fp-first",
        FP_LOG_LEVEL="WARNING",
    )
    return env


async def refused_line(env: Mapping[str, str], cwd: Path) -> str:
    """Run a serve that must refuse: its exit code is not 0, it ends on one line and no traceback."""
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "feishu_progress", "serve",
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=dict(env), cwd=cwd,
    )  # fmt: skip
    stdout, stderr = await asyncio.wait_for(process.communicate(), 60)
    assert process.returncode not in (0, None)
    output = stderr.decode()
    assert "Traceback" not in output, output
    refusals = [line for line in output.splitlines() if line.startswith("feishu-progress:")]
    assert len(refusals) == 1 and output.rstrip().endswith(refusals[0]), output  # besides the log's warnings
    assert "sandbox preview" not in stdout.decode()  # it never listened
    return refusals[0]


@pytest.fixture
async def first_serve(tmp_path: Path) -> AsyncIterator[tuple[int, int]]:
    port, admin_port = free_port(), free_port()
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "feishu_progress", "serve",
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        env=serve_env(tmp_path, "one.db", port, admin_port), cwd=tmp_path,
    )  # fmt: skip
    try:
        async with aiohttp.ClientSession() as http, asyncio.timeout(60):
            while True:
                try:
                    async with http.get(f"http://127.0.0.1:{admin_port}/readyz") as response:
                        if response.status == 200:
                            break
                except aiohttp.ClientError:
                    pass
                await asyncio.sleep(0.2)
        yield port, admin_port
    finally:
        process.terminate()
        await process.wait()


@pytest.mark.slow
async def test_a_second_serve_refuses_in_one_line_and_busy_ports_name_their_setting(
    first_serve: tuple[int, int], tmp_path: Path
) -> None:
    port, admin_port = first_serve
    same_database = serve_env(tmp_path, "one.db", free_port(), free_port())
    line = await refused_line({**same_database, "FP_INSTANCE_ID": "fp-second"}, tmp_path)
    assert "will not serve" in line and "instance fp-first" in line and "FP_DATABASE_URL" in line, line

    busy_admin = serve_env(tmp_path, "two.db", free_port(), admin_port)
    line = await refused_line(busy_admin, tmp_path)
    assert "FP_ADMIN__PORT" in line and str(admin_port) in line, line

    busy_http = serve_env(tmp_path, "three.db", port, free_port())
    line = await refused_line(busy_http, tmp_path)
    assert "FP_HTTP__PORT" in line and str(port) in line, line
    # The refused one let go of its database on the way out: another serve may have it at once.
    assert await holder_row_of(tmp_path / "three.db") is None


async def holder_row_of(path: Path) -> tuple[str, str, int] | None:
    database = Database.open(f"sqlite+aiosqlite:///{path}")
    try:
        return await holder_row(database)
    finally:
        await database.close()
