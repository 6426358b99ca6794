"""Alembic environment: async engine, NullPool, migrations run through ``connection.run_sync``.

The URL comes from ``config.attributes["url"]`` (the Python API in ``feishu_progress.db.migrate``),
else the ``sqlalchemy.url`` option, else ``FP_DATABASE_URL`` through Settings (the ``alembic`` CLI).
"""

from __future__ import annotations

import asyncio
from logging.config import fileConfig

from alembic import context
from sqlalchemy.engine import Connection
from sqlalchemy.pool import NullPool

from feishu_progress.db.engine import create_engine, normalize_url
from feishu_progress.db.models import Base

config = context.config
target_metadata = Base.metadata

# Only the alembic CLI has an ini file; the Python API must not reconfigure the app's logging.
if config.config_file_name is not None and config.attributes.get("configure_logging", True):
    fileConfig(config.config_file_name, disable_existing_loggers=False)


def database_url() -> str:
    """The URL to migrate, from the caller, the ini option or the service settings."""
    url = config.attributes.get("url") or config.get_main_option("sqlalchemy.url")
    if not url:
        from feishu_progress.config import Settings

        url = Settings().database_url
    return str(url)


def run_migrations_offline() -> None:
    """Emit SQL for the URL's dialect without connecting (``alembic upgrade --sql``)."""
    context.configure(
        url=normalize_url(database_url()),
        target_metadata=target_metadata,
        literal_binds=True,
        dialect_opts={"paramstyle": "named"},
    )
    with context.begin_transaction():
        context.run_migrations()


def do_run_migrations(connection: Connection) -> None:
    """Run the migrations on a sync connection (called through ``run_sync``)."""
    context.configure(connection=connection, target_metadata=target_metadata)
    with context.begin_transaction():
        context.run_migrations()


async def run_async_migrations() -> None:
    """Open a NullPool async engine and run the migrations on one connection."""
    engine = create_engine(database_url(), poolclass=NullPool)
    try:
        async with engine.connect() as connection:
            await connection.run_sync(do_run_migrations)
            await connection.commit()
    finally:
        await engine.dispose()


if context.is_offline_mode():
    run_migrations_offline()
else:
    asyncio.run(run_async_migrations())
