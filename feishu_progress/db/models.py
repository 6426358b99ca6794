"""SQLAlchemy 2.0 models: one schema for MariaDB/MySQL (aiomysql) and SQLite (aiosqlite).

Every datetime column is a ``UtcDateTime``: aware UTC datetimes in Python, naive UTC in the database
(``DATETIME(6)`` on MySQL), converted there and nowhere else.
The alembic revisions in ``feishu_progress/migrations`` create this schema; these classes are how the
code reads and writes it (a test checks that the two agree).
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from sqlalchemy import (
    BigInteger,
    Boolean,
    DateTime,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    Text,
    UniqueConstraint,
    false,
    text,
)
from sqlalchemy.dialects import mysql
from sqlalchemy.engine import Dialect
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column
from sqlalchemy.sql.compiler import SQLCompiler
from sqlalchemy.sql.functions import FunctionElement
from sqlalchemy.types import TypeDecorator, TypeEngine

# Binary collation: dedupe keys and task refs that differ only in case must stay distinct.
MYSQL_TABLE_OPTIONS = {"mysql_engine": "InnoDB", "mysql_charset": "utf8mb4", "mysql_collate": "utf8mb4_bin"}

NAMING_CONVENTION = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

# SQLite only autoincrements an INTEGER PRIMARY KEY, so the BIGINT ids become INTEGER there.
BigId: TypeEngine[int] = BigInteger().with_variant(Integer, "sqlite")
# TEXT holds 64 KiB on MySQL: a streamed answer, an answers payload or a task description can be more.
LongText: TypeEngine[str] = Text().with_variant(mysql.LONGTEXT(), "mysql", "mariadb")


class UtcDateTime(TypeDecorator[datetime]):
    """An aware UTC datetime in Python, a naive UTC one in the database: the ONE place time zones are handled.

    Code passes aware datetimes (any zone; a naive one is a bug and is refused) and reads aware UTC ones.
    MySQL gets DATETIME(6): plain DATETIME would round away the fraction.
    """

    impl = DateTime
    cache_ok = True

    def load_dialect_impl(self, dialect: Dialect) -> TypeEngine[Any]:
        if dialect.name in ("mysql", "mariadb"):
            return dialect.type_descriptor(mysql.DATETIME(fsp=6))
        return dialect.type_descriptor(DateTime())

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise TypeError("a naive datetime reached the database: pass an aware one (UTC)")
        return value.astimezone(UTC).replace(tzinfo=None)

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        return None if value is None else value.replace(tzinfo=UTC)


class utc_now(FunctionElement[datetime]):
    """The database's current UTC time, as a naive datetime (server defaults and ``onupdate``)."""

    type = DateTime()
    inherit_cache = True


@compiles(utc_now)
def _utc_now_default(element: utc_now, compiler: SQLCompiler, **kw: object) -> str:
    return "CURRENT_TIMESTAMP"


@compiles(utc_now, "sqlite")
def _utc_now_sqlite(element: utc_now, compiler: SQLCompiler, **kw: object) -> str:
    # CURRENT_TIMESTAMP is UTC on SQLite but drops the fraction; keep milliseconds.
    return "(STRFTIME('%Y-%m-%d %H:%M:%f', 'now'))"


@compiles(utc_now, "mysql")
@compiles(utc_now, "mariadb")
def _utc_now_mysql(element: utc_now, compiler: SQLCompiler, **kw: object) -> str:
    # CURRENT_TIMESTAMP follows the session time zone; UTC_TIMESTAMP does not.
    return "(UTC_TIMESTAMP(6))"


class Base(DeclarativeBase):
    """Declarative base carrying the constraint naming convention."""

    metadata = MetaData(naming_convention=NAMING_CONVENTION)


class TimestampMixin:
    """created_at / updated_at kept by the database clock (UTC)."""

    created_at: Mapped[datetime] = mapped_column(UtcDateTime(), server_default=utc_now())
    updated_at: Mapped[datetime] = mapped_column(UtcDateTime(), server_default=utc_now(), onupdate=utc_now())


class SessionRow(TimestampMixin, Base):
    """A conversation: a task's own session, or a subagent's child session."""

    __tablename__ = "session"
    __table_args__ = MYSQL_TABLE_OPTIONS

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    title: Mapped[str | None] = mapped_column(String(255))
    parent_session_id: Mapped[int | None] = mapped_column(BigInteger, index=True)
    # The runtime's own id for a child session (what it calls child_session_id).
    external_id: Mapped[str | None] = mapped_column(String(64))


class SubagentExecution(Base):
    """One subagent run under a parent session (seed 002 §1.1)."""

    __tablename__ = "subagent_execution"
    __table_args__ = (
        Index("idx_sae_parent", "parent_session_id"),
        UniqueConstraint("parent_session_id", "task_ref", name="uq_sae_parent_task_ref"),
        MYSQL_TABLE_OPTIONS,
    )

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    parent_session_id: Mapped[int] = mapped_column(BigInteger)
    task_ref: Mapped[str] = mapped_column(String(64))
    child_session_id: Mapped[int | None] = mapped_column(BigInteger)
    agent_type: Mapped[str | None] = mapped_column(String(64))
    task_description: Mapped[str | None] = mapped_column(LongText)
    status: Mapped[str] = mapped_column(String(16), server_default=text("'RUNNING'"))
    invocation_type: Mapped[str] = mapped_column(String(16), server_default=text("'BACKGROUND'"))
    total_rounds: Mapped[int] = mapped_column(Integer, server_default=text("0"))
    started_at: Mapped[datetime] = mapped_column(UtcDateTime(), server_default=utc_now())
    finished_at: Mapped[datetime | None] = mapped_column(UtcDateTime())


class TaskCard(TimestampMixin, Base):
    """The one live card of a task, and enough of its state to re-attach after a restart."""

    __tablename__ = "task_card"
    __table_args__ = (
        Index("uq_task_card_idempotency_key", "idempotency_key", unique=True),
        MYSQL_TABLE_OPTIONS,
    )

    session_id: Mapped[int] = mapped_column(BigId, ForeignKey("session.id"), primary_key=True)
    receive_id: Mapped[str] = mapped_column(String(255))
    receive_id_type: Mapped[str] = mapped_column(String(16))
    reply_to_message_id: Mapped[str | None] = mapped_column(String(64))
    message_id: Mapped[str | None] = mapped_column(String(64), index=True)
    requester_open_id: Mapped[str] = mapped_column(String(64))
    locale: Mapped[str | None] = mapped_column(String(16))
    status: Mapped[str] = mapped_column(String(16), server_default=text("'RUNNING'"))
    round: Mapped[int] = mapped_column(Integer, server_default=text("0"))
    # JSON of the last card state (runtime/state.py, at most ~1 MiB); NULL until the first save.
    snapshot: Mapped[str | None] = mapped_column(LongText)
    disliked: Mapped[bool] = mapped_column(Boolean, server_default=false())
    stop_reason: Mapped[str | None] = mapped_column(String(255))
    started_at: Mapped[datetime] = mapped_column(UtcDateTime(), server_default=utc_now())
    last_event_at: Mapped[datetime] = mapped_column(UtcDateTime(), server_default=utc_now())
    finished_at: Mapped[datetime | None] = mapped_column(UtcDateTime())
    # The runtime's Idempotency-Key of POST /v1/tasks: a repeat answers the same task.
    idempotency_key: Mapped[str | None] = mapped_column(String(191))
    # A digest of the create request that came with the key: the key reused for another is refused.
    request_digest: Mapped[str | None] = mapped_column(String(64))
    # "cardkit" (a card entity, streamed text) or "patch" (a message PATCHed whole); None: patch.
    transport: Mapped[str | None] = mapped_column(String(16))
    card_id: Mapped[str | None] = mapped_column(String(64))  # the CardKit entity, when transport is cardkit
    # Cluster mode: the instance that writes this card, and the epoch bumped on every takeover or restart
    # (a CardKit sequence is fence << 20 | n, so Feishu refuses a writer from an older epoch).
    owner_instance: Mapped[str | None] = mapped_column(String(64), index=True)
    fence: Mapped[int] = mapped_column(BigInteger, server_default=text("0"))
    # The Feishu/Lark app (FP_APPS_FILE) that sent the card and writes it; rows from before: "default".
    app: Mapped[str] = mapped_column(String(64), server_default=text("'default'"))
    # Cluster mode: how many batches were ever put in the event log for this task (task_event_log.seq of
    # the newest). Bumped in the appending transaction, so one task's sequence has no gaps or reuse.
    events_logged: Mapped[int] = mapped_column(BigInteger, server_default=text("0"))


class TaskAction(Base):
    """The action log runtimes long-poll: the id is the cursor."""

    __tablename__ = "task_action"
    __table_args__ = MYSQL_TABLE_OPTIONS

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    session_id: Mapped[int] = mapped_column(BigInteger, index=True)
    kind: Mapped[str] = mapped_column(String(16))
    operator_open_id: Mapped[str] = mapped_column(String(64))
    payload: Mapped[str] = mapped_column(LongText)
    # 191 characters: the longest utf8mb4 key that fits InnoDB's 767-byte index prefix on old servers.
    dedupe_key: Mapped[str | None] = mapped_column(String(191), unique=True)
    created_at: Mapped[datetime] = mapped_column(UtcDateTime(), server_default=utc_now())


class TaskEventLog(Base):
    """Event batches a live instance accepted for a card whose writer did not answer (cluster mode).

    The writer (or whoever takes the card over) applies them in ``seq`` order before any batch it
    receives itself, then deletes them; its saved state remembers the last ``seq`` it applied.
    """

    __tablename__ = "task_event_log"
    __table_args__ = MYSQL_TABLE_OPTIONS

    session_id: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    seq: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    idempotency_key: Mapped[str | None] = mapped_column(String(255))
    body: Mapped[str] = mapped_column(LongText)  # the validated batch, as JSON
    created_at: Mapped[datetime] = mapped_column(UtcDateTime(), server_default=utc_now())


class CallbackSeen(Base):
    """Callback dedupe keys that survive a restart."""

    __tablename__ = "callback_seen"
    __table_args__ = MYSQL_TABLE_OPTIONS

    key: Mapped[str] = mapped_column(String(191), primary_key=True)
    expires_at: Mapped[datetime] = mapped_column(UtcDateTime(), index=True)


class InstanceLease(Base):
    """A live instance (cluster mode): its heartbeat, on the database's clock, and its address for peers."""

    __tablename__ = "instance_lease"
    __table_args__ = MYSQL_TABLE_OPTIONS

    instance_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    address: Mapped[str | None] = mapped_column(String(255))
    started_at: Mapped[datetime] = mapped_column(UtcDateTime())
    heartbeat_at: Mapped[datetime] = mapped_column(UtcDateTime())
    expires_at: Mapped[datetime] = mapped_column(UtcDateTime(), index=True)
    draining: Mapped[bool] = mapped_column(Boolean, server_default=false())


class InstanceHolder(Base):
    """Single mode: the one process that owns this database (at most one row, ``id`` 1).

    ``token`` is the holder's own random claim (exact identity); instance id, host and pid are what a
    refused second process names. The heartbeat is on the database's clock, so no two hosts' clocks
    are compared. Cluster mode does not use it (``instance_lease`` is its heartbeat).
    """

    __tablename__ = "instance_holder"
    __table_args__ = MYSQL_TABLE_OPTIONS

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    token: Mapped[str] = mapped_column(String(64))
    instance_id: Mapped[str] = mapped_column(String(64))
    host: Mapped[str] = mapped_column(String(255))
    pid: Mapped[int] = mapped_column(Integer)
    started_at: Mapped[datetime] = mapped_column(UtcDateTime())
    heartbeat_at: Mapped[datetime] = mapped_column(UtcDateTime())
