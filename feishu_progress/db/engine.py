"""The Database: one AsyncEngine and its session factory, opened once at the entry point."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from sqlalchemy import event, text
from sqlalchemy.engine import URL, make_url
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker, create_async_engine
from sqlalchemy.pool import ConnectionPoolEntry

# Below MySQL's default wait_timeout (8 h) and typical proxy idle cuts, so the pool never hands
# out a connection the server already closed.
MYSQL_POOL_RECYCLE_SECONDS = 1800
# Concurrent writers on SQLite wait for the lock instead of failing with "database is locked".
SQLITE_BUSY_TIMEOUT_MS = 5000


def normalize_url(url: str | URL) -> URL:
    """Parse ``url`` and add ``charset=utf8mb4`` to MySQL URLs that name no charset."""
    parsed = make_url(url)
    if parsed.get_backend_name() in {"mysql", "mariadb"} and "charset" not in parsed.query:
        parsed = parsed.update_query_dict({"charset": "utf8mb4"})
    return parsed


def engine_options(url: URL) -> dict[str, Any]:
    """Pool options that suit the backend of ``url``."""
    if url.get_backend_name() in {"mysql", "mariadb"}:
        return {"pool_pre_ping": True, "pool_recycle": MYSQL_POOL_RECYCLE_SECONDS}
    return {}


def _sqlite_pragmas(dbapi_connection: Any, connection_record: ConnectionPoolEntry) -> None:
    cursor = dbapi_connection.cursor()
    try:
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")
        # WAL lets readers (the running-subagents query) proceed while a writer commits.
        cursor.execute("PRAGMA journal_mode=WAL")
        # In WAL mode NORMAL never corrupts the file; it may only lose the last commits on a power cut
        # (not on a process crash), and saves an fsync per commit on the event path.
        cursor.execute("PRAGMA synchronous=NORMAL")
    finally:
        cursor.close()


def create_engine(url: str | URL, **overrides: Any) -> AsyncEngine:
    """An AsyncEngine for ``url`` with the backend's pragmas and pool settings."""
    parsed = normalize_url(url)
    engine = create_async_engine(parsed, **{**engine_options(parsed), **overrides})
    if parsed.get_backend_name() == "sqlite":
        event.listen(engine.sync_engine, "connect", _sqlite_pragmas)
    return engine


class Database:
    """Holds the engine and ``async_sessionmaker``; repositories take one of these."""

    def __init__(self, engine: AsyncEngine) -> None:
        self.engine = engine
        self.sessionmaker: async_sessionmaker[AsyncSession] = async_sessionmaker(
            engine, expire_on_commit=False
        )

    @classmethod
    def open(cls, url: str | URL, **engine_overrides: Any) -> Database:
        """Create the engine for ``url``; nothing connects until first use."""
        return cls(create_engine(url, **engine_overrides))

    @property
    def url(self) -> URL:
        """The normalized URL (password included: never log it, use ``render_as_string``)."""
        return self.engine.url

    @property
    def dialect_name(self) -> str:
        """``sqlite`` or ``mysql``/``mariadb``."""
        return self.engine.dialect.name

    @asynccontextmanager
    async def session(self) -> AsyncIterator[AsyncSession]:
        """A session inside one transaction: committed on success, rolled back on error."""
        async with self.sessionmaker() as session, session.begin():
            yield session

    async def ping(self) -> None:
        """Round-trip ``SELECT 1``; raises when the database does not answer."""
        async with self.engine.connect() as connection:
            await connection.execute(text("SELECT 1"))

    async def close(self) -> None:
        """Dispose of the pool and its connections."""
        await self.engine.dispose()
