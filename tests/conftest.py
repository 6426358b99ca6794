"""Shared fixtures.

Database: ``db`` is a migrated ``Database`` on SQLite (a file in tmp_path) and on MySQL/MariaDB at
``FP_TEST_MYSQL_URL``. Both backends are migrated once per test session (MySQL is downgraded to base
first so a stale schema never leaks in); each test then starts from empty tables. Without a reachable
MySQL the MySQL cases are skipped, except under ``CI=true`` where that is a failure.
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import warnings
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path

import pytest
from sqlalchemy import MetaData, delete
from sqlalchemy.engine import make_url
from sqlalchemy.pool import NullPool

from feishu_progress.db.engine import Database
from feishu_progress.db.migrate import downgrade, upgrade
from feishu_progress.db.models import Base
from tests.tcp_proxy import TcpProxy

# One sandbox, one app client, one ``eventually``: the shared rigs (tests/rigs.py).
pytest_plugins = ["tests.rigs"]

DEFAULT_MYSQL_URL = "mysql+aiomysql://root@127.0.0.1:3306/test"
MYSQL_CONNECT_TIMEOUT_SECONDS = 3


def mysql_test_url() -> str:
    """The MySQL URL the data-layer tests use: under pytest-xdist, a database of this worker's own.

    ``pytest -n 2`` runs two workers at once; each gets ``<test database>_<worker>`` (``test_gw0``), so
    neither drops or empties the tables the other is using. Databases derived from it
    (``fresh_mysql_database``) carry the worker's name too.
    """
    base = os.environ.get("FP_TEST_MYSQL_URL", DEFAULT_MYSQL_URL)
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if not worker:
        return base
    url = make_url(base)
    return url.set(database=f"{url.database or 'test'}_{worker}").render_as_string(hide_password=False)


async def _create_database(url: str, *, fresh: bool) -> None:
    """Create the database ``url`` names on its server (dropped first when ``fresh``)."""
    import aiomysql

    parsed = make_url(url)
    conn = await aiomysql.connect(
        host=parsed.host,
        port=parsed.port or 3306,
        user=parsed.username or "root",
        password=parsed.password or "",
    )
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # MariaDB's "database does not exist" note on a first run
            async with conn.cursor() as cursor:
                if fresh:
                    await cursor.execute(f"DROP DATABASE IF EXISTS `{parsed.database}`")
                await cursor.execute(
                    f"CREATE DATABASE IF NOT EXISTS `{parsed.database}` CHARACTER SET utf8mb4"
                )
    finally:
        await conn.ensure_closed()


def sqlite_url(path: Path) -> str:
    """An aiosqlite URL for a database file."""
    return f"sqlite+aiosqlite:///{path}"


async def _mysql_problem(url: str) -> str | None:
    """None when MySQL answers, else why not."""
    probe = Database.open(
        url, poolclass=NullPool, connect_args={"connect_timeout": MYSQL_CONNECT_TIMEOUT_SECONDS}
    )
    try:
        await probe.ping()
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"
    finally:
        await probe.close()
    return None


def _require_mysql_server() -> None:
    """Skip (fail under CI=true) when FP_TEST_MYSQL_URL's server and database do not answer."""
    base = os.environ.get("FP_TEST_MYSQL_URL", DEFAULT_MYSQL_URL)
    problem = asyncio.run(_mysql_problem(base))
    if problem is not None:
        message = f"MySQL at FP_TEST_MYSQL_URL={base} is unreachable ({problem})"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(message + "; CI=true requires it", pytrace=False)
        pytest.skip(message)


def fresh_mysql_database(suffix: str) -> str:
    """URL of an empty database ``<test database>_<suffix>`` on the test server, dropped and recreated.

    Derived from FP_TEST_MYSQL_URL, so two test runs pointed at different databases never share one.
    Skips without a server (fails under CI=true).
    """
    _require_mysql_server()
    url = make_url(mysql_test_url())
    name = f"{url.database or 'test'}_{suffix}"
    fresh = url.set(database=name).render_as_string(hide_password=False)
    asyncio.run(_create_database(fresh, fresh=True))
    return fresh


async def _drop_everything(url: str) -> None:
    """Drop every table of the test database (a schema alembic cannot downgrade)."""
    database = Database.open(url, poolclass=NullPool)
    try:
        async with database.engine.begin() as connection:
            reflected = MetaData()
            await connection.run_sync(reflected.reflect)
            await connection.run_sync(reflected.drop_all)
    finally:
        await database.close()


async def _fresh_mysql_schema(url: str) -> None:
    try:
        await downgrade(url, "base")
    except Exception:
        await _drop_everything(url)
    await upgrade(url)


@pytest.fixture(scope="session")
def mysql_url() -> str:
    """A migrated MySQL database URL; skips (fails under CI=true) when no server answers."""
    _require_mysql_server()
    url = mysql_test_url()
    asyncio.run(_create_database(url, fresh=False))  # a worker's own database may not exist yet
    asyncio.run(_fresh_mysql_schema(url))
    return url


@pytest.fixture(scope="session")
def sqlite_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A SQLite file migrated once; tests get copies of it."""
    path = tmp_path_factory.mktemp("sqlite-template") / "template.db"
    asyncio.run(upgrade(sqlite_url(path)))
    return path


async def _empty_tables(database: Database) -> None:
    async with database.session() as session:
        # Children before parents: task_card references session.
        for table in reversed(Base.metadata.sorted_tables):
            await session.execute(delete(table))


@pytest.fixture(params=["sqlite", pytest.param("mysql", marks=pytest.mark.mysql)])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A migrated database URL, once per backend."""
    if request.param == "mysql":
        url: str = request.getfixturevalue("mysql_url")
        return url
    template: Path = request.getfixturevalue("sqlite_template")
    copy = tmp_path / "fp.db"
    shutil.copyfile(template, copy)
    return sqlite_url(copy)


@pytest.fixture
async def db(db_url: str) -> AsyncIterator[Database]:
    """A migrated, empty ``Database`` (parametrised over SQLite and MySQL)."""
    database = Database.open(db_url)
    if database.dialect_name != "sqlite":
        await _empty_tables(database)
    try:
        yield database
    finally:
        await database.close()


@pytest.fixture(autouse=True)
def _root_logger_restored() -> Iterator[None]:
    """A test that runs the CLI in-process (``cli.main``) reconfigures the root logger; later tests'
    ``caplog`` must not inherit its level or handlers."""
    root = logging.getLogger()
    level, handlers = root.level, root.handlers[:]
    yield
    root.setLevel(level)
    root.handlers[:] = handlers


ProxyFactory = Callable[[str, int], Awaitable[TcpProxy]]


@pytest.fixture
async def tcp_proxy() -> AsyncIterator[ProxyFactory]:
    """Makes started ``TcpProxy`` instances in front of ``host, port``; all are closed at teardown."""
    made: list[TcpProxy] = []

    async def make(host: str, port: int) -> TcpProxy:
        proxy = TcpProxy(host, port)
        made.append(proxy)
        await proxy.start()
        return proxy

    try:
        yield make
    finally:
        for proxy in made:
            await proxy.close()
