"""The packaged alembic migrations: up, down, state, the ini file, and agreement with the models."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import inspect, select, text
from sqlalchemy.engine import Connection

from feishu_progress.db.engine import Database, normalize_url
from feishu_progress.db.migrate import downgrade, head_revision, migration_state, upgrade
from feishu_progress.db.models import Base, SessionRow

REPO_ROOT = Path(__file__).resolve().parent.parent
APP_TABLES = {"session", "subagent_execution", "task_card", "task_action", "callback_seen", "instance_lease"}


async def table_names(url: str) -> set[str]:
    database = Database.open(url)
    try:
        async with database.engine.connect() as connection:
            return await connection.run_sync(lambda sync: set(inspect(sync).get_table_names()))
    finally:
        await database.close()


async def check_up_and_down(url: str) -> None:
    await downgrade(url, "base")
    assert APP_TABLES.isdisjoint(await table_names(url))
    assert await migration_state(url) == (None, head_revision())

    await upgrade(url)
    assert await table_names(url) >= APP_TABLES
    assert await migration_state(url) == (head_revision(), head_revision())

    await downgrade(url)
    assert APP_TABLES.isdisjoint(await table_names(url))
    await upgrade(url)  # reversible: up again after down
    assert await table_names(url) >= APP_TABLES


async def test_sqlite_migrates_up_and_down(tmp_path: Path) -> None:
    url = f"sqlite+aiosqlite:///{tmp_path / 'up-down.db'}"
    assert await migration_state(url) == (None, head_revision())
    await check_up_and_down(url)


@pytest.mark.mysql
async def test_mysql_migrates_up_and_down(mysql_url: str) -> None:
    # Ends migrated to head, which is what the session-wide mysql_url promises the other tests.
    await check_up_and_down(mysql_url)


def _schema_diff(connection: Connection) -> list[object]:
    return list(compare_metadata(MigrationContext.configure(connection), Base.metadata))


async def test_migration_creates_exactly_the_models_schema(db: Database) -> None:
    async with db.engine.connect() as connection:
        diff = await connection.run_sync(_schema_diff)
    assert diff == []


async def test_emoji_and_cjk_titles_round_trip(db: Database) -> None:
    title = "排查卡片进度链路 🐱‍👤 終端 🇨🇳 — ok"
    async with db.session() as session:
        row = SessionRow(title=title)
        session.add(row)
        await session.flush()
        row_id = row.id
    async with db.session() as session:
        assert await session.scalar(select(SessionRow.title).where(SessionRow.id == row_id)) == title


@pytest.mark.mysql
async def test_mysql_tables_are_utf8mb4(mysql_url: str) -> None:
    database = Database.open(mysql_url)
    try:
        async with database.engine.connect() as connection:
            collations = (
                await connection.execute(
                    text(
                        "SELECT table_name, table_collation FROM information_schema.tables "
                        "WHERE table_schema = DATABASE()"
                    )
                )
            ).all()
    finally:
        await database.close()
    by_table = {name: collation for name, collation in collations if name in APP_TABLES}
    assert set(by_table) == APP_TABLES
    assert set(by_table.values()) == {"utf8mb4_bin"}


def test_mysql_urls_get_utf8mb4_unless_they_name_a_charset() -> None:
    assert normalize_url("mysql+aiomysql://u@h/db").query == {"charset": "utf8mb4"}
    assert normalize_url("mysql+aiomysql://u@h/db?charset=utf8").query == {"charset": "utf8"}
    assert normalize_url("sqlite+aiosqlite:///x.db").query == {}


def test_operators_can_run_alembic_with_the_repository_ini(tmp_path: Path) -> None:
    database_file = tmp_path / "operator.db"
    env = {**os.environ, "FP_DATABASE_URL": f"sqlite+aiosqlite:///{database_file}"}
    result = subprocess.run(
        [sys.executable, "-m", "alembic", "-c", str(REPO_ROOT / "alembic.ini"), "upgrade", "head"],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert "0001_initial" in result.stderr  # alembic logs "Running upgrade  -> 0001_initial"
    assert database_file.exists()


@pytest.mark.parametrize("backend", ["sqlite", pytest.param("mysql", marks=pytest.mark.mysql)])
async def test_cards_from_before_several_apps_belong_to_the_default_app(
    backend: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    url = (
        f"sqlite+aiosqlite:///{tmp_path / 'apps.db'}"
        if backend == "sqlite"
        else request.getfixturevalue("mysql_url")
    )
    await downgrade(url, "base")
    await upgrade(url, "0003_cardkit_and_cluster")
    database = Database.open(url)
    try:
        async with database.engine.begin() as connection:
            await connection.execute(text("INSERT INTO session (id, title) VALUES (7, 't')"))
            await connection.execute(
                text(
                    "INSERT INTO task_card (session_id, receive_id, receive_id_type, requester_open_id) "
                    "VALUES (7, 'oc_1', 'chat_id', 'ou_1')"
                )
            )
        await upgrade(url)
        async with database.engine.connect() as connection:
            apps = (await connection.execute(text("SELECT app FROM task_card"))).scalars().all()
        assert apps == ["default"]
    finally:
        await database.close()
        await downgrade(url, "base")
        await upgrade(url)  # the session-wide MariaDB database stays at head for the other tests
