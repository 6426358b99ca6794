"""Attach mode (issue 17 item 1): running subagents read, read-only, from the agent's own database.

The agent's database is made here the way the agent has it (plain SQL, not our migrations, with columns
we never read), on MariaDB with a user granted SELECT only, and as a second SQLite file. The service is
the whole app in-process, its cards going over real HTTP to the sandbox.
"""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import AsyncIterator, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp.test_utils import TestClient
from prometheus_client import CollectorRegistry
from pydantic import ValidationError
from sqlalchemy import func, select, text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine
from sqlalchemy.pool import NullPool

from feishu_progress.app import ADMIN_URL, SERVICES, create_app
from feishu_progress.config import (
    CardSettings,
    Settings,
    SubagentsSettings,
)
from feishu_progress.db.engine import Database
from feishu_progress.db.models import SubagentExecution
from feishu_progress.errors import ConfigError
from feishu_progress.runtime.applier import attached_execution_id
from feishu_progress.sandbox.server import RunningSandbox
from feishu_progress.subagents.attach import agent_tables, open_agent_database, read_only_url
from feishu_progress.subagents.manager import SubagentManager
from feishu_progress.subagents.query import list_running_by_parent, list_running_by_parents
from tests.conftest import fresh_mysql_database, sqlite_url
from tests.rigs import AUTH, app_settings_for, eventually

PARENT = 7_000_000_123  # the agent's own session id of the task
OTHER_PARENT = 7_000_000_999
HEADING = "**子代理 · {count} 个运行中**"

# The agent's schema as the agent has it: more columns than the seed's, none of ours.
MYSQL_SCHEMA = (
    """CREATE TABLE session (
        id BIGINT PRIMARY KEY AUTO_INCREMENT,
        title VARCHAR(255) NULL,
        user_id BIGINT NULL,
        created_at DATETIME NOT NULL DEFAULT CURRENT_TIMESTAMP
    ) CHARACTER SET utf8mb4""",
    """CREATE TABLE subagent_execution (
        id BIGINT PRIMARY KEY AUTO_INCREMENT,
        parent_session_id BIGINT NOT NULL,
        child_session_id BIGINT NULL,
        agent_type VARCHAR(64) NULL,
        task_description TEXT NULL,
        status VARCHAR(32) NOT NULL,
        total_rounds INT NULL,
        invocation_type VARCHAR(32) NOT NULL,
        result MEDIUMTEXT NULL,
        started_at DATETIME NOT NULL DEFAULT CURRENT_TIMESTAMP,
        KEY idx_sae_parent (parent_session_id)
    ) CHARACTER SET utf8mb4""",
)
SQLITE_SCHEMA = (
    "PRAGMA journal_mode=WAL",  # the agent's own choice; a read-only reader must cope with it
    """CREATE TABLE session (
        id INTEGER PRIMARY KEY AUTOINCREMENT, title TEXT, user_id INTEGER,
        created_at TEXT NOT NULL DEFAULT CURRENT_TIMESTAMP)""",
    """CREATE TABLE subagent_execution (
        id INTEGER PRIMARY KEY AUTOINCREMENT, parent_session_id INTEGER NOT NULL, child_session_id INTEGER,
        agent_type TEXT, task_description TEXT, status TEXT NOT NULL, total_rounds INTEGER,
        invocation_type TEXT NOT NULL, result TEXT, started_at TEXT NOT NULL DEFAULT CURRENT_TIMESTAMP)""",
    "CREATE INDEX idx_sae_parent ON subagent_execution (parent_session_id)",
)


@dataclass
class AgentDatabase:
    """The agent's database: the agent writes through ``owner``, the service gets ``reader_url``.

    ``written`` is every row as the agent's last write left them: each write first checks that nobody
    else changed anything since, so a write by the service at any point fails the test.
    """

    owner: AsyncEngine
    reader_url: str
    written: list[tuple[Any, ...]] = field(default_factory=list)

    async def _write(self, sql: str, **params: object) -> int | None:
        assert await self.fingerprint() == self.written, "someone else wrote to the agent's database"
        async with self.owner.begin() as connection:
            row_id = (await connection.execute(text(sql), params)).lastrowid
        self.written = await self.fingerprint()
        return row_id

    async def _insert(self, sql: str, **params: object) -> int:
        row_id = await self._write(sql, **params)
        assert isinstance(row_id, int)
        return row_id

    async def add_execution(
        self,
        parent: int,
        *,
        status: str = "RUNNING",
        invocation: str = "BACKGROUND",
        agent_type: str | None = "explorer",
        title: str | None = None,
        total_rounds: int | None = None,
        description: str | None = None,
    ) -> int:
        child = await self._insert("INSERT INTO session (title) VALUES (:title)", title=title)
        return await self._insert(
            "INSERT INTO subagent_execution (parent_session_id, child_session_id, agent_type,"
            " task_description, status, total_rounds, invocation_type, result)"
            " VALUES (:parent, :child, :type, :description, :status, :rounds, :invocation, 'secret result')",
            parent=parent,
            child=child,
            type=agent_type,
            description=description,
            status=status,
            rounds=total_rounds,
            invocation=invocation,
        )

    async def set_status(self, execution_id: int, status: str) -> None:
        await self._write(
            "UPDATE subagent_execution SET status = :status WHERE id = :id", status=status, id=execution_id
        )

    async def fingerprint(self) -> list[tuple[Any, ...]]:
        """Every row of both tables: what must be the same before and after the service ran."""
        async with self.owner.connect() as connection:
            rows: list[tuple[Any, ...]] = []
            for table in ("session", "subagent_execution"):
                result = await connection.execute(text(f"SELECT * FROM {table} ORDER BY id"))
                rows.extend(tuple(row) for row in result)
            return rows


@pytest.fixture(scope="module")
def agent_mysql_url() -> str:
    """An empty second MariaDB database (the agent's), made once for this module."""
    return fresh_mysql_database("agent")


async def _mysql_reader(owner: AsyncEngine, owner_url: str) -> tuple[str, str]:
    """A user granted SELECT only on the agent's database; returns (its URL, its account)."""
    url = make_url(owner_url)
    database = url.database or ""
    account = f"'{('fp_r_' + database)[:80]}'@'{url.host}'"
    password = secrets.token_hex(12)
    async with owner.begin() as connection:
        await connection.execute(text(f"DROP USER IF EXISTS {account}"))
        await connection.execute(text(f"CREATE USER {account} IDENTIFIED BY '{password}'"))
        await connection.execute(text(f"GRANT SELECT ON `{database}`.* TO {account}"))
    user = account.split("'")[1]
    reader = url.set(username=user, password=password).render_as_string(hide_password=False)
    return reader, account


async def _reset_mysql_tables(owner: AsyncEngine) -> None:
    async with owner.begin() as connection:
        for table in ("subagent_execution", "session"):
            await connection.execute(text(f"DROP TABLE IF EXISTS {table}"))
        for statement in MYSQL_SCHEMA:
            await connection.execute(text(statement))


@pytest.fixture(params=["sqlite", pytest.param("mysql", marks=pytest.mark.mysql)])
def agent_owner_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """The agent's database as its owner reaches it: a second SQLite file, or the second MariaDB database."""
    if request.param == "mysql":
        url: str = request.getfixturevalue("agent_mysql_url")
        return url
    return f"sqlite+aiosqlite:///{tmp_path / 'agent.db'}"


@pytest.fixture
async def agent(agent_owner_url: str) -> AsyncIterator[AgentDatabase]:
    owner = create_async_engine(agent_owner_url, poolclass=NullPool)
    if owner.dialect.name == "sqlite":
        async with owner.begin() as connection:
            for statement in SQLITE_SCHEMA:
                await connection.execute(text(statement))
        try:
            yield AgentDatabase(owner, agent_owner_url)  # the same file; the service opens it read-only
        finally:
            await owner.dispose()
        return
    await _reset_mysql_tables(owner)
    reader_url, account = await _mysql_reader(owner, agent_owner_url)
    try:
        yield AgentDatabase(owner, reader_url)
    finally:
        async with owner.begin() as connection:
            await connection.execute(text(f"DROP USER IF EXISTS {account}"))
        await owner.dispose()


@pytest.fixture
async def reader(agent: AgentDatabase) -> AsyncIterator[Database]:
    database = open_agent_database(agent.reader_url)
    try:
        yield database
    finally:
        await database.close()


# -- the query on the agent's tables ------------------------------------------------------------------


async def test_the_query_reads_running_background_rows_of_the_agents_tables(
    agent: AgentDatabase, reader: Database
) -> None:
    running = await agent.add_execution(PARENT, title="后台子代理(explorer): 排查卡片进度链路")
    recovering = await agent.add_execution(
        PARENT,
        status="RECOVERING",
        invocation="FOLLOWUP",
        agent_type="worker",
        title=None,
        total_rounds=3,
        description="实现子代理展示",
    )
    for status in ("COMPLETED", "FAILED", "CANCELLED"):
        await agent.add_execution(PARENT, status=status, title=status)
    await agent.add_execution(PARENT, invocation="DELEGATE", title="旧委派")
    other = await agent.add_execution(OTHER_PARENT, title="别的任务")
    tables = agent_tables()

    rows = await list_running_by_parent(reader, PARENT, tables)
    assert [(row.id, row.status, row.total_rounds) for row in rows] == [
        (running, "RUNNING", 0),  # NULL total_rounds: no rounds known yet
        (recovering, "RECOVERING", 3),
    ]
    assert rows[0].child_title == "后台子代理(explorer): 排查卡片进度链路"
    batched = await list_running_by_parents(reader, [PARENT, OTHER_PARENT, 1], tables)
    assert {parent: [row.id for row in found] for parent, found in batched.items()} == {
        PARENT: [running, recovering],
        OTHER_PARENT: [other],
        1: [],
    }
    summaries = await SubagentManager(reader, tables, forget_unlisted=True).list_running(PARENT)
    assert [(s.agent_type, s.title, s.round) for s in summaries] == [
        ("explorer", "排查卡片进度链路", 0),
        ("worker", "实现子代理展示", 3),
    ]


async def test_a_write_through_the_reader_fails_loudly(agent: AgentDatabase, reader: Database) -> None:
    await agent.add_execution(PARENT, title="x")
    statements = (
        "INSERT INTO subagent_execution (parent_session_id, status, invocation_type)"
        " VALUES (1, 'RUNNING', 'BACKGROUND')",
        "UPDATE subagent_execution SET status = 'CANCELLED'",
        "DELETE FROM session",
    )
    for statement in statements:
        with pytest.raises(DBAPIError):
            async with reader.engine.begin() as connection:
                await connection.execute(text(statement))
    assert await agent.fingerprint() == agent.written


async def test_the_read_only_session_refuses_writes_even_with_a_writing_account(agent: AgentDatabase) -> None:
    """The engine's own guard (READ ONLY session / mode=ro), independent of the grants it is given."""
    owner_url = agent.owner.url.render_as_string(hide_password=False)
    guarded = open_agent_database(owner_url)
    try:
        with pytest.raises(DBAPIError, match=r"(?i)read.?only"):
            async with guarded.engine.begin() as connection:
                await connection.execute(text("DELETE FROM session"))
        await guarded.ping()  # reading still works
    finally:
        await guarded.close()


def test_read_only_url_forms() -> None:
    ro = read_only_url("sqlite+aiosqlite:////data/agent #1%.db")
    assert ro.database == "file:/data/agent%20%231%25.db"
    assert dict(ro.query) == {"mode": "ro", "uri": "true"}
    already = read_only_url("sqlite+aiosqlite:///file:/data/a.db?uri=true&mode=rw&cache=shared")
    assert already.database == "file:/data/a.db"
    assert dict(already.query) == {"uri": "true", "mode": "ro", "cache": "shared"}
    mysql = read_only_url("mysql+aiomysql://reader:pw@db:3306/agent")
    assert mysql.database == "agent" and mysql.query["charset"] == "utf8mb4"
    for memory in ("sqlite+aiosqlite://", "sqlite+aiosqlite:///:memory:"):
        with pytest.raises(ConfigError):
            read_only_url(memory)


def test_attach_settings_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FP_SUBAGENTS__DATABASE_URL", "mysql+aiomysql://reader:pw@db/agent")
    monkeypatch.setenv("FP_SUBAGENTS__EXECUTION_TABLE", "agent_subagent_execution")
    settings = Settings(_env_file=None)  # type: ignore[call-arg]
    assert settings.subagents.attached
    assert settings.subagents.execution_table == "agent_subagent_execution"
    assert settings.subagents.session_table == "session"
    monkeypatch.setenv("FP_SUBAGENTS__DATABASE_URL", " ")
    assert not Settings(_env_file=None).subagents.attached  # type: ignore[call-arg]
    with pytest.raises(ValidationError):
        SubagentsSettings(session_table="other_db.session")


def test_a_runtime_task_id_is_an_execution_id_only_when_it_is_one() -> None:
    assert attached_execution_id("42") == 42
    for not_an_id in ("", "0", "abc", "4a", "-3", "٣", "9" * 20, str(2**63)):
        assert attached_execution_id(not_an_id) is None


async def test_a_tracked_round_is_forgotten_once_the_agent_no_longer_lists_it(
    agent: AgentDatabase, reader: Database
) -> None:
    manager = SubagentManager(reader, agent_tables(), forget_unlisted=True)
    first = await agent.add_execution(PARENT, title="a")
    manager.track(first, PARENT)
    manager.set_round(first, 6)
    manager.track(999_999, OTHER_PARENT)  # another parent's, not asked about: kept
    assert [s.round for s in await manager.list_running(PARENT)] == [6]
    await agent.set_status(first, "COMPLETED")  # the agent finished it and no event told us
    assert await manager.list_running(PARENT) == []
    assert manager.tracked(PARENT) == []
    assert manager.tracked(OTHER_PARENT) == [999_999]


# -- the whole app --------------------------------------------------------------------------------


def _settings(tmp_path: Path, sandbox: RunningSandbox, agent_url: str) -> Settings:
    return app_settings_for(
        sandbox,
        sqlite_url(tmp_path / "service.db"),
        card=CardSettings(locales=("zh_cn",)),
        subagents=SubagentsSettings(database_url=agent_url),
    )


@pytest.fixture
def app_settings(agent: AgentDatabase, sandbox: RunningSandbox, tmp_path: Path) -> Settings:
    return _settings(tmp_path, sandbox, agent.reader_url)


async def _create(
    client: TestClient[Any, Any], session_id: int | None = PARENT, key: str | None = None
) -> aiohttp.ClientResponse:
    body: dict[str, Any] = {"receive_id": "oc_1", "receive_id_type": "chat_id", "requester_open_id": "ou_r"}
    if session_id is not None:
        body["session_id"] = session_id
    headers = AUTH if key is None else {**AUTH, "Idempotency-Key": key}
    return await client.post("/v1/tasks", json=body, headers=headers)


async def _events(client: TestClient[Any, Any], *events: Mapping[str, Any]) -> None:
    response = await client.post(f"/v1/tasks/{PARENT}/events", json={"events": list(events)}, headers=AUTH)
    assert response.status == 202, await response.text()


def _subagent_section(card: Any) -> str | None:
    """The markdown of the card's 子代理 section, if it has one."""
    if isinstance(card, dict):
        content = card.get("content")
        if card.get("tag") == "markdown" and isinstance(content, str) and content.startswith("**子代理"):
            return content
        children: Iterator[Any] = iter(card.values())
    elif isinstance(card, list):
        children = iter(card)
    else:
        return None
    for child in children:
        found = _subagent_section(child)
        if found is not None:
            return found
    return None


async def _card_section(
    sandbox: RunningSandbox, message_id: str, expected: str | None, timeout: float = 5.0
) -> None:
    """Wait (bounded) until the card Feishu last received shows ``expected`` as its 子代理 section."""
    await eventually(
        lambda: _subagent_section(sandbox.state.messages[message_id].card),
        until=lambda section: section == expected,
        timeout=timeout,
        what=f"the card's 子代理 section to be {expected!r}",
    )


async def test_the_card_shows_exactly_the_agents_running_subagents(
    client: TestClient[Any, Any], sandbox: RunningSandbox, agent: AgentDatabase
) -> None:
    created = await _create(client)
    assert created.status == 201, await created.text()
    message_id = (await created.json())["message_id"]
    explorer = await agent.add_execution(PARENT, title="后台子代理(explorer): 排查卡片进度链路")
    worker = await agent.add_execution(
        PARENT,
        status="RECOVERING",
        invocation="FOLLOWUP",
        agent_type="worker",
        title="实现子代理展示",
        total_rounds=3,
    )
    await agent.add_execution(PARENT, status="COMPLETED", agent_type="reviewer", title="已完成的审查")
    await agent.add_execution(PARENT, invocation="DELEGATE", title="历史委派")
    await agent.add_execution(OTHER_PARENT, title="别的任务的子代理")

    await _events(
        client,
        {"type": "subagent_started", "task_id": str(explorer), "agent_type": "explorer"},
        {"type": "subagent_started", "task_id": str(worker), "agent_type": "worker"},  # its 3 rounds stay
    )
    await _card_section(
        sandbox,
        message_id,
        "\n".join(
            (
                HEADING.format(count=2),
                "- 调研 · 排查卡片进度链路",
                "- 开发 · 实现子代理展示 · 第 3 轮 · 恢复中",
            )
        ),
    )
    await _events(client, {"type": "subagent_round", "task_id": str(explorer), "round": 4})
    await _card_section(
        sandbox,
        message_id,
        "\n".join(
            (
                HEADING.format(count=2),
                "- 调研 · 排查卡片进度链路 · 第 4 轮",
                "- 开发 · 实现子代理展示 · 第 3 轮 · 恢复中",
            )
        ),
    )
    await agent.set_status(worker, "COMPLETED")
    await _events(client, {"type": "subagent_finished", "task_id": str(worker), "status": "COMPLETED"})
    await _card_section(
        sandbox, message_id, "\n".join((HEADING.format(count=1), "- 调研 · 排查卡片进度链路 · 第 4 轮"))
    )
    await agent.set_status(worker, "RUNNING")  # the agent's row is the truth, whatever the events said
    await _events(client, {"type": "subagent_status", "task_id": "not-an-id", "status": "RUNNING"})
    await _card_section(
        sandbox,
        message_id,
        "\n".join(
            (
                HEADING.format(count=2),
                "- 调研 · 排查卡片进度链路 · 第 4 轮",
                "- 开发 · 实现子代理展示 · 第 3 轮",
            )
        ),
    )
    assert await agent.fingerprint() == agent.written  # the service wrote nothing there, ever
    service_db = client.app[SERVICES].db
    assert service_db is not None
    async with service_db.engine.connect() as connection:  # nothing went to our own copy either
        assert await connection.scalar(select(func.count()).select_from(SubagentExecution)) == 0


async def test_on_cardkit_a_subagent_finished_in_the_agents_database_leaves_the_card_at_the_next_text(
    client: TestClient[Any, Any], sandbox: RunningSandbox, agent: AgentDatabase
) -> None:
    """Issue 25 item 13: no subagent event says it finished; a text-only change must carry the panels."""
    created = await _create(client)
    assert created.status == 201, await created.text()
    message_id = (await created.json())["message_id"]
    assert sandbox.state.messages[message_id].card_id is not None  # the CardKit transport
    explorer = await agent.add_execution(PARENT, title="后台子代理(explorer): 排查卡片进度链路")
    worker = await agent.add_execution(PARENT, agent_type="worker", title="实现子代理展示")
    await _events(
        client,
        {"type": "status", "status": "RUNNING", "round": 1},
        {"type": "content_delta", "text": "开始"},
        {"type": "subagent_started", "task_id": str(explorer), "agent_type": "explorer"},
        {"type": "subagent_started", "task_id": str(worker), "agent_type": "worker"},
    )
    both = "\n".join((HEADING.format(count=2), "- 调研 · 排查卡片进度链路", "- 开发 · 实现子代理展示"))
    await _card_section(sandbox, message_id, both)
    await agent.set_status(worker, "COMPLETED")  # only the agent's row says so
    await asyncio.sleep(1.1)  # past the running list's 1 s cache (seed 002 §4.1): the next load sees it
    await _events(client, {"type": "content_delta", "text": ",继续输出"})
    await _card_section(
        sandbox, message_id, "\n".join((HEADING.format(count=1), "- 调研 · 排查卡片进度链路")), timeout=2.0
    )
    entity = sandbox.state.cardkit.cards[sandbox.state.messages[message_id].card_id or ""]
    assert entity.record.streams, "the text streamed (element content) as well"


async def test_readyz_checks_the_agent_database(client: TestClient[Any, Any]) -> None:
    async with aiohttp.ClientSession() as http, http.get(f"{client.app[ADMIN_URL]}/readyz") as response:
        assert response.status == 200, await response.text()
        assert "subagents_database" in (await response.json())["checks"]


async def test_an_unreachable_agent_database_fails_readyz_and_only_hides_the_section(
    sandbox: RunningSandbox, tmp_path: Path, aiohttp_client: Any
) -> None:
    missing = f"sqlite+aiosqlite:///{tmp_path / 'no-such-dir' / 'agent.db'}"
    app = create_app(_settings(tmp_path, sandbox, missing), registry=CollectorRegistry())
    client: TestClient[Any, Any] = await aiohttp_client(app)
    created = await _create(client)
    assert created.status == 201
    message_id = (await created.json())["message_id"]
    await _events(
        client, {"type": "subagent_started", "task_id": "1"}, {"type": "content", "text": "正文照常"}
    )
    await eventually(lambda: "正文照常" in str(sandbox.state.messages[message_id].card), timeout=5)
    assert _subagent_section(sandbox.state.messages[message_id].card) is None
    admin_url = client.app[ADMIN_URL]
    async with aiohttp.ClientSession() as http, http.get(f"{admin_url}/readyz") as response:
        assert response.status == 503
        assert "subagents_database" in (await response.json())["reasons"]


async def test_a_session_id_is_taken_once_unless_the_idempotency_key_matches(
    client: TestClient[Any, Any],
) -> None:
    first = await _create(client, key="run-1")
    assert first.status == 201
    created = await first.json()
    assert created["session_id"] == PARENT
    assert (await _create(client)).status == 409  # no key
    other_key = await _create(client, key="run-2")
    assert other_key.status == 409
    assert (await other_key.json())["error"] == "task_exists"
    again = await _create(client, key="run-1")
    assert again.status == 201
    assert await again.json() == created
    generated = await _create(client, session_id=None)
    assert generated.status == 201
    assert (await generated.json())["session_id"] != PARENT
