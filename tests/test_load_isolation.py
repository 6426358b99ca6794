"""Issue 26 items 4, 5 and 7: a flood of large bodies waits its turn instead of starving everything else.

The app runs in-process (SQLite, the in-process sandbox). A large body is held "in progress" by sending
it slowly over a raw socket: while it holds the one slot, another large batch waits and then gets 429
with Retry-After, and small batches and clicks go through at once.
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

from aiohttp.test_utils import TestClient
from prometheus_client import CollectorRegistry

from feishu_progress.app import create_app
from feishu_progress.config import AdminSettings, ApiSettings, HttpSettings, Settings

TOKEN = "load-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
TASK = {"receive_id": "oc_1", "receive_id_type": "chat_id", "requester_open_id": "ou_1"}
LARGE = json.dumps({"events": [{"type": "content", "text": "x" * 15_000} for _ in range(30)]}).encode()


def _settings(tmp_path: Path, **http: Any) -> Settings:
    return Settings(
        database_url=f"sqlite+aiosqlite:///{tmp_path / 'load.db'}",
        http=HttpSettings(host="127.0.0.1", port=0, **http),
        admin=AdminSettings(host="127.0.0.1", port=0),
        api=ApiSettings(token=TOKEN),
    )


async def _slow_large_body(client: TestClient[Any, Any], path: str) -> asyncio.StreamWriter:
    """Starts a large batch and sends only its first bytes: it holds the large-body slot."""
    _, writer = await asyncio.open_connection(client.host, client.port)
    head = (
        f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {TOKEN}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(LARGE)}\r\n\r\n"
    ).encode()
    writer.write(head + LARGE[:1000])
    await writer.drain()
    return writer


async def test_large_batches_wait_their_turn_and_small_ones_do_not(
    tmp_path: Path, aiohttp_client: Any
) -> None:
    settings = _settings(tmp_path, large_body_wait_seconds=0.5)
    client: TestClient[Any, Any] = await aiohttp_client(create_app(settings, registry=CollectorRegistry()))
    session_id = (await (await client.post("/v1/tasks", json=TASK, headers=AUTH)).json())["session_id"]
    path = f"/v1/tasks/{session_id}/events"
    holder = await _slow_large_body(client, path)
    await asyncio.sleep(0.1)  # the server is reading it
    try:
        started = time.monotonic()
        small = await client.post(path, json={"events": [{"type": "content", "text": "小"}]}, headers=AUTH)
        assert small.status == 202 and time.monotonic() - started < 0.4
        waited = await client.post(path, data=LARGE, headers=AUTH | {"Content-Type": "application/json"})
        assert waited.status == 429
        assert waited.headers["Retry-After"] == "1"
        assert (await waited.json())["error"] == "too_busy"
    finally:
        holder.close()
    await asyncio.sleep(0.1)  # the abandoned body gives its slot back
    again = await client.post(path, data=LARGE, headers=AUTH | {"Content-Type": "application/json"})
    assert again.status == 202
