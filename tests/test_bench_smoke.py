"""Smoke runs of every benchmark in bench/ with tiny sizes: they must keep running (they are not tests).

Sizes are tiny and nothing is asserted about speed; the MySQL one follows the ``mysql_url`` fixture's
rule (skipped without a server, a failure under CI=true).
"""

from __future__ import annotations

import asyncio
import math
import os
import sys
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy.engine import make_url

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.conftest import fresh_mysql_database

pytestmark = pytest.mark.slow  # runs every benchmark with tiny sizes, in subprocesses


def _bench(name: str) -> Any:
    import importlib

    return importlib.import_module(f"bench.{name}")


async def test_load_smoke_ours_and_naive() -> None:
    load = _bench("load")
    for kind in ("ours", "naive"):
        result = await load.one_run(kind, tasks=5, seconds=1.0, scale=1.0, flush=0.25, seed=0)
        assert result.events_offered > 0, kind
        assert result.post_errors == 0, kind
        assert not math.isnan(result.cpu_per_1k), kind
        assert result.finals_pct > 0, kind
    assert result.tasks == 5


async def test_multi_app_smoke_one_app_and_two() -> None:
    multi_app = _bench("multi_app")
    for config, apps in (("one app", {"default"}), ("two apps", {"research", "sales"})):
        result = await multi_app.one_run(config, tasks=4, seconds=1.0, scale=1.0, flush=0.25, seed=0)
        assert set(result.per_app) == apps, config
        assert all(app.finals_pct == 100.0 for app in result.per_app.values()), config
        assert result.lookups_per_task > 0 and result.lookup_ns > 0, config


def test_micro_smoke() -> None:
    micro = _bench("micro")
    build_ms, total_ms, size = micro.time_build(micro.typical_model(), 2)
    assert 0 < build_ms <= total_ms and size > 0
    _, _, worst_size = micro.time_build(micro.worst_model(), 1)
    assert worst_size <= 30 * 1024


def test_state_micro_smoke() -> None:
    state = _bench("state_micro")
    assert state.per_batch("text", 3) >= 0 and state.per_batch("tool", 3) >= 0
    _, size = state.per_snapshot(2)
    assert size > 10_000  # 30 calls with 400-byte results, as saved


@pytest.fixture(scope="module")
def bench_database_url() -> str:
    return fresh_mysql_database("bench_smoke")


@pytest.mark.mysql
async def test_db_smoke(bench_database_url: str) -> None:
    db_bench = _bench("db")
    from feishu_progress.db.engine import Database

    url = await db_bench.ensure_database(bench_database_url, make_url(bench_database_url).database)
    db = Database.open(url)
    try:
        parents = await db_bench.seed(db, 10, 30)
    finally:
        await db.close()
    measured = await db_bench.run_once(url, parents, 0.2, 2)
    assert measured["batched"].rows_per_call == 30
    assert measured["per parent"].calls_per_s > 0


async def test_freshness_smoke_both_transports() -> None:
    freshness = _bench("freshness")
    runs = [
        freshness.one_run(transport, cards=2, seconds=2.0, scale=1.0, every=(0.3, 0.5))
        for transport in freshness.TRANSPORTS
    ]
    for transport, result in zip(freshness.TRANSPORTS, await asyncio.gather(*runs), strict=True):
        assert result.deltas > 0, transport
        assert result.seen_pct > 0, transport
        assert result.rate_limited == 0, transport
        assert result.post_errors == 0, transport


def test_freshness_first_seen_takes_the_earliest_card() -> None:
    freshness = _bench("freshness")
    history = [(1.0, {"text": "⟦0:0⟧"}), (2.0, {"text": "⟦0:0⟧ ⟦0:1⟧"}), (3.0, {"text": "⟦0:1⟧ ⟦0:2⟧"})]
    assert freshness.first_seen(history, 10.0) == {"0:0": 11.0, "0:1": 12.0, "0:2": 13.0}


async def test_load_idle_only_smoke() -> None:
    load = _bench("load")
    result = await load.one_run("ours", tasks=3, seconds=0.0, scale=1.0, flush=0.25, seed=0, idle_only=True)
    assert result.live_cards >= 3
    assert not math.isnan(result.rss_per_card)


async def test_callbacks_smoke() -> None:
    callbacks = _bench("callbacks")
    (burst,) = await callbacks.one_run(tasks=2, sizes=[5])
    assert burst.clicks == 5 and burst.failures == 0
    assert 0 < burst.p50_ms <= burst.p99_ms <= burst.max_ms


async def test_creates_smoke_both_transports_answer_busy_503s_and_keep_one_task_per_key() -> None:
    creates = _bench("creates")
    # 100 in flight on a 10/s budget would wait 10 s for their sends, past the 2 s bound: some are told to
    # come back (503 + Retry-After) and their client's retry with the same key gets the same task.
    runs = [
        creates.one_run(
            transport,
            creates=200,
            in_flight=100,
            scale=4.0,
            bound=2.0,
            margin=30.0,  # a smoke run asserts no speed: a busy CI machine may answer late
            per_second=10.0,
            per_minute=600.0,
        )
        for transport in creates.TRANSPORTS
    ]
    for transport, result in zip(creates.TRANSPORTS, await asyncio.gather(*runs), strict=True):
        assert result.problems() == [], transport
        assert result.busy_503 > 0 and result.retry_after, transport
        assert result.rows == 200 and result.messages == 200, transport


def _bench_redis_url() -> str:
    import redis

    url = os.environ.get("FP_TEST_BENCH_REDIS_URL", "redis://127.0.0.1:6379/6")
    client = redis.Redis.from_url(url, socket_connect_timeout=2, socket_timeout=2)
    try:
        client.ping()
    except redis.RedisError as exc:
        message = f"Redis at {url} is unreachable ({exc})"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(message + "; CI=true requires it", pytrace=False)
        pytest.skip(message)
    finally:
        client.close()
    return url


@pytest.mark.mysql
async def test_cluster_load_smoke(bench_database_url: str) -> None:
    cluster_load = _bench("cluster_load")
    config = cluster_load.RunConfig(
        instances=1,
        cluster_mode=True,
        tasks=3,
        seconds=1.0,
        flush=0.25,
        seed=0,
        kill=False,
        mysql_url=bench_database_url,
        redis_url=_bench_redis_url(),
    )
    result = await cluster_load.one_run(config)
    assert result.events_per_s > 0
    assert result.finals_pct == 100.0
    assert result.rate_limit_answers == 0
    assert not math.isnan(result.cpu_per_1k)
