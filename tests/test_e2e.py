"""End-to-end: the service as a user runs it — a subprocess — over HTTP, against the sandbox and MariaDB.

These tests wait on real time (a real process, real sockets); they are few and bounded.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import sys
import time
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import Any

import aiohttp
import pytest

from feishu_progress.sandbox.clicks import card_action_payload, signed_request
from feishu_progress.sandbox.server import RunningSandbox, run_sandbox
from feishu_progress.sandbox.state import SandboxConfig
from tests.conftest import fresh_mysql_database

pytestmark = [pytest.mark.mysql, pytest.mark.slow]

APP_ID, APP_SECRET = "cli_e2e", "e2e-secret"
ENCRYPT_KEY, VERIFICATION_TOKEN, API_TOKEN = "e2e-encrypt-key", "e2e-verification", "e2e-api-token"
REQUESTER, CHAT = "ou_requester", "oc_e2e"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@pytest.fixture(scope="module")
def e2e_database_url() -> str:
    """A MariaDB database of its own, created fresh; skipped without MySQL unless CI=true."""
    return fresh_mysql_database("e2e")


@dataclass
class Service:
    process: asyncio.subprocess.Process
    base_url: str
    admin_url: str


class Harness:
    """Starts the service process, and plays runtime and user against it."""

    def __init__(self, database_url: str, sandbox: RunningSandbox, http: aiohttp.ClientSession) -> None:
        self.database_url = database_url
        self.sandbox = sandbox
        self.http = http
        self.port = _free_port()
        self.admin_port = _free_port()

    def env(self, **extra: str) -> dict[str, str]:
        env = {key: value for key, value in os.environ.items() if not key.startswith("FP_")}
        env.update(
            FP_DATABASE_URL=self.database_url,
            FP_FEISHU__BASE_URL=self.sandbox.base_url,
            FP_FEISHU__APP_ID=APP_ID,
            FP_FEISHU__APP_SECRET=APP_SECRET,
            FP_FEISHU__ENCRYPT_KEY=ENCRYPT_KEY,
            FP_FEISHU__VERIFICATION_TOKEN=VERIFICATION_TOKEN,
            FP_API__TOKEN=API_TOKEN,
            FP_HTTP__HOST="127.0.0.1",
            FP_HTTP__PORT=str(self.port),
            FP_ADMIN__PORT=str(self.admin_port),
            FP_LOG_LEVEL="WARNING",
        )
        env.update(extra)
        return env

    async def migrate(self) -> None:
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "feishu_progress",
            "migrate",
            env=self.env(),
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
        )
        output, _ = await asyncio.wait_for(process.communicate(), 60)
        assert process.returncode == 0, output.decode()

    async def start(self, **extra: str) -> Service:
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "feishu_progress",
            "serve",
            env=self.env(**extra),
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.PIPE,
        )
        service = Service(process, f"http://127.0.0.1:{self.port}", f"http://127.0.0.1:{self.admin_port}")
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if process.returncode is not None:
                err = await process.stderr.read() if process.stderr else b""
                raise AssertionError(f"service exited {process.returncode}: {err.decode()[-2000:]}")
            try:
                async with self.http.get(f"{service.admin_url}/readyz") as response:
                    if response.status == 200:
                        return service
            except aiohttp.ClientError:
                pass
            await asyncio.sleep(0.1)
        raise AssertionError("service did not become ready in 30 s")

    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {API_TOKEN}"}

    async def create_task(self, service: Service, title: str) -> tuple[int, str]:
        body = {
            "receive_id": CHAT,
            "receive_id_type": "chat_id",
            "requester_open_id": REQUESTER,
            "title": title,
        }
        async with self.http.post(
            f"{service.base_url}/v1/tasks", json=body, headers=self.headers()
        ) as response:
            assert response.status == 201, await response.text()
            data = await response.json()
        return data["session_id"], data["message_id"]

    async def events(self, service: Service, session_id: int, *events: Mapping[str, Any]) -> int:
        url = f"{service.base_url}/v1/tasks/{session_id}/events"
        async with self.http.post(url, json={"events": list(events)}, headers=self.headers()) as response:
            return response.status

    async def click(
        self,
        service: Service,
        message_id: str,
        operator: str,
        value: Mapping[str, Any],
        *,
        form: Mapping[str, Any] | None = None,
        click_token: str | None = None,
    ) -> dict[str, Any]:
        payload = card_action_payload(
            open_id=operator,
            message_id=message_id,
            chat_id=CHAT,
            value=value,
            form_value=form,
            verification_token=VERIFICATION_TOKEN,
            now=time.time(),
            click_token=click_token,
        )
        body, headers = signed_request(payload, encrypt_key=ENCRYPT_KEY, now=time.time())
        async with self.http.post(
            f"{service.base_url}/feishu/callback", data=body, headers=headers
        ) as response:
            assert response.status == 200, await response.text()
            reply: dict[str, Any] = await response.json()
            return reply

    async def actions(
        self, service: Service, session_id: int, after: int = 0, wait: float = 5
    ) -> dict[str, Any]:
        url = f"{service.base_url}/v1/tasks/{session_id}/actions"
        params = {"after": str(after), "wait": str(wait)}
        async with self.http.get(url, params=params, headers=self.headers()) as response:
            assert response.status == 200
            data: dict[str, Any] = await response.json()
            return data

    async def card_status(self, message_id: str, expected: str, timeout: float = 10) -> dict[str, Any]:
        """Wait until the sandbox's latest card for ``message_id`` carries the state word ``expected``."""
        deadline = time.monotonic() + timeout
        card: dict[str, Any] = {}
        while time.monotonic() < deadline:
            card = self.sandbox.state.messages[message_id].card
            if _state_word(card) == expected:
                return card
            await asyncio.sleep(0.05)
        raise AssertionError(f"card state is {_state_word(card)!r}, expected {expected!r}")

    @staticmethod
    async def stop(service: Service, sig: int = signal.SIGTERM) -> int:
        if service.process.returncode is None:
            service.process.send_signal(sig)
        return await asyncio.wait_for(service.process.wait(), 40)


def _state_word(card: Mapping[str, Any]) -> str:
    tags = card.get("header", {}).get("text_tag_list", [])
    return str(tags[0]["text"]["content"]) if tags else ""


def _card_text(card: Mapping[str, Any]) -> str:
    from feishu_progress.cards.plaintext import card_as_text

    return card_as_text(card)


@pytest.fixture
async def harness(e2e_database_url: str) -> AsyncIterator[Harness]:
    config = SandboxConfig(app_id=APP_ID, app_secret=APP_SECRET)
    async with run_sandbox(config) as sandbox, aiohttp.ClientSession() as http:
        harness = Harness(e2e_database_url, sandbox, http)
        await harness.migrate()
        yield harness


async def test_full_task_with_subagents_failures_and_answered_question(harness: Harness) -> None:
    service = await harness.start()
    try:
        session_id, message_id = await harness.create_task(service, "端到端任务")
        assert (
            await harness.events(
                service,
                session_id,
                {"type": "status", "status": "RUNNING", "round": 1},
                {
                    "type": "subagent_started",
                    "task_id": 1,
                    "child_session_id": 501,
                    "agent_type": "explorer",
                    "title": "后台子代理(explorer): 查资料",
                    "invocation_type": "BACKGROUND",
                },
                {"type": "subagent_started", "task_id": 2, "agent_type": "worker", "title": "写代码"},
                {"type": "subagent_round", "task_id": 1, "round": 3},
                {"type": "tool_started", "call_id": "t1", "name": "shell", "args": {"command": "make test"}},
                {"type": "tool_finished", "call_id": "t1", "result": {"error": "命令被拒绝执行策略"}},
            )
            == 202
        )
        card = await harness.card_status(message_id, "正在处理")
        deadline = time.monotonic() + 5
        while "子代理 · 2 个运行中" not in _card_text(card) and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
            card = harness.sandbox.state.messages[message_id].card
        text = _card_text(card)
        assert "子代理 · 2 个运行中" in text
        assert "调研 · 查资料 · 第 3 轮" in text
        assert "(失败: 命令被拒绝执行策略)" in text

        await harness.events(
            service,
            session_id,
            {
                "type": "ask",
                "ask_id": "a1",
                "questions": [{"question": "继续吗?", "options": ["继续", "停止"]}],
            },
        )
        await harness.card_status(message_id, "等待回复")
        value = {"v": 1, "action": "answers", "session_id": session_id, "ask_id": "a1"}
        refused = await harness.click(service, message_id, "ou_stranger", value, form={"q0_0": "0"})
        assert refused["toast"]["type"] == "error"
        accepted = await harness.click(
            service, message_id, REQUESTER, value, form={"q0_0": "0"}, click_token="tok-1"
        )
        assert accepted["toast"]["type"] == "success"
        # Feishu redelivers the same click: answered once.
        await harness.click(service, message_id, REQUESTER, value, form={"q0_0": "0"}, click_token="tok-1")
        log = await harness.actions(service, session_id)
        assert [action["kind"] for action in log["actions"]] == ["answers"]
        assert log["actions"][0]["payload"]["answers"][0]["selected_labels"] == ["继续"]

        await harness.events(
            service,
            session_id,
            {"type": "status", "status": "RUNNING", "round": 2},
            {"type": "subagent_finished", "task_id": 1, "status": "COMPLETED", "total_rounds": 3},
            {"type": "subagent_finished", "task_id": 2, "status": "COMPLETED", "total_rounds": 1},
            {"type": "finished", "status": "COMPLETED", "content": "全部完成"},
        )
        final = await harness.card_status(message_id, "已完成")
        assert "子代理" not in _card_text(final).split("本轮工具")[0]
        assert await harness.events(service, session_id, {"type": "content", "text": "late"}) == 409
        assert harness.sandbox.state.responses.get(230020, 0) == 0
        assert harness.sandbox.state.responses.get(99991400, 0) == 0
    finally:
        assert await harness.stop(service) == 0


async def test_restart_after_kill_reattaches_the_same_card(harness: Harness) -> None:
    service = await harness.start()
    session_id, message_id = await harness.create_task(service, "会被杀掉的任务")
    await harness.events(
        service,
        session_id,
        {"type": "status", "status": "RUNNING", "round": 4},
        {"type": "content", "text": "第一段"},
    )
    await harness.card_status(message_id, "正在处理")
    await asyncio.sleep(1.5)  # rounds and text are saved at most once a second (runtime/service.py)
    await harness.stop(service, signal.SIGKILL)

    service = await harness.start()
    try:
        assert await harness.events(service, session_id, {"type": "content", "text": "重启之后的内容"}) == 202
        deadline = time.monotonic() + 10
        while "重启之后的内容" not in _card_text(harness.sandbox.state.messages[message_id].card):
            assert time.monotonic() < deadline, "the restarted service never PATCHed the same message"
            await asyncio.sleep(0.05)
        await harness.events(service, session_id, {"type": "finished", "status": "COMPLETED"})
        final = await harness.card_status(message_id, "已完成")
        assert "第 4 轮" in _card_text(final)
        assert len(harness.sandbox.state.messages) == 1  # no second card was sent
    finally:
        assert await harness.stop(service) == 0


async def test_a_runtime_that_goes_silent_is_closed_as_lost(harness: Harness) -> None:
    service = await harness.start(FP_TASK__STALE_AFTER="2")
    try:
        session_id, message_id = await harness.create_task(service, "沉默的任务")
        await harness.events(service, session_id, {"type": "status", "status": "RUNNING", "round": 1})
        await harness.card_status(message_id, "失去联系", timeout=15)
        assert await harness.events(service, session_id, {"type": "content", "text": "too late"}) == 409
    finally:
        assert await harness.stop(service) == 0


async def test_sigterm_flushes_the_final_state(harness: Harness) -> None:
    service = await harness.start()
    session_id, message_id = await harness.create_task(service, "优雅退出")
    await harness.events(
        service,
        session_id,
        {"type": "status", "status": "RUNNING", "round": 1},
        {"type": "content", "text": "x"},
    )
    await harness.events(service, session_id, {"type": "finished", "status": "FAILED", "error": "boom"})
    assert await harness.stop(service) == 0  # SIGTERM straight after the final event
    assert _state_word(harness.sandbox.state.messages[message_id].card) == "失败"
