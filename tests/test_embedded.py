"""The in-process Python API behaves like the HTTP API."""

from __future__ import annotations

from pathlib import Path

import pytest

from feishu_progress.config import AdminSettings, ApiSettings, FeishuSettings, HttpSettings, Settings
from feishu_progress.embedded import EmbeddedService
from feishu_progress.errors import EventRejected
from feishu_progress.sandbox.server import run_sandbox
from feishu_progress.sandbox.state import SandboxConfig


async def test_embedded_service_runs_a_task(tmp_path: Path) -> None:
    async with run_sandbox(SandboxConfig(app_id="cli_e", app_secret="s")) as sandbox:
        settings = Settings(
            database_url=f"sqlite+aiosqlite:///{tmp_path / 'e.db'}",
            feishu=FeishuSettings(
                base_url=sandbox.base_url, app_id="cli_e", app_secret="s", verification_token="vt"
            ),
            http=HttpSettings(host="127.0.0.1", port=0),
            admin=AdminSettings(host="127.0.0.1", port=0),
            api=ApiSettings(token="api-token"),
        )
        async with EmbeddedService(settings) as fp:
            assert fp.public_url is not None
            task = await fp.create_task(
                receive_id="oc_1", receive_id_type="chat_id", requester_open_id="ou_1"
            )
            assert task.message_id in sandbox.state.messages
            with pytest.raises(EventRejected) as rejected:
                await fp.post_events(task.session_id, [{"type": "content", "text": "x"}, {"type": "status"}])
            assert rejected.value.location == "events[1].status"
            assert (await fp.get_task(task.session_id))["round"] == 0
            assert await fp.post_events(task.session_id, [{"type": "finished", "status": "COMPLETED"}]) == 1
            assert (await fp.get_task(task.session_id))["status"] == "COMPLETED"
        # Leaving the block flushed the final state to the card.
        assert "已完成" in str(sandbox.state.messages[task.message_id].card)
