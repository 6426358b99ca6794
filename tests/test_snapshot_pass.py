"""The periodic snapshot pass dumps on the event loop in slices, and the loop gets its turns between them.

At 1,000 busy cards one pass dumps for ~16 ms; in one stretch it was the loop's longest. The test sets
the slice to nothing, so the pass yields after every snapshot, and notes the loop's turn at each dump.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient
from prometheus_client import CollectorRegistry

from feishu_progress.app import SERVICES, create_app
from feishu_progress.config import AdminSettings, ApiSettings, HttpSettings, Settings
from feishu_progress.runtime import snapshots
from feishu_progress.runtime.state import dump_snapshot
from tests.fakes import TurnCounter

AUTH = {"Authorization": "Bearer t"}
TASK = {"receive_id": "oc_1", "receive_id_type": "chat_id", "requester_open_id": "ou_1"}


async def test_a_pass_yields_between_its_dumps_and_saves_each_state_whole(
    tmp_path: Path, aiohttp_client: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = Settings(
        database_url=f"sqlite+aiosqlite:///{tmp_path / 'pass.db'}",
        http=HttpSettings(host="127.0.0.1", port=0),
        admin=AdminSettings(host="127.0.0.1", port=0),
        api=ApiSettings(token="t"),
    )
    app = create_app(settings, registry=CollectorRegistry())
    client: TestClient[Any, Any] = await aiohttp_client(app)
    sessions = []
    for index in range(12):
        session_id = (await (await client.post("/v1/tasks", json=TASK, headers=AUTH)).json())["session_id"]
        events = {"events": [{"type": "content_delta", "text": f"第 {index} 个任务。"}]}
        assert (await client.post(f"/v1/tasks/{session_id}/events", json=events, headers=AUTH)).status == 202
        sessions.append(session_id)
    service = app[SERVICES].service
    monkeypatch.setattr(snapshots, "DUMP_SLICE_SECONDS", 0.0)
    for session_id in sessions:
        service.snapshots.mark_dirty(await service.require(session_id))
    turns = TurnCounter()
    dumped_in: list[int] = []

    def dump_noting_the_turn(state: Any) -> str:
        dumped_in.append(turns.turn)
        return dump_snapshot(state)

    monkeypatch.setattr(snapshots, "dump_snapshot", dump_noting_the_turn)
    flushing = asyncio.ensure_future(service.snapshots.flush())
    await asyncio.sleep(0)
    changed = await service.require(sessions[-1])
    changed.state.content += "写到一半又来了一段。"  # between two slices of the pass
    service.snapshots.mark_dirty(changed)
    assert await flushing == len(sessions)
    turns.stop()
    assert len(set(dumped_in)) == len(dumped_in) == len(sessions)  # each dump in a turn of its own

    for session_id in sessions:
        saved = await service.snapshots.load(session_id)
        task = await service.require(session_id)
        assert saved is not None
        if session_id == sessions[-1]:
            # Dumped after the change, or dirty still and saved by the next pass: never half of it.
            assert saved.content == task.state.content or service.snapshots.is_dirty(session_id)
        else:
            assert dump_snapshot(saved) == dump_snapshot(task.state)
    await service.snapshots.flush()
    final = await service.snapshots.load(sessions[-1])
    assert final is not None and final.content.endswith("写到一半又来了一段。")
