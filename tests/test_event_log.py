"""The event log (cluster mode): batches stored for a card whose writer did not take them.

The card's writer applies them in order before any batch it receives itself, once each (one
Idempotency-Key across the forwarded and the logged copy), skips one its state refuses, and keeps
its place in the saved state. Run in one process on SQLite (the applier does not care which database);
tests/test_cluster_mode.py drives the whole path with three instances, a kill -9 and a SIGSTOP.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from feishu_progress.config import AdminSettings, ApiSettings, FeishuSettings, HttpSettings, Settings
from feishu_progress.db.repo import EventLogRepository, SubagentRepository
from feishu_progress.embedded import EmbeddedService
from feishu_progress.runtime.applier import EventApplier
from feishu_progress.runtime.event_log import EventLog
from feishu_progress.runtime.events import EventBatch, parse_model
from feishu_progress.runtime.service import TaskService
from feishu_progress.sandbox.server import run_sandbox
from feishu_progress.sandbox.state import SandboxConfig
from feishu_progress.services import Services
from feishu_progress.subagents.manager import SubagentManager


def batch(*events: Mapping[str, Any]) -> str:
    return json.dumps({"events": list(events)})


def delta(text: str) -> dict[str, str]:
    return {"type": "content_delta", "text": text}


def with_event_log(services: Services, log: EventLogRepository) -> TaskService:
    """The running service with its applier as cluster mode builds it: event log read, every batch saved."""
    applier = EventApplier(
        subagent_rows=SubagentRepository(services.db, services.background),
        manager=SubagentManager(services.db),
        images=lambda task: services.apps.get(task.state.app).images,
        snapshots=services.service.snapshots,
        clock=services.clock,
        metrics=services.metrics,
        event_log=EventLog(log, services.background),
        durable=True,
    )
    return dataclasses.replace(services.service, applier=applier)


@pytest.fixture
async def service(tmp_path: Path) -> AsyncIterator[tuple[TaskService, EventLogRepository, int]]:
    async with run_sandbox(SandboxConfig(app_id="cli_l", app_secret="s")) as sandbox:
        settings = Settings(
            database_url=f"sqlite+aiosqlite:///{tmp_path / 'l.db'}",
            feishu=FeishuSettings(
                base_url=sandbox.base_url, app_id="cli_l", app_secret="s", verification_token="vt"
            ),
            http=HttpSettings(host="127.0.0.1", port=0),
            admin=AdminSettings(host="127.0.0.1", port=0),
            api=ApiSettings(token="api-token"),
        )
        async with EmbeddedService(settings, serve_http=False) as fp:
            log = EventLogRepository(fp.services.db)
            service = with_event_log(fp.services, log)
            task = await fp.create_task(
                receive_id="oc_1", receive_id_type="chat_id", requester_open_id="ou_1"
            )
            yield service, log, task.session_id


async def test_logged_batches_go_first_in_order_and_one_key_is_applied_once(
    service: tuple[TaskService, EventLogRepository, int],
) -> None:
    tasks, log, session_id = service
    await log.append(session_id, "k1", batch(delta("A;")))
    await log.append(session_id, "k2", batch(delta("B;")))
    # The writer got the forwarded copy of k2 after all: applied once, after A.
    await tasks.apply_events(session_id, parse_model(EventBatch, json.loads(batch(delta("B;")))), "k2")
    await tasks.apply_events(session_id, parse_model(EventBatch, json.loads(batch(delta("C;")))), "k3")
    task = await tasks.require(session_id)
    assert task.state.content == "A;B;C;"
    assert task.state.events_applied == 2
    assert await log.after(session_id, 0) == [], "applied and saved: deleted"
    saved = await tasks.snapshots.load(session_id)
    assert saved is not None and (saved.content, saved.events_applied) == ("A;B;C;", 2)


async def test_a_nudge_applies_logged_batches_and_one_the_state_refuses_is_skipped(
    service: tuple[TaskService, EventLogRepository, int],
) -> None:
    tasks, log, session_id = service
    await log.append(session_id, None, batch(delta("A;"), {"type": "finished", "status": "COMPLETED"}))
    await log.append(session_id, None, batch(delta("after the final;")))
    await tasks.replay_actions(session_id)  # what a nudge does on the card's writer
    task = await tasks.require(session_id)
    assert (task.state.content, task.state.status.value) == ("A;", "COMPLETED")
    assert task.state.events_applied == 2, "the refused batch is passed over, not retried forever"
    assert await log.after(session_id, 0) == []
    await log.append(session_id, None, batch(delta("B;")))
    assert [entry.seq for entry in await log.after(session_id, 2)] == [3]
