"""Issue 26 item 1: instances trust each other by FP_CLUSTER__SECRET, never by the runtime token.

A cluster-mode app runs in this process (MariaDB + the test Redis, the sandbox as Feishu); what a peer
would post to ``/internal/v1/clicks`` is built here with the peer's signing code (``cluster/trust.py``).
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
import redis
from aiohttp.test_utils import TestClient
from prometheus_client import CollectorRegistry

from feishu_progress.app import ADMIN_URL, SERVICES, create_app
from feishu_progress.cluster.clicks import forwarded_click
from feishu_progress.cluster.forward import INTERNAL_CLICKS_PATH, event_to_json
from feishu_progress.cluster.trust import signed_headers
from feishu_progress.config import (
    AdminSettings,
    ApiSettings,
    CardSettings,
    ClusterSettings,
    FeishuSettings,
    HttpSettings,
    Settings,
)
from feishu_progress.db.migrate import upgrade
from feishu_progress.errors import ConfigError, NotWritableHere
from feishu_progress.feishu.callback import CardActionEvent
from feishu_progress.runtime.card_actions import CardActions
from feishu_progress.sandbox.server import RunningSandbox, SandboxConfig, run_sandbox
from feishu_progress.services import Services
from tests.conftest import fresh_mysql_database
from tests.redis_server import own_redis_server

APP_ID, APP_SECRET = "cli_trust", "trust-secret"
API_TOKEN = "runtime-token"
SECRET = "c" * 40
REQUESTER = "ou_requester"
AUTH = {"Authorization": f"Bearer {API_TOKEN}"}


def _redis_url() -> str:
    url = os.environ.get("FP_TEST_CLUSTER_REDIS_URL", "redis://127.0.0.1:6379/7")
    client = redis.Redis.from_url(url, socket_connect_timeout=2)
    try:
        client.flushdb()
    except redis.RedisError as exc:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"Redis at {url} is unreachable ({exc}); CI=true requires it", pytrace=False)
        pytest.skip(f"Redis at {url} is unreachable")
    finally:
        client.close()
    return url


def _settings(database_url: str, redis_url: str, sandbox_url: str, secret: str | None) -> Settings:
    return Settings(
        database_url=database_url,
        redis_url=redis_url,
        instance_id="trust-0",
        cluster=ClusterSettings(secret=secret, advertise_url="http://127.0.0.1:1"),
        card=CardSettings(transport="patch"),
        feishu=FeishuSettings(
            base_url=sandbox_url, app_id=APP_ID, app_secret=APP_SECRET, verification_token="vt"
        ),
        http=HttpSettings(host="127.0.0.1", port=0),
        admin=AdminSettings(host="127.0.0.1", port=0, token="admin"),
        api=ApiSettings(token=API_TOKEN),
    )


def test_cluster_mode_refuses_to_start_without_the_secret_and_names_it() -> None:
    settings = _settings("mysql+aiomysql://x@127.0.0.1/x", "redis://127.0.0.1:6379/0", "http://x", None)
    with pytest.raises(ConfigError, match="FP_CLUSTER__SECRET"):
        create_app(settings, registry=CollectorRegistry())
    short = settings.model_copy(update={"cluster": ClusterSettings(secret="short")})
    assert any("FP_CLUSTER__SECRET" in problem for problem in short.serving_problems())


@pytest.fixture
async def sandbox() -> AsyncIterator[RunningSandbox]:
    async with run_sandbox(SandboxConfig(app_id=APP_ID, app_secret=APP_SECRET)) as running:
        yield running


@pytest.fixture
def database_url() -> str:
    return fresh_mysql_database("trust")  # sync: it runs its own event loop


@pytest.fixture
async def instance(
    sandbox: RunningSandbox, database_url: str, aiohttp_client: Any
) -> AsyncIterator[TestClient[Any, Any]]:
    redis_url = _redis_url()
    await upgrade(database_url)
    app = create_app(
        _settings(database_url, redis_url, sandbox.base_url, SECRET), registry=CollectorRegistry()
    )
    client: TestClient[Any, Any] = await aiohttp_client(app)
    yield client


TASK = {"receive_id": "oc_1", "receive_id_type": "chat_id", "requester_open_id": REQUESTER}


async def _task_waiting_for_approval(client: TestClient[Any, Any]) -> tuple[int, str]:
    created = await client.post("/v1/tasks", json=TASK, headers=AUTH)
    assert created.status == 201, await created.text()
    task = await created.json()
    approval = {"type": "approval", "approval_id": "a1", "tool_name": "shell", "summary": "rm -rf /"}
    sent = await client.post(
        f"/v1/tasks/{task['session_id']}/events", json={"events": [approval]}, headers=AUTH
    )
    assert sent.status == 202, await sent.text()
    return task["session_id"], task["message_id"]


def _approve(session_id: int, message_id: str, *, event_id: str = "ev-1", token: str = "tok-1") -> bytes:
    event = CardActionEvent(
        event_id=event_id,
        token=token,
        open_id=REQUESTER,
        message_id=message_id,
        value={"v": 1, "action": "approve", "session_id": session_id, "approval_id": "a1"},
    )
    return json.dumps(event_to_json(event)).encode()


def _from_peer(body: bytes, secret: str = SECRET) -> dict[str, str]:
    return {"Content-Type": "application/json"} | signed_headers(
        secret, "POST", INTERNAL_CLICKS_PATH, body, time.time()
    )


async def _approvals(client: TestClient[Any, Any], session_id: int) -> list[dict[str, Any]]:
    answer = await client.get(f"/v1/tasks/{session_id}/actions", headers=AUTH)
    return [action for action in (await answer.json())["actions"] if action["kind"] == "approval"]


@pytest.mark.mysql
async def test_the_runtime_token_cannot_post_an_internal_click(instance: TestClient[Any, Any]) -> None:
    session_id, message_id = await _task_waiting_for_approval(instance)
    body = _approve(session_id, message_id)
    as_runtime = {"Content-Type": "application/json"} | AUTH
    refused = await instance.post(INTERNAL_CLICKS_PATH, data=body, headers=as_runtime)
    assert refused.status == 401
    assert "FP_CLUSTER__SECRET" in (await refused.json())["message"]
    wrong_secret = await instance.post(INTERNAL_CLICKS_PATH, data=body, headers=_from_peer(body, "x" * 40))
    assert wrong_secret.status == 401
    stale = {"Content-Type": "application/json"} | signed_headers(
        SECRET, "POST", INTERNAL_CLICKS_PATH, body, time.time() - 120
    )
    assert (await instance.post(INTERNAL_CLICKS_PATH, data=body, headers=stale)).status == 401
    assert await _approvals(instance, session_id) == []


@pytest.mark.mysql
async def test_a_replayed_internal_click_is_applied_once(instance: TestClient[Any, Any]) -> None:
    session_id, message_id = await _task_waiting_for_approval(instance)
    body = _approve(session_id, message_id)
    first = await instance.post(INTERNAL_CLICKS_PATH, data=body, headers=_from_peer(body))
    assert first.status == 200 and (await first.json())["toast"]["type"] == "success"
    replay = await instance.post(INTERNAL_CLICKS_PATH, data=body, headers=_from_peer(body))
    assert replay.status == 200 and (await replay.json())["toast"]["type"] == "info"
    # The same click (event id) forwarded again with another callback token: still the one click.
    again = _approve(session_id, message_id, token="tok-2")
    assert (await instance.post(INTERNAL_CLICKS_PATH, data=again, headers=_from_peer(again))).status == 200
    assert len(await _approvals(instance, session_id)) == 1


@pytest.mark.mysql
async def test_an_internal_click_from_another_message_or_not_an_object_is_refused(
    instance: TestClient[Any, Any],
) -> None:
    session_id, _ = await _task_waiting_for_approval(instance)
    body = _approve(session_id, "om_not_this_card")
    answer = await instance.post(INTERNAL_CLICKS_PATH, data=body, headers=_from_peer(body))
    assert (await answer.json())["toast"]["type"] == "error"
    bad_value = json.loads(_approve(session_id, "om_x", event_id="ev-9")) | {"value": [1, 2]}
    raw = json.dumps(bad_value).encode()
    refused = await instance.post(INTERNAL_CLICKS_PATH, data=raw, headers=_from_peer(raw))
    assert refused.status == 400
    assert "'value'" in (await refused.json())["message"]
    assert await _approvals(instance, session_id) == []


@pytest.mark.mysql
async def test_the_record_only_path_binds_the_click_to_its_card(instance: TestClient[Any, Any]) -> None:
    session_id, message_id = await _task_waiting_for_approval(instance)
    services: Services = instance.server.app[SERVICES]
    service = services.service

    async def writer_out_of_reach(session: int) -> None:
        raise NotWritableHere(session)

    # The card's writer cannot be reached: this instance only records the click (cluster/clicks.record_only).
    here = CardActions(
        tasks=writer_out_of_reach,  # type: ignore[arg-type]
        action_log=service.action_log,
        snapshots=service.snapshots,
        settings=services.settings,
        clock=services.clock,
    )
    foreign = CardActionEvent(
        event_id="ev-f",
        token="tok-f",
        open_id=REQUESTER,
        message_id="om_not_this_card",
        value={"v": 1, "action": "approve", "session_id": session_id, "approval_id": "a1"},
    )
    refused = await forwarded_click(here, service.snapshots.load, foreign)
    assert refused.toast_type == "error"
    assert await _approvals(instance, session_id) == []
    mine = CardActionEvent(**{**event_to_json(foreign), "message_id": message_id, "options": ()})
    assert (await forwarded_click(here, service.snapshots.load, mine)).toast_type == "success"
    assert len(await _approvals(instance, session_id)) == 1


@pytest.mark.mysql
async def test_readyz_says_redis_is_unreachable_and_not_where_it_is(
    sandbox: RunningSandbox, database_url: str, aiohttp_client: Any
) -> None:
    with own_redis_server() as redis_server:
        await upgrade(database_url)
        settings = _settings(database_url, redis_server.url, sandbox.base_url, SECRET)
        client: TestClient[Any, Any] = await aiohttp_client(
            create_app(settings, registry=CollectorRegistry())
        )
        admin_url = client.server.app[ADMIN_URL]
        redis_server.stop()
        port = redis_server.url.rsplit(":", 1)[1].split("/")[0]
        deadline = asyncio.get_running_loop().time() + 15
        while True:
            # Some Redis call must fail first (the budget, a dedupe, the nudges' subscriber).
            await client.post("/v1/tasks", json=TASK, headers=AUTH)
            async with client.session.get(f"{admin_url}/readyz") as answer:
                text = await answer.text()
            if "unreachable" in text or asyncio.get_running_loop().time() > deadline:
                break
            await asyncio.sleep(0.2)
        assert "unreachable" in text, text
        assert port not in text and "127.0.0.1" not in text.replace(admin_url, ""), text
        await client.close()
