"""Attach mode: the running-subagent query reads the agent's OWN database, and never writes there.

``FP_SUBAGENTS__DATABASE_URL`` names the database where the agent runtime keeps the seed's
``subagent_execution`` and ``session`` tables (seed 002 §1.1). Three things keep the service read-only
there, whatever the account it is given (which should still have SELECT only):

- the tables are declared here with just the seed's columns: nothing is reflected or created, so no
  privilege beyond SELECT is ever needed;
- MySQL/MariaDB connections run ``SET SESSION TRANSACTION READ ONLY`` as they open: a write fails;
- SQLite files are opened through a ``mode=ro`` URI, with ``PRAGMA query_only`` on top.

The engine is its own small pool: the batcher asks at most twice a second, and /readyz pings it.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

from sqlalchemy import BigInteger, Column, DateTime, Integer, MetaData, String, Table, Text, event
from sqlalchemy.engine import URL
from sqlalchemy.ext.asyncio import create_async_engine
from sqlalchemy.pool import ConnectionPoolEntry

from feishu_progress.db.engine import Database, engine_options, normalize_url
from feishu_progress.errors import ConfigError
from feishu_progress.subagents.query import SubagentTables

# One query in flight from the batcher, one readiness ping: two connections are plenty.
AGENT_POOL_SIZE = 2
# A saturated or unreachable agent database must fail a load quickly (the card keeps its last list).
AGENT_POOL_TIMEOUT_SECONDS = 5.0
_TRUE = frozenset({"1", "true", "yes", "on"})


def agent_tables(
    execution_table: str = "subagent_execution", session_table: str = "session"
) -> SubagentTables:
    """The seed's two tables with only the columns the query names (the agent owns the rest)."""
    metadata = MetaData()
    execution = Table(
        execution_table,
        metadata,
        Column("id", BigInteger, primary_key=True),
        Column("parent_session_id", BigInteger),
        Column("child_session_id", BigInteger),
        Column("agent_type", String(64)),
        Column("task_description", Text),
        Column("status", String(16)),
        Column("total_rounds", Integer),
        Column("invocation_type", String(16)),
        Column("started_at", DateTime),
    )
    session = Table(
        session_table, metadata, Column("id", BigInteger, primary_key=True), Column("title", String(255))
    )
    return SubagentTables(execution=execution, session=session)


def read_only_url(url: str | URL) -> URL:
    """``url`` as the attach engine opens it: a SQLite file becomes a ``mode=ro`` URI."""
    parsed = normalize_url(url)
    if parsed.get_backend_name() != "sqlite":
        return parsed
    database = parsed.database
    if not database or database == ":memory:":
        raise ConfigError(
            "FP_SUBAGENTS__DATABASE_URL must name the agent's SQLite file, not a memory database"
        )
    if str(parsed.query.get("uri", "")).lower() in _TRUE:  # already a URI: only force read-only
        return parsed.update_query_dict({"mode": "ro"})
    # quote(): "?" or "#" in a file name would otherwise start the URI's query or fragment.
    return parsed.set(database="file:" + quote(database)).update_query_dict({"mode": "ro", "uri": "true"})


def _run_on_connect(statement: str) -> Any:
    def listener(dbapi_connection: Any, connection_record: ConnectionPoolEntry) -> None:
        cursor = dbapi_connection.cursor()
        try:
            cursor.execute(statement)
        finally:
            cursor.close()

    return listener


def open_agent_database(url: str | URL) -> Database:
    """A read-only Database on the agent's database; nothing connects until first use."""
    parsed = read_only_url(url)
    options = {
        **engine_options(parsed),
        "pool_size": AGENT_POOL_SIZE,
        "max_overflow": 0,
        "pool_timeout": AGENT_POOL_TIMEOUT_SECONDS,
    }
    engine = create_async_engine(parsed, **options)
    guard = (
        "PRAGMA query_only=ON"
        if parsed.get_backend_name() == "sqlite"
        else "SET SESSION TRANSACTION READ ONLY"
    )
    event.listen(engine.sync_engine, "connect", _run_on_connect(guard))
    return Database(engine)
