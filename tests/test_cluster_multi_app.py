"""Cluster mode with two apps: two ``feishu-progress serve`` instances, one MariaDB, one Redis, and two
sandbox processes (one per app), behind the harness's random load balancer.

Both sandboxes allow each app only 10/s and 400/min per API, and so does each app's budget in the
service (``FP_RATE__*`` for ``default``, ``[apps.second.rate]`` for ``second``): two instances that did not
share each app's budget through Redis would draw 429s. The Redis keys are per app_id.
"""

from __future__ import annotations

import asyncio
import importlib.util
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from feishu_progress.domain import TaskStatus
from tests.cluster_checks import card_status, rate_limit_answers
from tests.cluster_harness import (
    APP_ID,
    CHAT,
    REQUESTER,
    Child,
    Cluster,
    ClusterOptions,
    child_env,
    eventually,
)
from tests.conftest import fresh_mysql_database

pytestmark = [
    pytest.mark.cluster,
    pytest.mark.mysql,
    pytest.mark.slow,
    pytest.mark.skipif(
        importlib.util.find_spec("redis") is None, reason="the cluster extra is not installed"
    ),
]

SECOND_ID, SECOND_SECRET, SECOND_KEY = "cli_second", "second-secret", "second-encrypt-key"
PER_SECOND, PER_MINUTE = 10, 400
LIMITS = ("--latency-ms", "30", "--app-per-second", str(PER_SECOND), "--app-per-minute", str(PER_MINUTE))
TASKS_PER_APP = 6


@pytest.fixture
def redis_url() -> Iterator[str]:
    url = os.environ.get("FP_TEST_CLUSTER_REDIS_URL", "redis://127.0.0.1:6379/7")
    client = redis.Redis.from_url(url, socket_connect_timeout=2, socket_timeout=2)
    try:
        client.flushdb()
    except redis.RedisError as exc:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"Redis at {url} is unreachable ({exc}); CI=true requires it", pytrace=False)
        pytest.skip(f"Redis at {url} is unreachable ({exc})")
    finally:
        client.close()
    yield url


@pytest.fixture
def database_url() -> str:
    return fresh_mysql_database("cluster_apps")


async def _second_sandbox(cluster: Cluster) -> tuple[Child, str]:
    argv = [sys.executable, "-m", "feishu_progress", "sandbox", "--port", "0", "--app-id", SECOND_ID]
    argv += ["--app-secret", SECOND_SECRET, "--id-prefix", "second", *LIMITS]
    child = Child("sandbox-second", argv, child_env({}), cluster.workdir)
    child.start()

    async def announced() -> str | None:
        return next((line for line in child.output(100_000).splitlines() if line.startswith("http://")), None)

    return child, await eventually(announced, 45, "the second sandbox's URL")


def _apps_file(workdir: Path, base_url: str) -> Path:
    path = workdir / "apps.toml"
    path.write_text(
        f'[apps.second]\napp_id = "{SECOND_ID}"\napp_secret_env = "SECOND_APP_SECRET"\n'
        f'encrypt_key_env = "SECOND_APP_ENCRYPT_KEY"\ndomain = "{base_url}"\n'
        f"[apps.second.rate]\napp_per_second = {PER_SECOND}\napp_per_minute = {PER_MINUTE}\n",
        encoding="utf-8",
    )
    return path


async def _log(cluster: Cluster, base_url: str) -> dict[str, Any]:
    async with cluster.http.get(f"{base_url}/_sandbox/messages") as response:
        assert response.status == 200
        log: dict[str, Any] = await response.json()
        return log


async def test_two_instances_share_each_apps_budget_through_redis(
    tmp_path: Path, redis_url: str, database_url: str
) -> None:
    async with Cluster(tmp_path) as cluster:
        second, second_url = await _second_sandbox(cluster)
        try:
            await _run(cluster, second_url, ClusterOptions(database_url, redis_url))
        finally:
            second.kill()


async def _run(cluster: Cluster, second_url: str, options: ClusterOptions) -> None:
    await cluster.start_sandbox(*LIMITS)
    env = {
        "FP_APPS_FILE": str(_apps_file(cluster.workdir, second_url)),
        "SECOND_APP_SECRET": SECOND_SECRET,  # secrets only by env reference
        "SECOND_APP_ENCRYPT_KEY": SECOND_KEY,
        "FP_RATE__APP_PER_SECOND": str(PER_SECOND),
        "FP_RATE__APP_PER_MINUTE": str(PER_MINUTE),
        "FP_CARDKIT__APP_PER_SECOND": str(PER_SECOND),
        "FP_CARDKIT__APP_PER_MINUTE": str(PER_MINUTE),
    }
    options.env.update(env)
    await cluster.start(2, options)
    tasks = {
        app: [await _create(cluster, app) for _ in range(TASKS_PER_APP)] for app in ("default", "second")
    }
    everything = [task for created in tasks.values() for task in created]
    deadline = time.monotonic() + 6
    step = 0
    while time.monotonic() < deadline:  # both apps' cards stream at once, through random instances
        step += 1
        events = [{"type": "content", "text": f"step {step}"}]
        await asyncio.gather(*(_events(cluster, session_id, events) for session_id, _ in everything))
        await asyncio.sleep(0.2)
    finish = [{"type": "finished", "status": "COMPLETED", "content": "all done"}]
    await asyncio.gather(*(_events(cluster, session_id, finish) for session_id, _ in everything))
    logs = {"default": cluster.sandbox_url, "second": second_url}
    for app, created in tasks.items():
        await _finals_on(cluster, logs[app], [message_id for _, message_id in created])
        log = await _log(cluster, logs[app])
        assert rate_limit_answers(log["messages"]) == [], f"app {app} stayed within its shared budget"
        other = logs["second" if app == "default" else "default"]
        held = {message["message_id"] for message in (await _log(cluster, other))["messages"]}
        assert held.isdisjoint(message_id for _, message_id in created), "each card on its own app"
    assert options.redis_url is not None
    keys = redis.Redis.from_url(options.redis_url).keys("fp:budget:*")
    apps_in_keys = {key.decode().split(":")[2] for key in keys}
    assert {APP_ID, SECOND_ID} <= apps_in_keys, f"one shared budget per app_id in Redis: {keys}"


async def _create(cluster: Cluster, app: str) -> tuple[int, str]:
    body = {"receive_id": CHAT, "receive_id_type": "chat_id", "requester_open_id": REQUESTER, "app": app}
    reply = await cluster.call("POST", "/v1/tasks", json=body, headers=cluster.api_headers())
    assert reply.status == 201, reply.body
    return int(reply.body["session_id"]), str(reply.body["message_id"])


async def _events(cluster: Cluster, session_id: int, events: list[dict[str, Any]]) -> None:
    reply = await cluster.post_events(session_id, *events)
    assert reply.status == 202, reply.body


async def _finals_on(cluster: Cluster, base_url: str, message_ids: list[str]) -> None:
    async def settled() -> bool | None:
        by_id = {message["message_id"]: message for message in (await _log(cluster, base_url))["messages"]}
        shown = [by_id.get(message_id, {}).get("card") or {} for message_id in message_ids]
        return all(card_status(card) is TaskStatus.COMPLETED for card in shown) or None

    await eventually(settled, 30, f"every final on {base_url}")
