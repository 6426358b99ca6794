"""The checks of this host's own parts: configuration, database, Redis and the cluster's leases.

Nothing here writes: the database is read (revision, column types, lease rows), Redis is pinged and
asked to load the Lua scripts (SCRIPT LOAD only caches them; it runs nothing and takes no lease).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.engine import Connection, make_url
from sqlalchemy.pool import NullPool

from feishu_progress.apps_file import referenced_variables
from feishu_progress.config import Settings, unknown_variables
from feishu_progress.db.engine import Database
from feishu_progress.db.migrate import migration_state
from feishu_progress.db.models import Base, InstanceLease
from feishu_progress.db.times import utc_datetime
from feishu_progress.doctor.checks import Check, fail, ok, warn

DATABASE_SECONDS = 5.0
REDIS_SECONDS = 3.0
MIGRATE_FIX = "run feishu-progress migrate (with the same FP_DATABASE_URL)"


def config_checks(settings: Settings, environ: Mapping[str, str]) -> list[Check]:
    """Unsafe combinations (the same ones serve refuses), unknown FP_* names, the mode in use."""
    checks = [
        fail("config.serving", problem, "change the setting named") for problem in settings.serving_problems()
    ]
    if not checks:
        checks.append(ok("config.serving", "every setting parsed; no unsafe combination"))
    unknown = unknown_variables(environ, referenced_variables(settings))
    if unknown:
        checks.append(
            warn(
                "config.unknown",
                f"ignored, no setting has these names: {', '.join(unknown)}",
                "fix the spelling (groups take two underscores: FP_API__TOKEN); .env.example lists them all",
            )
        )
    return checks


async def database_checks(settings: Settings) -> list[Check]:
    """Reachable, migrations at head, and on MySQL the column types the models expect."""
    missing = _missing_sqlite_file(settings.database_url)
    if missing is not None:  # connecting would create an empty file: doctor writes nothing
        return [fail("database.reachable", f"SQLite file {missing} does not exist", MIGRATE_FIX)]
    db = Database.open(settings.database_url, poolclass=NullPool)
    try:
        try:
            await asyncio.wait_for(db.ping(), DATABASE_SECONDS)
        except Exception as exc:  # any driver error: the operator needs its text, not its class tree
            return [
                fail(
                    "database.reachable",
                    f"{db.url.render_as_string(hide_password=True)}: {_first_line(exc)}",
                    "check FP_DATABASE_URL (host, port, user, password, database) and that the server runs",
                )
            ]
        checks = [
            ok("database.reachable", f"{db.dialect_name} at {db.url.render_as_string(hide_password=True)}")
        ]
        current, head = await asyncio.wait_for(migration_state(settings.database_url), DATABASE_SECONDS)
        if current != head:
            checks.append(
                fail("database.migrations", f"schema at {current or 'nothing'}, head is {head}", MIGRATE_FIX)
            )
            return checks
        checks.append(ok("database.migrations", f"at head ({head})"))
        if db.dialect_name in {"mysql", "mariadb"}:
            checks.append(await _column_types(db))
        return checks
    finally:
        await db.close()


async def _column_types(db: Database) -> Check:
    async with db.engine.connect() as connection:
        differences = await connection.run_sync(_type_differences)
    if differences:
        return fail(
            "database.columns",
            "column types differ from the models: " + "; ".join(differences),
            "the tables were changed by hand or by another tool: restore them from the migrations "
            "(feishu-progress migrate --down, then feishu-progress migrate, on a copy first)",
        )
    return ok("database.columns", "every column has the type the models expect")


def _type_differences(connection: Connection) -> list[str]:
    from alembic.autogenerate import compare_metadata
    from alembic.runtime.migration import MigrationContext

    context = MigrationContext.configure(connection, opts={"compare_type": True})
    found: list[str] = []
    for diff in compare_metadata(context, Base.metadata):
        for change in diff if isinstance(diff, list) else [diff]:
            if isinstance(change, tuple) and change and change[0] == "modify_type":
                table, column, _, was, wanted = change[2], change[3], change[4], change[5], change[6]
                found.append(f"{table}.{column} is {was}, expected {wanted}")
    return found


async def redis_checks(settings: Settings) -> list[Check]:
    """Cluster mode: Redis answers and loads the budget scripts; who holds a lease (read, never taken)."""
    if settings.redis_url is None:
        return []
    import redis.asyncio as aioredis

    from feishu_progress.cluster import scripts

    client: Any = aioredis.from_url(settings.redis_url, socket_connect_timeout=REDIS_SECONDS)
    try:
        await asyncio.wait_for(client.ping(), REDIS_SECONDS)
        for script in (scripts.TAKE, scripts.PAUSE, scripts.REFUND):
            await asyncio.wait_for(client.script_load(script), REDIS_SECONDS)
    except Exception as exc:  # connection refused, auth, NOSCRIPT...: the text says which
        return [
            fail(
                "redis",
                f"FP_REDIS_URL does not answer or refuses the scripts: {_first_line(exc)}",
                "check FP_REDIS_URL (redis://[:password@]host:port/db) and that Redis runs; without it "
                "instances fall back to the database and split the rate budget by instance count",
            )
        ]
    finally:
        await client.aclose()
    return [ok("redis", "reachable; the 3 budget scripts load")]


async def lease_checks(settings: Settings) -> list[Check]:
    """Cluster mode: live leases in the database (read only), and whether this instance id is taken."""
    if settings.redis_url is None:
        return []
    db = Database.open(settings.database_url, poolclass=NullPool)
    try:
        async with db.session() as session:
            now = utc_datetime(time.time())
            rows = (
                (
                    await session.execute(
                        select(InstanceLease.instance_id).where(InstanceLease.expires_at > now)
                    )
                )
                .scalars()
                .all()
            )
            total = await session.scalar(select(func.count()).select_from(InstanceLease))
    except Exception as exc:
        return [warn("cluster.leases", f"lease table not readable: {_first_line(exc)}", MIGRATE_FIX)]
    finally:
        await db.close()
    live = sorted(rows)
    if settings.instance_id in live:
        return [
            warn(
                "cluster.leases",
                f"FP_INSTANCE_ID={settings.instance_id} already holds a live lease (a serve with it runs)",
                "give every instance its own FP_INSTANCE_ID (the default, hostname-pid, is unique)",
            )
        ]
    return [
        ok(
            "cluster.leases",
            f"{len(live)} live instance(s) of {total or 0} known: {', '.join(live) or 'none'}",
        )
    ]


def _missing_sqlite_file(url: str) -> str | None:
    parsed = make_url(url)
    if parsed.get_backend_name() != "sqlite" or parsed.database in (None, "", ":memory:"):
        return None
    return None if Path(parsed.database).exists() else parsed.database


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"[:300]
