"""Benchmark: the running-subagents query on MariaDB, batched IN (...) versus one query per parent.

    python bench/db.py --parents 1000 --subagents 5000 --seconds 5 --runs 3

Creates (if missing) and migrates a SEPARATE database ``fp_bench`` on the server of
FP_TEST_MYSQL_URL (default mysql+aiomysql://root@127.0.0.1:3306/test), so the tests' data is never
touched, and seeds it with ``--parents`` live parent sessions and ``--subagents`` running
BACKGROUND/FOLLOWUP executions (plus as many finished and DELEGATE rows the query must skip).

Measured for ``--seconds`` each, with ``--concurrency`` callers sharing one pool:
- per parent: ``SubagentManager.list_running(parent)`` for random parents — queries/s, p50/p99;
- batched: ``SubagentManager.list_running_many(all parents)`` — calls/s, p50/p99, and SQL statements
  per call (query.py splits the IN list every 500 parents).
The last column says what refreshing every live card's subagents once per second costs each way.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from sqlalchemy import func, insert, select
from sqlalchemy.engine import make_url

from bench.common import percentile, write_section
from feishu_progress.db.engine import Database
from feishu_progress.db.migrate import upgrade
from feishu_progress.db.models import SessionRow, SubagentExecution
from feishu_progress.subagents.manager import SubagentManager
from feishu_progress.subagents.query import MAX_PARENTS_PER_QUERY

DEFAULT_MYSQL_URL = "mysql+aiomysql://root@127.0.0.1:3306/test"
BENCH_DATABASE = "fp_bench"


def bench_url(base: str, database: str = BENCH_DATABASE) -> str:
    """The benchmark database's URL on the server of ``base``."""
    return make_url(base).set(database=database).render_as_string(hide_password=False)


async def ensure_database(base: str, database: str = BENCH_DATABASE, *, fresh: bool = False) -> str:
    """CREATE DATABASE IF NOT EXISTS (``fresh``: dropped first) through aiomysql, migrate it; its URL."""
    import aiomysql

    url = make_url(base)
    connection = await aiomysql.connect(
        host=url.host or "127.0.0.1",
        port=url.port or 3306,
        user=url.username or "root",
        password=url.password or "",
        connect_timeout=5,
    )
    try:
        async with connection.cursor() as cursor:
            # Not IF NOT EXISTS: on an existing database it raises a server Warning (an error in tests).
            await cursor.execute("SHOW DATABASES LIKE %s", (database,))
            exists = bool(await cursor.fetchone())
            if exists and fresh:
                await cursor.execute(f"DROP DATABASE `{database}`")
            if fresh or not exists:
                await cursor.execute(
                    f"CREATE DATABASE `{database}` CHARACTER SET utf8mb4 COLLATE utf8mb4_bin"
                )
    finally:
        connection.close()
    target = bench_url(base, database)
    await upgrade(target)
    return target


async def seed(db: Database, parents: int, running: int) -> list[int]:
    """Fresh rows: ``parents`` parents, ``running`` shown executions, as many hidden ones; parent ids."""
    now = datetime.now(UTC)
    async with db.session() as session:
        await session.execute(SubagentExecution.__table__.delete())
        await session.execute(SessionRow.__table__.delete())
    async with db.session() as session:
        await session.execute(insert(SessionRow), [{"title": f"任务 {i}"} for i in range(parents)])
    async with db.session() as session:
        parent_ids = list((await session.execute(select(SessionRow.id).order_by(SessionRow.id))).scalars())
    rng = random.Random(7)
    children = [{"title": f"子代理 {i}", "parent_session_id": rng.choice(parent_ids)} for i in range(running)]
    async with db.session() as session:
        await session.execute(insert(SessionRow), children)
        child_ids = list(
            (
                await session.execute(
                    select(SessionRow.id)
                    .where(SessionRow.parent_session_id.is_not(None))
                    .order_by(SessionRow.id)
                )
            ).scalars()
        )
    rows = [
        {
            "parent_session_id": children[i]["parent_session_id"],
            "task_ref": f"t{i}",
            "child_session_id": child_id,
            "agent_type": "explorer",
            "task_description": "排查卡片进度链路",
            "status": "RUNNING" if i % 5 else "RECOVERING",
            "invocation_type": "BACKGROUND" if i % 3 else "FOLLOWUP",
            "total_rounds": i % 7,
            "started_at": now,
        }
        for i, child_id in enumerate(child_ids)
    ]
    for i in range(running):  # rows the query must skip: finished, and DELEGATE
        rows.append(  # noqa: PERF401 - two shapes of row, one list
            {
                "parent_session_id": rng.choice(parent_ids),
                "task_ref": f"h{i}",
                "child_session_id": None,
                "agent_type": "worker",
                "task_description": None,
                "status": "COMPLETED" if i % 2 else "RUNNING",
                "invocation_type": "BACKGROUND" if i % 2 else "DELEGATE",
                "total_rounds": 3,
                "started_at": now,
            }
        )
    for start in range(0, len(rows), 2000):
        async with db.session() as session:
            await session.execute(insert(SubagentExecution), rows[start : start + 2000])
    async with db.session() as session:
        shown = await session.scalar(
            select(func.count())
            .select_from(SubagentExecution)
            .where(
                SubagentExecution.status.in_(("RUNNING", "RECOVERING")),
                SubagentExecution.invocation_type.in_(("BACKGROUND", "FOLLOWUP")),
            )
        )
    assert shown == running, (shown, running)
    return parent_ids


@dataclass
class Measured:
    calls_per_s: float
    p50_ms: float
    p99_ms: float
    rows_per_call: float


async def hammer(call: Callable[[], Awaitable[int]], seconds: float, concurrency: int) -> Measured:
    latencies: list[float] = []
    rows = 0
    deadline = time.perf_counter() + seconds

    async def worker() -> None:
        nonlocal rows
        while time.perf_counter() < deadline:
            t0 = time.perf_counter()
            found = await call()  # not `rows += await ...`: that reads rows before the await
            rows += found
            latencies.append(time.perf_counter() - t0)

    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    elapsed = time.perf_counter() - started
    return Measured(
        len(latencies) / elapsed,
        percentile(latencies, 50) * 1000,
        percentile(latencies, 99) * 1000,
        rows / max(1, len(latencies)),
    )


async def run_once(url: str, parent_ids: list[int], seconds: float, concurrency: int) -> dict[str, Measured]:
    db = Database.open(url, pool_size=concurrency, max_overflow=0)
    manager = SubagentManager(db)
    rng = random.Random()
    try:

        async def per_parent() -> int:
            return len(await manager.list_running(rng.choice(parent_ids)))

        async def batched() -> int:
            found = await manager.list_running_many(parent_ids)
            return sum(len(v) for v in found.values())

        await per_parent()
        await batched()  # warm the pool and the server's caches
        return {
            "per parent": await hammer(per_parent, seconds, concurrency),
            "batched": await hammer(batched, seconds, concurrency),
        }
    finally:
        await db.close()


def table(args: argparse.Namespace, runs: list[dict[str, Measured]]) -> str:
    statements = -(-args.parents // MAX_PARENTS_PER_QUERY)
    lines = [
        "## Database: running-subagents query on MariaDB (`bench/db.py`)",
        "",
        f"{args.parents} live parents, {args.subagents} running BACKGROUND/FOLLOWUP subagents (plus "
        f"{args.subagents} finished/DELEGATE rows to skip), database `{BENCH_DATABASE}`, {args.concurrency} "
        f"concurrent callers on one pool, {args.seconds:g} s per form, medians of {len(runs)} run(s).",
        "",
        "| form | calls/s | p50 ms | p99 ms | rows per call | parents per call | SQL statements per call "
        "| to refresh every card once per second |",
        "|---|---:|---:|---:|---:|---:|---:|---|",
    ]
    for name, parents_per_call, stmts in (("per parent", 1, 1), ("batched", args.parents, statements)):
        med = {
            f: statistics.median(getattr(r[name], f) for r in runs)
            for f in ("calls_per_s", "p50_ms", "p99_ms", "rows_per_call")
        }
        needed = args.parents / parents_per_call
        load = f"{needed:,.0f} calls/s = {needed / med['calls_per_s']:.1%} of this server's capacity"
        lines.append(
            f"| {name} | {med['calls_per_s']:,.0f} | {med['p50_ms']:.2f} | {med['p99_ms']:.2f} | "
            f"{med['rows_per_call']:,.1f} | {parents_per_call} | {stmts} | {load} |"
        )
    return "\n".join(lines)


async def main_async(args: argparse.Namespace) -> None:
    url = await ensure_database(os.environ.get("FP_TEST_MYSQL_URL", DEFAULT_MYSQL_URL), args.database)
    db = Database.open(url)
    try:
        parent_ids = await seed(db, args.parents, args.subagents)
    finally:
        await db.close()
    runs = []
    for run in range(args.runs):
        runs.append(await run_once(url, parent_ids, args.seconds, args.concurrency))
        print(f"run {run + 1}: " + ", ".join(f"{k}: {v}" for k, v in runs[-1].items()), flush=True)
    text = table(args, runs)
    print("\n" + text)
    if not args.no_write:
        write_section("db", text)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--parents", type=int, default=1000)
    parser.add_argument("--subagents", type=int, default=5000)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--database", default=BENCH_DATABASE)
    parser.add_argument("--no-write", action="store_true", help="do not update bench/RESULTS.md")
    asyncio.run(main_async(parser.parse_args()))


if __name__ == "__main__":
    main()
