"""End-to-end: the service as a user runs it — a subprocess — over HTTP, against the sandbox and MariaDB.

These tests wait on real time (a real process, real sockets); they are few and bounded.
"""

from __future__ import annotations

import asyncio
import signal
from collections.abc import AsyncIterator

import aiohttp
import pytest

from feishu_progress.sandbox.server import RunningSandbox
from tests.conftest import fresh_mysql_database
from tests.rigs import eventually
from tests.service_process import REQUESTER, Harness, card_text, state_word

pytestmark = [pytest.mark.mysql, pytest.mark.slow]


@pytest.fixture(scope="module")
def e2e_database_url() -> str:
    """A MariaDB database of its own, created fresh; skipped without MySQL unless CI=true."""
    return fresh_mysql_database("e2e")


@pytest.fixture
async def harness(e2e_database_url: str, sandbox: RunningSandbox) -> AsyncIterator[Harness]:
    async with aiohttp.ClientSession() as http:
        harness = Harness(e2e_database_url, sandbox, http)
        await harness.migrate()
        try:
            yield harness
        finally:
            await harness.stop_all()


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
        # The card moves in steps (the subagent list, then its rounds, at the panel pace): wait for the whole.
        expected = ("子代理 · 2 个运行中", "调研 · 查资料 · 第 3 轮", "(失败: 命令被拒绝执行策略)")
        card = await eventually(
            lambda: harness.sandbox.state.messages[message_id].card,
            until=lambda card: all(part in card_text(card) for part in expected),
            timeout=5,
        )
        text = card_text(card)
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
        assert "子代理" not in card_text(final).split("本轮工具")[0]
        assert await harness.events(service, session_id, {"type": "content", "text": "late"}) == 409
        assert harness.sandbox.state.responses.get(230020, 0) == 0
        assert harness.sandbox.state.responses.get(99991400, 0) == 0
    finally:
        assert await harness.stop(service) == 0


@pytest.mark.faults
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
        await eventually(
            lambda: "重启之后的内容" in card_text(harness.sandbox.state.messages[message_id].card),
            timeout=10,
            what="the restarted service to PATCH the same message",
        )
        await harness.events(service, session_id, {"type": "finished", "status": "COMPLETED"})
        final = await harness.card_status(message_id, "已完成")
        assert "第 4 轮" in card_text(final)
        assert len(harness.sandbox.state.messages) == 1  # no second card was sent
        # A CardKit card (the default transport): the restarted writer's sequences began a new epoch above
        # the killed one's, so Feishu refused none of them.
        (entity,) = harness.sandbox.state.cardkit.cards.values()
        assert entity.message_id == message_id and entity.sequence is not None and entity.sequence >> 20 >= 1
        assert harness.sandbox.state.messages[message_id].responses.get(300317, 0) == 0
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
    assert state_word(harness.sandbox.state.messages[message_id].card) == "失败"
