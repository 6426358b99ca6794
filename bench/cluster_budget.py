"""Latency of one shared-budget decision (cluster/budget.py): the Redis script, and the local fallback.

    python bench/cluster_budget.py --runs 3 --acquires 5000

Each run makes ``--acquires`` sequential ``try_acquire`` calls against Redis (``--redis-url``, default
the test database 5) with a budget far above the call rate, so every call is one full grant: the
EVALSHA round trip with both GCRA windows checked and written. For comparison the same count is timed
for the bare script call through redis-py (what our wrapper adds on top), and against the local
fallback (Redis unreachable: budget ÷ live instances, no I/O). Latency is perf_counter around
each call; p50/p99 per run, then the median of the runs with min–max.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import redis.asyncio as aioredis

from bench.common import median, percentile, write_section
from feishu_progress.cluster import scripts
from feishu_progress.cluster.budget import BudgetMode, SharedBudget
from feishu_progress.cluster.limits import OpenApi
from feishu_progress.config import RateSettings
from feishu_progress.ports import SystemClock

DEFAULT_URL = "redis://127.0.0.1:6379/5"
# Far above any call rate this loop reaches: every call is a grant, never a wait.
UNLIMITED = RateSettings.lifted(1_000_000, 60_000_000)


@dataclass(frozen=True, slots=True)
class RunResult:
    p50_us: float
    p99_us: float
    granted: int


async def time_acquires(budget: SharedBudget, count: int, expected: BudgetMode) -> RunResult:
    """``count`` sequential try_acquire calls; latency percentiles in microseconds."""
    latencies: list[float] = []
    granted = 0
    for _ in range(count):
        started = time.perf_counter()
        attempt = await budget.try_acquire(OpenApi.PATCH, urgent=False)
        latencies.append((time.perf_counter() - started) * 1e6)
        if attempt.grant is not None:
            if attempt.grant.mode is not expected:
                raise RuntimeError(f"expected {expected}, got {attempt.grant.mode}: {budget.status()}")
            granted += 1
            budget.settle(attempt.grant)
    return RunResult(percentile(latencies, 50), percentile(latencies, 99), granted)


async def shared_run(url: str, count: int) -> RunResult:
    prefix = f"fp:bench:{uuid.uuid4().hex}"
    budget = SharedBudget.from_url(
        url, app_id="cli_bench", rate=UNLIMITED, clock=SystemClock(), key_prefix=prefix
    )
    try:
        await time_acquires(budget, min(200, count), BudgetMode.SHARED)  # warm: connection, EVALSHA loaded
        return await time_acquires(budget, count, BudgetMode.SHARED)
    finally:
        await budget.aclose()
        cleanup = aioredis.Redis.from_url(url)
        try:
            keys = [key async for key in cleanup.scan_iter(match=f"{prefix}:*")]
            if keys:
                await cleanup.delete(*keys)
        finally:
            await cleanup.aclose()


async def bare_script_run(url: str, count: int) -> RunResult:
    """The same script through redis-py alone (no timeout guard, no metrics, no local share): the floor."""
    client = aioredis.Redis.from_url(url)
    script = client.register_script(scripts.TAKE)
    key = f"fp:bench:{uuid.uuid4().hex}:bare"
    args = [1, 10_000_000, 1, 10_000_000, ""]
    latencies: list[float] = []
    try:
        for _ in range(min(200, count)):
            await script(keys=[key], args=args)
        for _ in range(count):
            started = time.perf_counter()
            await script(keys=[key], args=args)
            latencies.append((time.perf_counter() - started) * 1e6)
        await client.delete(key)
    finally:
        await client.aclose()
    return RunResult(percentile(latencies, 50), percentile(latencies, 99), count)


async def fallback_run(count: int) -> RunResult:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]  # closed again: nothing listens there
    budget = SharedBudget.from_url(
        f"redis://127.0.0.1:{port}/0", app_id="cli_bench", rate=UNLIMITED, clock=SystemClock(), timeout=0.1
    )
    try:
        quiet = await budget.try_acquire(OpenApi.PATCH)  # the one call that finds Redis gone
        await asyncio.sleep(quiet.wait)  # the short window after a switch grants nothing (budget.py)
        return await time_acquires(budget, count, BudgetMode.LOCAL_FALLBACK)
    finally:
        await budget.aclose()


def spread(values: list[float]) -> str:
    return f"{median(values):.0f} ({min(values):.0f}–{max(values):.0f})"


async def main_async(args: argparse.Namespace) -> None:
    load_before = os.getloadavg()[0]
    shared = [await shared_run(args.redis_url, args.acquires) for _ in range(args.runs)]
    bare = [await bare_script_run(args.redis_url, args.acquires) for _ in range(args.runs)]
    local = [await fallback_run(args.acquires) for _ in range(args.runs)]
    rows = [
        ("shared (Redis script)", shared),
        ("the bare EVALSHA (redis-py only)", bare),
        ("local fallback", local),
    ]
    lines = [
        f"### Shared budget: one decision, {args.acquires} sequential acquires, median of {args.runs} run(s) "
        "(min–max)",
        "",
        "| mode | p50 µs | p99 µs | granted |",
        "|---|---:|---:|---:|",
    ]
    for name, results in rows:
        p50 = spread([r.p50_us for r in results])
        p99 = spread([r.p99_us for r in results])
        lines.append(f"| {name} | {p50} | {p99} | {min(r.granted for r in results)} |")
    lines.append("")
    lines.append(
        "Local Redis 7.0 on the same machine; one `try_acquire` = one EVALSHA of the two-window GCRA script "
        "(plus the local share's bookkeeping), measured at the caller. 1-minute load average at the start: "
        f"{load_before:.1f} (p99 is what other processes on the machine cost; p50 is the script)."
    )
    body = "\n".join(lines)
    print(body)
    if args.write:
        write_section("cluster-budget", body)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--acquires", type=int, default=5000)
    parser.add_argument("--redis-url", default=DEFAULT_URL)
    parser.add_argument("--no-write", dest="write", action="store_false", help="do not touch RESULTS.md")
    asyncio.run(main_async(parser.parse_args()))


if __name__ == "__main__":
    main()
