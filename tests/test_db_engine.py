"""The Database: URLs, pool options, SQLite pragmas, ping and close."""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy import text
from sqlalchemy.exc import IntegrityError, OperationalError

from feishu_progress.db.engine import Database, engine_options, normalize_url
from feishu_progress.db.models import TaskCard


async def test_ping_answers_on_both_backends(db: Database) -> None:
    await db.ping()


async def test_ping_raises_when_no_server_answers() -> None:
    database = Database.open("mysql+aiomysql://root@127.0.0.1:1/test", connect_args={"connect_timeout": 2})
    try:
        with pytest.raises(OperationalError):
            await database.ping()
    finally:
        await database.close()


def test_mysql_pool_recycles_before_wait_timeout() -> None:
    options = engine_options(normalize_url("mysql+aiomysql://root@127.0.0.1/test"))
    assert options["pool_pre_ping"] is True
    assert 0 < options["pool_recycle"] < 28800  # MySQL's default wait_timeout
    assert engine_options(normalize_url("sqlite+aiosqlite:///x.db")) == {}


async def test_sqlite_connections_use_wal_and_foreign_keys(tmp_path: Path) -> None:
    database = Database.open(f"sqlite+aiosqlite:///{tmp_path / 'p.db'}")
    try:
        async with database.engine.connect() as connection:
            assert (await connection.execute(text("PRAGMA journal_mode"))).scalar() == "wal"
            assert (await connection.execute(text("PRAGMA foreign_keys"))).scalar() == 1
    finally:
        await database.close()


async def test_task_card_needs_its_session_on_both_backends(db: Database) -> None:
    with pytest.raises(IntegrityError):
        async with db.session() as session:
            session.add(
                TaskCard(
                    session_id=987654, receive_id="oc", receive_id_type="chat_id", requester_open_id="ou"
                )
            )


async def test_session_rolls_back_on_error(db: Database) -> None:
    with pytest.raises(RuntimeError):
        async with db.session() as session:
            await session.execute(
                text("INSERT INTO callback_seen (`key`, expires_at) VALUES ('k', '2026-01-01')")
            )
            raise RuntimeError("boom")
    async with db.session() as session:
        assert (await session.execute(text("SELECT COUNT(*) FROM callback_seen"))).scalar() == 0
