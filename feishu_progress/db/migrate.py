"""Python API over the packaged alembic migrations (``feishu-progress migrate``, ``/readyz``, tests).

Alembic's ``env.py`` calls ``asyncio.run``, which cannot nest in a running loop, so every alembic
command runs in a worker thread that owns its own loop.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy.engine import URL, Connection
from sqlalchemy.pool import NullPool

from feishu_progress.db.engine import create_engine

MIGRATIONS_DIR = Path(__file__).resolve().parent.parent / "migrations"


def alembic_config(url: str | URL) -> Config:
    """An in-memory alembic Config pointing at the packaged migrations and ``url``."""
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    # Passed as an attribute, not the ini option: configparser would choke on '%' in a password.
    config.attributes["url"] = url.render_as_string(hide_password=False) if isinstance(url, URL) else url
    return config


async def upgrade(url: str | URL, revision: str = "head") -> None:
    """Apply the migrations up to ``revision``."""
    await asyncio.to_thread(command.upgrade, alembic_config(url), revision)


async def downgrade(url: str | URL, revision: str = "base") -> None:
    """Revert the migrations down to ``revision``."""
    await asyncio.to_thread(command.downgrade, alembic_config(url), revision)


def head_revision() -> str:
    """The newest revision the package ships."""
    head = ScriptDirectory.from_config(alembic_config("sqlite://")).get_current_head()
    if head is None:  # pragma: no cover - the package always ships a revision
        raise RuntimeError(f"no alembic revision under {MIGRATIONS_DIR}")
    return head


def _current_revision(connection: Connection) -> str | None:
    return MigrationContext.configure(connection).get_current_revision()


async def migration_state(url: str | URL) -> tuple[str | None, str]:
    """``(current, head)``: the database's revision (None when unmigrated) and the package's newest."""
    engine = create_engine(url, poolclass=NullPool)
    try:
        async with engine.connect() as connection:
            current = await connection.run_sync(_current_revision)
    finally:
        await engine.dispose()
    return current, head_revision()
