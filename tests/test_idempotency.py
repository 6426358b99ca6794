"""Issue 26 item 10: an Idempotency-Key is bound to the request it first came with.

The same key with the same request is a repeat (the same task; the batch not applied twice); the same
key with another request is a 422 naming ``Idempotency-Key`` — never someone else's task, never events
answered 202 and silently dropped. The app runs in-process on SQLite against the sandbox.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient
from prometheus_client import CollectorRegistry

from feishu_progress.app import create_app
from feishu_progress.config import AdminSettings, ApiSettings, FeishuSettings, HttpSettings, Settings
from feishu_progress.sandbox.server import RunningSandbox, SandboxConfig, run_sandbox

APP_ID, APP_SECRET, API_TOKEN = "cli_idem", "idem-secret", "idem-token"
AUTH = {"Authorization": f"Bearer {API_TOKEN}"}
TASK = {"receive_id": "oc_1", "receive_id_type": "chat_id", "requester_open_id": "ou_a", "title": "t"}


@pytest.fixture
async def sandbox() -> AsyncIterator[RunningSandbox]:
    async with run_sandbox(SandboxConfig(app_id=APP_ID, app_secret=APP_SECRET)) as running:
        yield running


@pytest.fixture
async def client(sandbox: RunningSandbox, tmp_path: Path, aiohttp_client: Any) -> TestClient[Any, Any]:
    settings = Settings(
        database_url=f"sqlite+aiosqlite:///{tmp_path / 'idem.db'}",
        feishu=FeishuSettings(
            base_url=sandbox.base_url, app_id=APP_ID, app_secret=APP_SECRET, verification_token="vt"
        ),
        http=HttpSettings(host="127.0.0.1", port=0),
        admin=AdminSettings(host="127.0.0.1", port=0),
        api=ApiSettings(token=API_TOKEN),
    )
    test_client: TestClient[Any, Any] = await aiohttp_client(
        create_app(settings, registry=CollectorRegistry())
    )
    return test_client


async def test_a_create_key_reused_for_another_request_is_a_422(client: TestClient[Any, Any]) -> None:
    key = AUTH | {"Idempotency-Key": "run-1"}
    first = await client.post("/v1/tasks", json=TASK, headers=key)
    assert first.status == 201
    repeat = await client.post("/v1/tasks", json=TASK, headers=key)
    assert repeat.status == 201
    assert (await repeat.json())["session_id"] == (await first.json())["session_id"]
    someone_else = TASK | {"receive_id": "oc_2", "requester_open_id": "ou_b"}
    reused = await client.post("/v1/tasks", json=someone_else, headers=key)
    assert reused.status == 422
    answer = await reused.json()
    assert answer["field"] == "Idempotency-Key" and "message_id" not in answer


async def test_a_batch_key_reused_with_other_events_is_a_422_not_a_silent_drop(
    client: TestClient[Any, Any],
) -> None:
    created = await (await client.post("/v1/tasks", json=TASK, headers=AUTH)).json()
    events = f"/v1/tasks/{created['session_id']}/events"
    key = AUTH | {"Idempotency-Key": "batch-1"}
    first = {"events": [{"type": "content", "text": "一"}]}
    assert (await client.post(events, json=first, headers=key)).status == 202
    assert (await client.post(events, json=first, headers=key)).status == 202  # a repeat
    other = {"events": [{"type": "content", "text": "二"}]}
    reused = await client.post(events, json=other, headers=key)
    assert reused.status == 422
    assert (await reused.json())["field"] == "Idempotency-Key"
    view = await (await client.get(f"/v1/tasks/{created['session_id']}", headers=AUTH)).json()
    assert "一" in str(view) and "二" not in str(view)
