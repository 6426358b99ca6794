"""A database outage mid-task loses nothing: the service (a subprocess) reaches MariaDB through a TCP
proxy that is cut for 10 s while a task streams.

During the cut the card keeps moving, every event is answered 202 (applied, saved later) or a 503 the
runtime retries, never a 500 and never silently dropped, and ``/readyz`` says the database is gone.
After the cut the snapshot is saved; the service is then killed (so only what was saved counts) and
restarted, and the card it rebuilds from the database must be the card Feishu last received.
"""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import AsyncIterator, Mapping
from typing import Any

import aiohttp
import pytest
from sqlalchemy.engine import make_url
from sqlalchemy.pool import NullPool

from feishu_progress.db.engine import Database
from feishu_progress.db.repo import TaskRecord, TaskRepository
from feishu_progress.sandbox.server import RunningSandbox
from tests.conftest import ProxyFactory, fresh_mysql_database
from tests.rigs import eventually
from tests.service_process import Harness, Service, card_text, state_word
from tests.tcp_proxy import TcpProxy

pytestmark = [pytest.mark.faults, pytest.mark.mysql, pytest.mark.slow]

CUT_SECONDS = 10.0
SAVED_WITHIN_SECONDS = 15.0  # after the database returns (saves run once a second)
CARD_WITHIN_SECONDS = 10.0


@pytest.fixture(scope="module")
def database_url() -> str:
    return fresh_mysql_database("faults")


@pytest.fixture
async def db_proxy(database_url: str, tcp_proxy: ProxyFactory) -> TcpProxy:
    url = make_url(database_url)
    return await tcp_proxy(url.host or "127.0.0.1", url.port or 3306)


@pytest.fixture
async def harness(database_url: str, db_proxy: TcpProxy, sandbox: RunningSandbox) -> AsyncIterator[Harness]:
    """The service's FP_DATABASE_URL points at the proxy; the test reads the database directly."""
    proxied = make_url(database_url).set(port=db_proxy.port).render_as_string(hide_password=False)
    async with aiohttp.ClientSession() as http:
        harness = Harness(proxied, sandbox, http)
        await harness.migrate()
        try:
            yield harness
        finally:
            await harness.stop_all()


@pytest.fixture
async def direct_db(database_url: str) -> AsyncIterator[TaskRepository]:
    database = Database.open(database_url, poolclass=NullPool)
    try:
        yield TaskRepository(database)
    finally:
        await database.close()


class Runtime:
    """Plays an agent runtime: posts events, and retries a batch the service refused with a 503."""

    def __init__(self, harness: Harness, service: Service, session_id: int) -> None:
        self.harness = harness
        self.service = service
        self.session_id = session_id
        self.answers: list[int] = []  # every status the service answered, retries included

    async def post(self, *events: Mapping[str, Any], deadline_seconds: float = 30.0) -> None:
        url = f"{self.service.base_url}/v1/tasks/{self.session_id}/events"
        deadline = time.monotonic() + deadline_seconds
        while True:
            async with self.harness.http.post(
                url, json={"events": list(events)}, headers=self.harness.headers()
            ) as response:
                self.answers.append(response.status)
                body = await response.json()
            if response.status == 202:
                return
            # Anything else but a retryable 503 is an event lost or a crash: the test fails here.
            assert response.status == 503, (response.status, body)
            assert body["retry_after"] > 0, body
            assert time.monotonic() < deadline, "the service refused the batch for too long"
            await asyncio.sleep(min(float(body["retry_after"]), 1.0))


async def card_showing(harness: Harness, message_id: str, word: str, text: str = "") -> dict[str, Any]:
    """The sandbox's newest card for the message once it carries the state ``word`` and ``text``."""
    card: dict[str, Any] = await eventually(
        lambda: harness.sandbox.state.messages[message_id].card,
        until=lambda card: state_word(card) == word and text in card_text(card),
        timeout=CARD_WITHIN_SECONDS,
        what=f"the card to show {word!r} {text!r}",
    )
    return card


def without_streaming_config(card: dict[str, Any]) -> dict[str, Any]:
    """A CardKit card as built: the entity's ``streaming_mode`` / ``streaming_config`` left out."""
    config = {k: v for k, v in card["config"].items() if k not in {"streaming_mode", "streaming_config"}}
    return {**card, "config": config}


async def readiness(harness: Harness, service: Service) -> tuple[int, dict[str, Any]]:
    async with harness.http.get(f"{service.admin_url}/readyz") as response:
        body: dict[str, Any] = await response.json()
        return response.status, body


async def saved(repo: TaskRepository, session_id: int, status: str) -> TaskRecord:
    """The task's row once its saved status is ``status`` (read straight from MariaDB, not the proxy)."""
    record = await eventually(
        lambda: repo.get(session_id),
        until=lambda record: record is not None and record.status == status,
        timeout=SAVED_WITHIN_SECONDS,
        interval=0.2,
        what=f"the saved status to be {status}",
    )
    assert record is not None
    return record


async def test_a_ten_second_database_cut_mid_task_loses_nothing(
    harness: Harness, db_proxy: TcpProxy, direct_db: TaskRepository
) -> None:
    service = await harness.start()
    session_id, message_id = await harness.create_task(service, "数据库断开")
    runtime = Runtime(harness, service, session_id)
    await runtime.post(
        {"type": "status", "status": "RUNNING", "round": 1},
        {"type": "content", "text": "断开之前"},
        {"type": "tool_started", "call_id": "t1", "name": "shell", "args": {"command": "make test"}},
    )
    await card_showing(harness, message_id, "正在处理", "断开之前")

    db_proxy.cut()
    cut_at = time.monotonic()
    question = {"question": "继续吗?", "options": ["继续", "停止"]}
    await runtime.post({"type": "ask", "ask_id": "a1", "questions": [question]})
    await card_showing(harness, message_id, "等待回复", "继续吗")
    status, body = await readiness(harness, service)
    assert status == 503 and "database" in body["reasons"], body

    await runtime.post(
        {"type": "status", "status": "RUNNING", "round": 2},
        {"type": "tool_finished", "call_id": "t1", "result": {"output": "ok"}},
        {"type": "content", "text": "断开期间写的内容"},
    )
    await card_showing(harness, message_id, "正在处理", "断开期间写的内容")
    await asyncio.sleep(max(0.0, cut_at + CUT_SECONDS - 1.0 - time.monotonic()))
    await runtime.post({"type": "finished", "status": "COMPLETED", "content": "全部完成,数据库还没回来"})
    final = await card_showing(harness, message_id, "已完成", "数据库还没回来")
    assert db_proxy.refused > 0, "the service never tried the database during the cut"
    await asyncio.sleep(max(0.0, cut_at + CUT_SECONDS - time.monotonic()))
    db_proxy.heal()

    record = await saved(direct_db, session_id, "COMPLETED")
    assert (record.round, record.message_id) == (2, message_id)
    assert set(runtime.answers) <= {202, 503}
    assert (await readiness(harness, service))[0] == 200
    requests = dict(harness.sandbox.state.requests)
    # Nothing changed after the cut (the request counts tell which API wrote the card if something did).
    assert harness.sandbox.state.messages[message_id].card == final, requests
    assert "patch" not in requests  # a CardKit card is never PATCHed

    await harness.stop(service, signal.SIGKILL)  # no shutdown flush: only what was saved survives
    restarted = await harness.start()
    async with harness.http.get(
        f"{restarted.base_url}/v1/tasks/{session_id}", headers=harness.headers()
    ) as response:
        assert response.status == 200
        rebuilt = await response.json()
    assert (rebuilt["status"], rebuilt["round"], rebuilt["message_id"]) == ("COMPLETED", 2, message_id)
    # The API's card is the built card; the message shows it as a card entity, with its streaming switch.
    assert rebuilt["card"] == without_streaming_config(final)
    assert len(harness.sandbox.state.messages) == 1
    assert await harness.stop(restarted) == 0
