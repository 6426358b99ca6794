"""The Claude Agent SDK adapter: the real ``claude-agent-sdk`` over a scripted ``Transport`` that speaks
Claude Code's stream-json control protocol (tests/claude_script.py: no CLI, no network, no key), against
``feishu-progress serve`` in sandbox mode; the user clicks on the sandbox through its signed-click path.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import aiohttp
import pytest
from claude_agent_sdk import ResultMessage

from feishu_progress.adapters import open_card
from feishu_progress.adapters.claude import run_on_card
from feishu_progress.adapters.sandbox_user import SandboxUser, buttons, first_choices
from feishu_progress.client import FeishuProgressClient
from tests.adapter_service import CHAT, REQUESTER, SandboxService, sandbox_service, state_of, text_of
from tests.claude_script import ScriptedClaude

pytestmark = pytest.mark.slow
__all__ = ["sandbox_service"]
# Short long-polls: the service holds an abandoned one until its wait ends, and stopping it waits for them.
POLL = 2.0


@pytest.fixture
async def user(sandbox_service: SandboxService) -> AsyncIterator[SandboxUser]:
    async with aiohttp.ClientSession() as http:
        yield SandboxUser(http, sandbox_service.url, sandbox_service.token)


async def run_claude(
    service: SandboxService, claude: ScriptedClaude, play: Callable[[str], Awaitable[Any]], **card: Any
) -> tuple[ResultMessage | None, str]:
    async with (
        FeishuProgressClient(service.url, service.token) as fp,
        open_card(
            fp,
            receive_id=CHAT,
            requester_open_id=REQUESTER,
            title="claude",
            idempotency_key=f"cl-{uuid.uuid4()}",
            poll_wait=POLL,
            **card,
        ) as session,  # fmt: skip
    ):
        assert session.message_id is not None
        clicking = asyncio.create_task(play(session.message_id))
        result = await asyncio.wait_for(run_on_card(session, "fix the tests", transport=claude), 60)
        await asyncio.wait_for(clicking, 30)
    return result, session.message_id


async def test_can_use_tool_and_ask_user_question_are_answered_on_the_card(
    sandbox_service: SandboxService, user: SandboxUser
) -> None:
    claude = ScriptedClaude()
    seen: dict[str, str] = {}

    async def play(message_id: str) -> None:
        card = await user.wait_for(message_id, lambda card: bool(buttons(card, "approve")))
        seen["approval"] = text_of(card)
        await user.press(message_id, "approve")
        card = await user.wait_for(message_id, lambda card: first_choices(card) is not None)
        seen["form"] = text_of(card)
        await user.answer_first_choices(message_id)
        card = await user.wait_for(message_id, lambda card: "Investigate the failures" in text_of(card))
        seen["subagent"] = text_of(card)

    result, message_id = await run_claude(sandbox_service, claude, play)
    assert result is not None and not result.is_error
    assert "pytest -q" in seen["approval"] and state_of_text(seen["approval"]) == "等待回复"
    assert "Which format?" in seen["form"] and "Markdown" in seen["form"]
    assert "子代理 · 1 个运行中" in seen["subagent"], seen["subagent"]
    assert claude.permission_answers[0]["behavior"] == "allow"
    # AskUserQuestion's answers in the shape Claude Code reads: {question: label}, on the input.
    assert claude.permission_answers[1]["updatedInput"]["answers"] == {"Which format?": "Markdown"}
    assert claude.permission_answers[1]["updatedInput"]["questions"][0]["question"] == "Which format?"
    card = await user.wait_for(message_id, lambda card: state_of(card) == "已完成")
    text = text_of(card)
    assert "Let me run the tests." in text and "All done." in text
    assert "File does not exist." in text  # the failed Read's reason


def state_of_text(text: str) -> str:
    return text.split("[", 1)[1].split("]", 1)[0]


async def test_a_deny_click_denies_the_tool_and_a_timeout_leaves_the_question_unanswered(
    sandbox_service: SandboxService, user: SandboxUser
) -> None:
    claude = ScriptedClaude()

    async def deny(message_id: str) -> None:
        await user.press(message_id, "deny")  # the question that follows is left to time out

    result, message_id = await run_claude(sandbox_service, claude, deny, approval_timeout=1.0)
    assert result is not None
    denied, unanswered = claude.permission_answers
    assert denied == {"behavior": "deny", "message": "The user did not approve this call: 已被拒绝"}
    assert unanswered["behavior"] == "deny"
    card = await user.wait_for(message_id, lambda card: state_of(card) == "已完成")
    assert "已被拒绝" in text_of(card)


async def test_a_cancel_click_interrupts_claude_and_the_card_ends_cancelled(
    sandbox_service: SandboxService, user: SandboxUser
) -> None:
    claude = ScriptedClaude()

    async def cancel(message_id: str) -> None:
        await user.wait_for(message_id, lambda card: bool(buttons(card, "approve")))
        await user.press(message_id, "cancel")

    result, message_id = await run_claude(sandbox_service, claude, cancel)
    assert claude.interrupted.is_set()
    assert result is not None and result.is_error
    await user.wait_for(message_id, lambda card: state_of(card) == "已取消")


async def test_streamed_text_deltas_are_shown_once(
    sandbox_service: SandboxService, user: SandboxUser
) -> None:
    claude = ScriptedClaude(partial=True)

    async def answer(message_id: str) -> None:
        await user.press(message_id, "approve")
        await user.answer_first_choices(message_id)

    result, message_id = await run_claude(sandbox_service, claude, answer)
    assert result is not None and not result.is_error
    card = await user.wait_for(message_id, lambda card: state_of(card) == "已完成")
    assert text_of(card).count("Let me run the tests.") == 1, text_of(card)


async def test_parallel_permission_requests_each_wait_for_their_own_click(
    sandbox_service: SandboxService, user: SandboxUser
) -> None:
    claude = ScriptedClaude(parallel=True)
    left: list[int] = []

    async def approve_one_by_one(message_id: str) -> None:
        card = await user.wait_for(message_id, lambda card: len(buttons(card, "approve")) == 2)
        await user.click(message_id, buttons(card, "approve")[0])
        await asyncio.sleep(1.0)  # the other request still waits: its buttons stay on the card
        card = await user.card(message_id)
        left.append(len(buttons(card, "approve")))
        await user.click(message_id, buttons(card, "approve")[0])

    result, _ = await run_claude(sandbox_service, claude, approve_one_by_one)
    assert left == [1]
    assert result is not None and [a["behavior"] for a in claude.permission_answers] == ["allow", "allow"]


SESSION_RULE = {
    "type": "addRules",
    "destination": "session",
    "rules": [{"toolName": "Bash"}],
    "behavior": "allow",
}


@pytest.mark.parametrize("keep_rules", [True, False], ids=["cli-keeps-the-rule", "cli-asks-again"])
async def test_allow_always_adds_a_session_rule_and_the_next_call_needs_no_click(
    sandbox_service: SandboxService, user: SandboxUser, keep_rules: bool
) -> None:
    claude = ScriptedClaude(repeat=True, keep_rules=keep_rules)
    offered: list[str] = []

    async def allow_always_once(message_id: str) -> None:
        card = await user.wait_for(message_id, lambda card: bool(buttons(card, "approve_always")))
        offered.append(text_of(card))
        answer = await user.click(message_id, buttons(card, "approve_always")[0])
        assert answer["toast"]["content"] == "已同意,本任务内此工具不再询问"

    # One click only: a second approval on the card would be denied by the timeout.
    result, message_id = await run_claude(sandbox_service, claude, allow_always_once, approval_timeout=5.0)
    assert result is not None and not result.is_error
    assert "始终允许(本任务)" in offered[0]
    first = claude.permission_answers[0]
    assert first["behavior"] == "allow" and first["updatedPermissions"] == [SESSION_RULE]
    if keep_rules:  # Claude Code runs the tool under the rule: no second request
        assert len(claude.permission_answers) == 1
    else:  # asked again: the card session answers from the rule it keeps, without a card approval
        assert [answer["behavior"] for answer in claude.permission_answers] == ["allow", "allow"]
    card = await user.wait_for(message_id, lambda card: state_of(card) == "已完成")
    text = text_of(card)
    assert "make test" in text and "失败" not in text and "审批超时" not in text, text
