"""The OpenAI Agents SDK adapter: the real ``openai-agents`` package, a scripted ``Model`` (the SDK's own
``agents.testing.ScriptedModel``: no network, no key), against ``feishu-progress serve`` in sandbox mode.

Each test runs an agent on a card and plays the user on the sandbox through its signed-click endpoint;
it asserts the card as the sandbox holds it and what the SDK run did with the click.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import aiohttp
import pytest
from agents import Agent, RunResultStreaming, function_tool, set_tracing_disabled
from agents.testing import ScriptedModel, assistant_message, function_call

from feishu_progress.adapters import CardSession, open_card
from feishu_progress.adapters.openai_agents import run_on_card
from feishu_progress.adapters.sandbox_user import SandboxUser, buttons
from feishu_progress.client import FeishuProgressClient
from tests.adapter_service import CHAT, REQUESTER, SandboxService, sandbox_service, state_of, text_of

pytestmark = pytest.mark.slow
__all__ = ["sandbox_service"]  # the fixture, used by name
# Short long-polls: the service holds an abandoned one until its wait ends, and stopping it waits for them.
POLL = 2.0

ran: list[str] = []


@function_tool
def lookup(city: str) -> str:
    """The weather in a city."""
    ran.append(f"lookup:{city}")
    return f"sunny in {city}"


@function_tool
def explode(reason: str) -> str:
    """A tool that always fails."""
    raise RuntimeError(f"disk full: {reason}")


@function_tool(needs_approval=True)
def deploy(env: str) -> str:
    """Deploy (asks first)."""
    ran.append(f"deploy:{env}")
    return f"deployed to {env}"


def agent_with(steps: list[Any], **extra: Any) -> Agent[Any]:
    return Agent(name="Ops", instructions="help", model=ScriptedModel(steps), tools=[lookup, explode, deploy],
                 **extra)  # fmt: skip


def deploy_script() -> list[Any]:
    return [
        [
            assistant_message("Checking first. "),
            function_call("lookup", {"city": "Paris"}, call_id="c1"),
            function_call("explode", {"reason": "logs"}, call_id="c2"),
            function_call("deploy", {"env": "prod"}, call_id="c3"),
        ],
        [assistant_message("All done.")],
    ]


set_tracing_disabled(True)  # no trace export: there is no key, and nothing leaves the machine


@pytest.fixture
async def user(sandbox_service: SandboxService) -> AsyncIterator[SandboxUser]:
    async with aiohttp.ClientSession() as http:
        yield SandboxUser(http, sandbox_service.url, sandbox_service.token)


@asynccontextmanager
async def on_card(service: SandboxService, **card: Any) -> AsyncIterator[CardSession]:
    async with (
        FeishuProgressClient(service.url, service.token) as fp,
        open_card(
            fp,
            receive_id=CHAT,
            requester_open_id=REQUESTER,
            title="ops",
            idempotency_key=f"oa-{uuid.uuid4()}",
            poll_wait=POLL,
            **card,
        ) as session,  # fmt: skip
    ):
        yield session


async def run_while(
    session: CardSession, agent: Agent[Any], user: Callable[[str], Any]
) -> RunResultStreaming:
    assert session.message_id is not None
    clicking = asyncio.create_task(user(session.message_id))
    result = await asyncio.wait_for(run_on_card(session, agent, "deploy please"), 60)
    await asyncio.wait_for(clicking, 30)
    return result


async def test_an_approve_click_runs_the_tool_and_the_card_shows_text_tools_and_failure(
    sandbox_service: SandboxService, user: SandboxUser
) -> None:
    ran.clear()
    async with on_card(sandbox_service) as session:

        async def approve(message_id: str) -> None:
            card = await user.wait_for(message_id, lambda card: bool(buttons(card, "approve")))
            assert state_of(card) == "等待回复" and "deploy" in text_of(card), text_of(card)
            refused = await user.click(message_id, buttons(card, "approve")[0], operator="ou_stranger")
            assert refused["toast"]["type"] == "error"  # only the requester decides
            await asyncio.sleep(0.5)
            assert "deploy:prod" not in ran
            await user.press(message_id, "approve")

        result = await run_while(session, agent_with(deploy_script()), approve)
    assert result.final_output == "All done."
    assert ran == ["lookup:Paris", "deploy:prod"]
    card = await user.wait_for(session.message_id or "", lambda card: state_of(card) == "已完成")
    text = text_of(card)
    assert "Checking first." in text and "All done." in text
    assert "disk full: logs" in text  # the failing tool's line names the exception
    assert "deploy" in text and "lookup" in text


async def test_allow_always_approves_the_tool_for_the_rest_of_the_run(
    sandbox_service: SandboxService, user: SandboxUser
) -> None:
    ran.clear()
    script = [
        [function_call("deploy", {"env": "staging"}, call_id="d1")],
        [function_call("deploy", {"env": "prod"}, call_id="d2")],
        [assistant_message("Both deployed.")],
    ]
    # One click only: a second approval on the card would be denied by the timeout.
    async with on_card(sandbox_service, approval_timeout=5.0) as session:
        asked: list[list[str]] = []
        decide = session.decide

        async def counted(approvals: Any) -> Any:
            asked.append([approval.tool_name for approval in approvals])
            return await decide(approvals)

        session.decide = counted  # type: ignore[method-assign]

        async def allow_always(message_id: str) -> None:
            answer = await user.press(message_id, "approve_always")
            assert answer["toast"]["type"] == "success"

        result = await run_while(session, agent_with(script), allow_always)
    assert result.final_output == "Both deployed."
    assert ran == ["deploy:staging", "deploy:prod"]
    assert asked == [["deploy"]]  # the SDK kept the rule (always_approve): the second call did not interrupt
    card = await user.wait_for(session.message_id or "", lambda card: state_of(card) == "已完成")
    assert "审批超时" not in text_of(card) and "已被拒绝" not in text_of(card)


async def test_allow_always_on_one_of_two_waiting_calls_of_a_tool_approves_both(
    sandbox_service: SandboxService, user: SandboxUser
) -> None:
    ran.clear()
    both = [
        function_call("deploy", {"env": "eu"}, call_id="p1"),
        function_call("deploy", {"env": "us"}, call_id="p2"),
    ]
    script = [both, [assistant_message("Both regions.")]]
    async with on_card(sandbox_service, approval_timeout=5.0) as session:

        async def allow_always_on_the_first(message_id: str) -> None:
            card = await user.wait_for(message_id, lambda card: len(buttons(card, "approve_always")) == 2)
            await user.click(message_id, buttons(card, "approve_always")[0])

        result = await run_while(session, agent_with(script), allow_always_on_the_first)
    assert result.final_output == "Both regions."
    assert sorted(ran) == ["deploy:eu", "deploy:us"]


async def test_a_deny_click_rejects_the_call_and_the_model_is_told(
    sandbox_service: SandboxService, user: SandboxUser
) -> None:
    ran.clear()
    model_steps = deploy_script()
    agent = agent_with(model_steps)
    async with on_card(sandbox_service) as session:
        result = await run_while(session, agent, lambda message_id: user.press(message_id, "deny"))
    assert "deploy:prod" not in ran
    assert result.final_output == "All done."
    model = agent.model
    assert isinstance(model, ScriptedModel) and model.last_call is not None
    assert "did not approve" in str(model.last_call.input)
    card = await user.wait_for(session.message_id or "", lambda card: state_of(card) == "已完成")
    assert "已被拒绝" in text_of(card)


async def test_no_decision_within_the_timeout_denies_and_says_so(
    sandbox_service: SandboxService, user: SandboxUser
) -> None:
    ran.clear()
    async with on_card(sandbox_service, approval_timeout=1.0) as session:

        async def wait_only(message_id: str) -> None:
            await user.wait_for(message_id, lambda card: bool(buttons(card, "approve")))

        result = await run_while(session, agent_with(deploy_script()), wait_only)
    assert "deploy:prod" not in ran and result.final_output == "All done."
    card = await user.wait_for(session.message_id or "", lambda card: state_of(card) == "已完成")
    assert "审批超时(1 分钟),已自动拒绝" in text_of(card)
    assert not buttons(card, "approve")


async def test_a_cancel_click_cancels_the_run_and_the_card_ends_cancelled(
    sandbox_service: SandboxService, user: SandboxUser
) -> None:
    ran.clear()
    async with on_card(sandbox_service) as session:

        async def cancel(message_id: str) -> None:
            await user.wait_for(message_id, lambda card: bool(buttons(card, "approve")))
            await user.press(message_id, "cancel")

        result = await run_while(session, agent_with(deploy_script()), cancel)
    assert "deploy:prod" not in ran and result.final_output is None
    card = await user.wait_for(session.message_id or "", lambda card: state_of(card) == "已取消")
    assert not buttons(card, "approve")


@function_tool
async def research(topic: str) -> str:
    """Slow research (the card shows the subagent meanwhile)."""
    await asyncio.sleep(3)
    return f"notes on {topic}"


async def test_a_handoff_is_a_running_subagent_with_its_rounds(
    sandbox_service: SandboxService, user: SandboxUser
) -> None:
    writer = Agent(name="Writer", instructions="write", tools=[research],
                   model=ScriptedModel([[function_call("research", {"topic": "cards"}, call_id="w1")],
                                        [assistant_message("Report written.")]]))  # fmt: skip
    handing_off = ScriptedModel([[function_call("transfer_to_writer", {}, call_id="h1")]])
    triage = Agent(name="Triage", instructions="route", handoffs=[writer], model=handing_off)
    async with on_card(sandbox_service) as session:
        seen: list[str] = []

        async def watch(message_id: str) -> None:
            card = await user.wait_for(message_id, lambda card: "Writer" in text_of(card), timeout=30)
            seen.append(text_of(card))

        result = await run_while(session, triage, watch)
    assert result.final_output == "Report written."
    assert "子代理 · 1 个运行中" in seen[0] and "Writer · 第 1 轮" in seen[0], seen[0]
    card = await user.wait_for(session.message_id or "", lambda card: state_of(card) == "已完成")
    assert "Report written." in text_of(card) and "子代理" not in text_of(card)


async def test_an_agent_used_as_a_tool_is_a_subagent_while_it_runs(
    sandbox_service: SandboxService, user: SandboxUser
) -> None:
    researcher = Agent(name="Researcher", instructions="research", tools=[research],
                       model=ScriptedModel([[function_call("research", {"topic": "rates"}, call_id="r1")],
                                            [assistant_message("rates are 5/s")]]))  # fmt: skip
    as_tool = researcher.as_tool(tool_name="ask_researcher", tool_description="research a topic")
    script = [
        [function_call("ask_researcher", {"input": "rates"}, call_id="a1")],
        [assistant_message("Noted.")],
    ]
    lead = Agent(name="Lead", instructions="lead", tools=[as_tool], model=ScriptedModel(script))
    seen: list[str] = []
    async with on_card(sandbox_service) as session:

        async def watch(message_id: str) -> None:
            card = await user.wait_for(message_id, lambda card: "Researcher" in text_of(card), timeout=30)
            seen.append(text_of(card))

        result = await run_while(session, lead, watch)
    assert result.final_output == "Noted."
    assert "子代理 · 1 个运行中" in seen[0] and "ask_researcher" in seen[0], seen[0]
    card = await user.wait_for(session.message_id or "", lambda card: state_of(card) == "已完成")
    assert "rates are 5/s" in text_of(card)  # the subagent's answer is the tool's result
