"""The LangGraph adapter: real ``langgraph`` and ``langchain-core``, a scripted chat model that emits tool
calls (no network, no key), against ``feishu-progress serve`` in sandbox mode; the user clicks on the
sandbox through its signed-click endpoint.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

import aiohttp
import pytest
from langchain_core.callbacks import CallbackManagerForLLMRun
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.tools import tool
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode, tools_condition
from langgraph.types import interrupt

from feishu_progress.adapters import open_card
from feishu_progress.adapters.langgraph import _questions, _resume_value, run_on_card
from feishu_progress.adapters.sandbox_user import SandboxUser, buttons, first_choices
from feishu_progress.client import FeishuProgressClient
from feishu_progress.runtime.responses import Answer, AnswersPayload
from tests.adapter_service import CHAT, REQUESTER, SandboxService, sandbox_service, state_of, text_of

pytestmark = pytest.mark.slow
__all__ = ["sandbox_service"]
# Short long-polls: the service holds an abandoned one until its wait ends, and stopping it waits for them.
POLL = 2.0

ran: list[str] = []


class ScriptedChatModel(BaseChatModel):
    """Answers each call with the next scripted message (text and/or tool calls)."""

    script: Iterator[AIMessage]

    @property
    def _llm_type(self) -> str:
        return "scripted"

    def _generate(
        self, messages: list[BaseMessage], stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None, **kwargs: Any,
    ) -> ChatResult:  # fmt: skip
        return ChatResult(generations=[ChatGeneration(message=next(self.script))])


@tool
def lookup(city: str) -> str:
    """The weather in a city."""
    ran.append(f"lookup:{city}")
    return f"sunny in {city}"


@tool
def explode(reason: str) -> str:
    """Always fails."""
    raise RuntimeError(f"disk full: {reason}")


@tool
def deploy(env: str) -> str:
    """Deploy, after the user's approval."""
    decision = interrupt({"type": "approval", "tool_name": "deploy", "summary": f"deploy to {env}"})
    if not decision["approved"]:
        return f"not deployed: {decision['reason']}"
    ran.append(f"deploy:{env}")
    return f"deployed to {env}"


@tool
def ask_format() -> str:
    """Ask the user which format to use."""
    answer = interrupt({"question": "Which format?", "options": ["Markdown", "PDF"]})
    ran.append(f"format:{answer}")
    return f"format {answer}"


def call(name: str, args: dict[str, Any], call_id: str) -> dict[str, Any]:
    return {"name": name, "args": args, "id": call_id, "type": "tool_call"}


def tool_error(exc: Exception) -> str:
    """The tool's exception as the model (and the card) sees it."""
    return str(exc)


def agent_graph(script: list[AIMessage], tools: list[Any], name: str = "agent") -> Any:
    model = ScriptedChatModel(script=iter(script))
    graph = StateGraph(MessagesState)
    graph.add_node("model", lambda state: {"messages": [model.invoke(state["messages"])]})
    graph.add_node("tools", ToolNode(tools, handle_tool_errors=tool_error))
    graph.add_edge(START, "model")
    graph.add_conditional_edges("model", tools_condition)
    graph.add_edge("tools", "model")
    return graph


def main_script() -> list[AIMessage]:
    return [
        AIMessage("Checking first. ", tool_calls=[
            call("lookup", {"city": "Paris"}, "c1"), call("explode", {"reason": "logs"}, "c2")]),
        AIMessage("", tool_calls=[call("deploy", {"env": "prod"}, "c3")]),
        AIMessage("", tool_calls=[call("ask_format", {}, "c4")]),
        AIMessage("All done."),
    ]  # fmt: skip


@pytest.fixture
async def user(sandbox_service: SandboxService) -> AsyncIterator[SandboxUser]:
    async with aiohttp.ClientSession() as http:
        yield SandboxUser(http, sandbox_service.url, sandbox_service.token)


async def run_graph(service: SandboxService, graph: Any, play: Any, **card: Any) -> tuple[Any, str]:
    config = {"configurable": {"thread_id": uuid.uuid4().hex}}
    async with (
        FeishuProgressClient(service.url, service.token) as fp,
        open_card(
            fp,
            receive_id=CHAT,
            requester_open_id=REQUESTER,
            title="graph",
            idempotency_key=f"lg-{uuid.uuid4()}",
            poll_wait=POLL,
            **card,
        ) as session,  # fmt: skip
    ):
        assert session.message_id is not None
        clicking = asyncio.create_task(play(session.message_id))
        final = await asyncio.wait_for(
            run_on_card(session, graph, {"messages": [("user", "go")]}, config), 60
        )
        await asyncio.wait_for(clicking, 30)
    return final, session.message_id


async def test_interrupts_become_the_approval_and_the_form_and_clicks_resume_the_graph(
    sandbox_service: SandboxService, user: SandboxUser
) -> None:
    ran.clear()
    tools = [lookup, explode, deploy, ask_format]
    graph = agent_graph(main_script(), tools).compile(checkpointer=InMemorySaver())

    async def play(message_id: str) -> None:
        card = await user.wait_for(message_id, lambda card: bool(buttons(card, "approve")))
        assert "deploy to prod" in text_of(card) and "disk full: logs" in text_of(card), text_of(card)
        await user.press(message_id, "approve")
        card = await user.wait_for(message_id, lambda card: first_choices(card) is not None)
        assert "Which format?" in text_of(card)
        await user.answer_first_choices(message_id)

    final, message_id = await run_graph(sandbox_service, graph, play)
    assert ran == ["lookup:Paris", "deploy:prod", "format:Markdown"]
    assert final.values["messages"][-1].content == "All done."
    card = await user.wait_for(message_id, lambda card: state_of(card) == "已完成")
    assert "Checking first." in text_of(card) and "All done." in text_of(card)


async def test_a_deny_click_and_a_timeout_resume_the_graph_unapproved(
    sandbox_service: SandboxService, user: SandboxUser
) -> None:
    ran.clear()
    script = [
        AIMessage("", tool_calls=[call("deploy", {"env": "prod"}, "d1")]),
        AIMessage("", tool_calls=[call("deploy", {"env": "staging"}, "d2")]),
        AIMessage("Stopped."),
    ]
    graph = agent_graph(script, [deploy]).compile(checkpointer=InMemorySaver())

    async def deny_once(message_id: str) -> None:
        await user.press(message_id, "deny")  # the second approval is left to time out

    final, message_id = await run_graph(sandbox_service, graph, deny_once, approval_timeout=1.0)
    assert ran == []
    results = [m.content for m in final.values["messages"] if m.type == "tool"]
    assert results == ["not deployed: 已被拒绝", "not deployed: 审批超时(1 分钟),已自动拒绝"]
    card = await user.wait_for(message_id, lambda card: state_of(card) == "已完成")
    assert "Stopped." in text_of(card)


async def test_allow_always_resumes_later_approvals_of_the_tool_without_a_click(
    sandbox_service: SandboxService, user: SandboxUser
) -> None:
    ran.clear()
    script = [
        AIMessage("", tool_calls=[call("deploy", {"env": "staging"}, "a1")]),
        AIMessage("", tool_calls=[call("deploy", {"env": "prod"}, "a2")]),
        AIMessage("Both deployed."),
    ]
    graph = agent_graph(script, [deploy]).compile(checkpointer=InMemorySaver())

    async def allow_always_once(message_id: str) -> None:
        answer = await user.press(message_id, "approve_always")
        assert answer["toast"]["type"] == "success"

    # One click only: a second approval on the card would be denied by the timeout.
    final, message_id = await run_graph(sandbox_service, graph, allow_always_once, approval_timeout=5.0)
    assert ran == ["deploy:staging", "deploy:prod"]
    assert final.values["messages"][-1].content == "Both deployed."
    card = await user.wait_for(message_id, lambda card: state_of(card) == "已完成")
    assert "审批超时" not in text_of(card) and "已被拒绝" not in text_of(card)


@tool
def deploy_prod(env: str) -> str:
    """Production: asked every time (no 始终允许), even once deploy was allowed always."""
    value = {"type": "approval", "tool_name": "deploy", "summary": f"PROD {env}", "allow_always": False}
    decision = interrupt(value)
    return f"deployed to {env}" if decision["approved"] else "kept"


async def test_an_interrupt_may_withhold_allow_always_and_is_then_asked_every_time(
    sandbox_service: SandboxService, user: SandboxUser
) -> None:
    ran.clear()
    script = [
        AIMessage("", tool_calls=[call("deploy", {"env": "staging"}, "w1")]),
        AIMessage("", tool_calls=[call("deploy_prod", {"env": "eu"}, "w2")]),
        AIMessage("ok"),
    ]
    graph = agent_graph(script, [deploy, deploy_prod]).compile(checkpointer=InMemorySaver())
    offered: list[int] = []

    async def always_then_approve(message_id: str) -> None:
        await user.press(message_id, "approve_always")
        card = await user.wait_for(message_id, lambda card: "PROD eu" in text_of(card))
        offered.append(len(buttons(card, "approve_always")))
        await user.click(message_id, buttons(card, "approve")[0])

    final, _ = await run_graph(sandbox_service, graph, always_then_approve)
    assert offered == [0]  # asked again, without the button, although the user allowed "deploy" always
    assert ran == ["deploy:staging"]
    assert [m.content for m in final.values["messages"] if m.type == "tool"] == [
        "deployed to staging",
        "deployed to eu",
    ]


async def test_a_cancel_click_cancels_the_graph_run(
    sandbox_service: SandboxService, user: SandboxUser
) -> None:
    ran.clear()
    graph = agent_graph(main_script(), [lookup, explode, deploy, ask_format]).compile(
        checkpointer=InMemorySaver()
    )

    async def cancel(message_id: str) -> None:
        await user.wait_for(message_id, lambda card: bool(buttons(card, "approve")))
        await user.press(message_id, "cancel")

    final, message_id = await run_graph(sandbox_service, graph, cancel)
    assert final is None and "deploy:prod" not in ran
    await user.wait_for(message_id, lambda card: state_of(card) == "已取消")


async def test_text_blocks_are_shown_and_reasoning_blocks_are_not(
    sandbox_service: SandboxService, user: SandboxUser
) -> None:
    thought = {"type": "reasoning", "reasoning": "the user wants a haiku"}
    blocks = [thought, {"type": "text", "text": "Here is the haiku."}]
    graph = agent_graph([AIMessage(content=blocks)], []).compile(checkpointer=InMemorySaver())

    async def idle(message_id: str) -> None:
        return None

    _, message_id = await run_graph(sandbox_service, graph, idle)
    card = await user.wait_for(message_id, lambda card: state_of(card) == "已完成")
    assert "Here is the haiku." in text_of(card) and 'haiku"' not in text_of(card)
    assert "the user wants" not in text_of(card)


@tool
async def research(topic: str) -> str:
    """Slow research: the card shows the subagent meanwhile."""
    await asyncio.sleep(3)
    return f"notes on {topic}"


async def test_a_subgraph_is_a_running_subagent_with_its_rounds(
    sandbox_service: SandboxService, user: SandboxUser
) -> None:
    inner = agent_graph([AIMessage("", tool_calls=[call("research", {"topic": "cards"}, "r1")]),
                         AIMessage("notes ready")], [research]).compile()  # fmt: skip
    outer = StateGraph(MessagesState)
    outer.add_node("researcher", inner)
    outer.add_edge(START, "researcher")
    outer.add_edge("researcher", END)
    graph = outer.compile(checkpointer=InMemorySaver())
    seen: list[str] = []

    async def watch(message_id: str) -> None:
        card = await user.wait_for(message_id, lambda card: "researcher" in text_of(card))
        seen.append(text_of(card))

    await run_graph(sandbox_service, graph, watch)
    assert "子代理 · 1 个运行中" in seen[0] and "researcher · 第 1 轮" in seen[0], seen[0]


def test_interrupt_values_become_questions_and_answers_the_resume_values() -> None:
    several = {"questions": [{"question": "Which checks?", "options": ["Lint", "Types"], "multiSelect": True},
                             {"question": "Anything else?"}]}  # fmt: skip
    assert _questions(several) == [
        {"question": "Which checks?", "options": ["Lint", "Types"], "multiSelect": True},
        {"question": "Anything else?", "options": [], "multiSelect": False},
    ]
    assert _questions("Your name?") == [{"question": "Your name?", "options": []}]  # free text
    answers = AnswersPayload(ask_id="i1", answers=[
        Answer(question="Which checks?", selected_labels=["Lint", "Types"], custom_input=""),
        Answer(question="Anything else?", selected_labels=[], custom_input="the bench"),
    ])  # fmt: skip
    assert _resume_value(several, answers) == [
        {"question": "Which checks?", "selectedLabels": ["Lint", "Types"], "customInput": ""},
        {"question": "Anything else?", "selectedLabels": [], "customInput": "the bench"},
    ]
    assert _resume_value({"question": "Which checks?"}, answers) == "Lint, Types"
    typed = AnswersPayload(
        ask_id="i2", answers=[Answer(question="Your name?", selected_labels=[], custom_input="Ada")]
    )
    assert _resume_value("Your name?", typed) == "Ada"
