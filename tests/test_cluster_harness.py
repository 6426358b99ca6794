"""The multi-instance harness (tests/cluster_harness.py) proven on what works today: ONE instance,
single-instance mode (FP_REDIS_URL unset), against the sandbox process and MariaDB.

The three-instance tests of cluster mode are in test_cluster_mode.py. These wait on real time (real
processes, real sockets) and are few.
"""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import redis

from feishu_progress.domain import TaskStatus
from tests.cluster_checks import (
    card_marks,
    out_of_order_events,
    overlapping_updates,
    rate_limit_answers,
    regressions_after_final,
)
from tests.cluster_harness import Cluster, ClusterOptions, Workload, eventually
from tests.conftest import fresh_mysql_database
from tests.redis_server import own_redis_server

pytestmark = [pytest.mark.mysql, pytest.mark.slow]

FINALS = (TaskStatus.COMPLETED, TaskStatus.FAILED, TaskStatus.CANCELLED)
# Streamed text is saved at most once a second (runtime/service.py): a kill -9 sooner loses the last
# second of content_delta in single-instance mode. Waiting this long first keeps "every event applied
# once" a fair question for the restarted process.
PERSISTED_SECONDS = 1.5


@pytest.fixture
def database_url() -> str:
    return fresh_mysql_database("harness")


@pytest.fixture
async def cluster(tmp_path: Path) -> AsyncIterator[Cluster]:
    async with Cluster(tmp_path) as running:
        yield running


async def test_one_instance_survives_kill9_and_a_restart_then_stops_on_sigterm(
    cluster: Cluster, database_url: str
) -> None:
    await cluster.start_sandbox("--latency-ms", "20")  # Feishu takes time; overlaps would show
    await cluster.start(1, ClusterOptions(database_url))
    workload = Workload(cluster)
    await workload.create(4)
    await workload.stream(seconds=3)
    await eventually_caught_up(workload)
    await asyncio.sleep(PERSISTED_SECONDS)

    killed_at = await cluster.kill9(0)
    await cluster.restart(0)
    await workload.stream(seconds=2)
    await workload.finish(FINALS)
    log = await workload.settled()

    messages = log["messages"]
    assert len(messages) == 4, "a restart must re-attach the same cards, never send new ones"
    assert overlapping_updates(messages) == []
    assert rate_limit_answers(messages) == [] and log["rate_limited"] == 0
    assert regressions_after_final(messages) == []
    assert out_of_order_events(messages, workload.expected_marks()) == []
    for message in messages:  # every card was updated again by the restarted process
        assert any(update["arrived"] > killed_at for update in message["updates"]), message["message_id"]
    assert workload.retried == 0
    updates = [len(m["updates"]) for m in messages]
    print(
        f"\n1 instance: {sum(updates)} updates of {len(messages)} cards, {workload.expected_marks()} events"
    )

    stopped = await cluster.sigterm(0)
    assert stopped.code == 0
    assert stopped.seconds < 5, f"SIGTERM took {stopped.seconds:.1f} s"


async def eventually_caught_up(workload: Workload) -> None:
    """Until every card shows every event sent so far (nothing left to deliver before the kill)."""
    expected = workload.expected_marks()

    async def caught_up() -> bool | None:
        log = await workload.cluster.sandbox_log()
        shown = {m["message_id"]: len(card_marks(m["card"])) for m in log["messages"]}
        return True if all(shown.get(mid) == count for mid, count in expected.items()) else None

    await eventually(caught_up, 20, "the cards to show every event")


async def test_the_harness_kills_everything_it_started_when_the_test_fails(
    tmp_path: Path, database_url: str
) -> None:
    cluster = Cluster(tmp_path)
    with pytest.raises(RuntimeError, match="the test failed"):
        async with cluster:
            await cluster.start(1, ClusterOptions(database_url))
            cluster.sigstop(0)  # a paused process must die too
            raise RuntimeError("the test failed")
    assert cluster.sandbox is not None and cluster.instances[0].child is not None
    for pid in (cluster.sandbox.pid, cluster.instances[0].child.pid):
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)  # gone and reaped, not a zombie


def test_a_private_redis_server_restarts_empty_on_the_same_port_and_always_stops() -> None:
    with own_redis_server() as server:
        client = redis.Redis.from_url(server.url)
        try:
            client.set("k", "v")
            server.restart()
            assert client.get("k") is None  # a restarted Redis has lost everything
            client.set("k", "w")
            process = server.process
            assert process is not None
        finally:
            client.close()
    assert process.poll() is not None  # stopped with the block
    with pytest.raises(ProcessLookupError):
        os.kill(process.pid, signal.SIGCONT)


def test_without_a_redis_server_binary_a_test_is_skipped_with_the_reason(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # a PATH with no redis-server on it
    monkeypatch.delenv("CI", raising=False)
    with pytest.raises(pytest.skip.Exception, match="redis-server is not installed"), own_redis_server():
        pass
    monkeypatch.setenv("CI", "true")  # CI must have it: there a missing binary fails the test
    with pytest.raises(pytest.fail.Exception, match="CI=true requires it"), own_redis_server():
        pass
