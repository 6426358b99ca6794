"""Stopping the service does not wait for the runtimes' long-polls: they answer at once.

aiohttp waits up to its shutdown timeout for requests in flight; an actions long-poll (up to 60 s) held
every stop of ``serve`` for that long (the agent adapters' tests paid ~28 s a module).
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import aiohttp
from prometheus_client import CollectorRegistry

from feishu_progress.app import create_app
from feishu_progress.config import AdminSettings, ApiSettings, HttpSettings, Settings
from feishu_progress.web.http import serving

TOKEN = "shutdown-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


async def test_a_waiting_long_poll_answers_when_the_service_stops(tmp_path: Path) -> None:
    settings = Settings(
        database_url=f"sqlite+aiosqlite:///{tmp_path / 'fp.db'}",
        http=HttpSettings(host="127.0.0.1", port=0),
        admin=AdminSettings(host="127.0.0.1", port=0),
        api=ApiSettings(token=TOKEN),
    )
    app = create_app(settings, registry=CollectorRegistry())
    async with aiohttp.ClientSession(headers=AUTH) as http:
        async with serving(app, shutdown_timeout=30.0) as base:
            task = {"receive_id": "oc_1", "receive_id_type": "chat_id", "requester_open_id": "ou_1"}
            async with http.post(f"{base}/v1/tasks", json=task) as created:
                session_id = (await created.json())["session_id"]
            poll = asyncio.ensure_future(http.get(f"{base}/v1/tasks/{session_id}/actions?wait=60"))
            await asyncio.sleep(0.5)  # the poll is waiting
            stopping = time.monotonic()
        stopped_in = time.monotonic() - stopping
        async with await poll as answer:
            assert answer.status == 200 and (await answer.json())["actions"] == []
    assert stopped_in < 10, f"the stop waited {stopped_in:.1f} s for a long-poll"
