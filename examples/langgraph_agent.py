"""A LangGraph agent on a live card: its text, its tool calls, and an ``interrupt()`` answered on the card.

    pip install "feishu-progress[langgraph]"               # plus langchain-openai for a real model
    feishu-progress serve                                   # sandbox mode: http://127.0.0.1:8000
    python examples/langgraph_agent.py --offline --auto-answer

With ``OPENAI_API_KEY`` set and ``langchain-openai`` installed (and no ``--offline``) a real chat model
drives the graph; ``--offline`` plays a scripted chat model that emits the same tool calls. The
``deploy`` tool calls ``interrupt({"type": "approval", ...})`` (同意 / 始终允许(本任务) / 拒绝) and the
``ask_format`` tool interrupts with a question (the card shows a form). ``--auto-answer`` approves and
picks the first option through the sandbox's signed-click endpoint. Configuration:
``FEISHU_PROGRESS_URL`` (default http://127.0.0.1:8000), ``FEISHU_PROGRESS_TOKEN`` (default FP_API__TOKEN).
"""

from __future__ import annotations

import sys
import uuid
from collections.abc import Iterator
from typing import Any

from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.tools import tool
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode, tools_condition
from langgraph.types import interrupt

from feishu_progress.adapters import CardSession
from feishu_progress.adapters.example_main import run_example
from feishu_progress.adapters.langgraph import run_on_card


@tool
def run_tests(path: str) -> str:
    """Run the test suite under ``path``."""
    return f"42 passed in {path}"


@tool
def deploy(env: str) -> str:
    """Deploy to ``env`` once the user approves."""
    decision = interrupt({"type": "approval", "tool_name": "deploy", "summary": f"deploy to {env}"})
    return f"deployed to {env}" if decision["approved"] else f"not deployed: {decision['reason']}"


@tool
def ask_format() -> str:
    """Ask the user which format the release notes should use."""
    return str(interrupt({"question": "Release notes format?", "options": ["Markdown", "Plain text"]}))


class ScriptedChatModel(BaseChatModel):
    """The offline model: answers each call with the next scripted message."""

    script: Iterator[AIMessage]

    @property
    def _llm_type(self) -> str:
        return "scripted"

    def _generate(self, messages: list[BaseMessage], stop: list[str] | None = None,
                  run_manager: Any = None, **kwargs: Any) -> ChatResult:  # fmt: skip
        return ChatResult(generations=[ChatGeneration(message=next(self.script))])

    def bind_tools(self, tools: Any, **kwargs: Any) -> Any:
        return self  # the script already names the tools


def call(name: str, args: dict[str, Any], call_id: str) -> dict[str, Any]:
    return {"name": name, "args": args, "id": call_id, "type": "tool_call"}


def scripted_model() -> ScriptedChatModel:
    return ScriptedChatModel(script=iter([
        AIMessage("Running the tests first. ", tool_calls=[call("run_tests", {"path": "tests/"}, "c1")]),
        AIMessage("", tool_calls=[call("deploy", {"env": "staging"}, "c2")]),
        AIMessage("", tool_calls=[call("ask_format", {}, "c3")]),
        AIMessage("Deployed to staging; the release notes follow."),
    ]))  # fmt: skip


def real_model() -> Any:
    from langchain_openai import ChatOpenAI  # type: ignore[import-not-found]

    return ChatOpenAI(model="gpt-4.1-mini")


def build_graph(model: Any) -> Any:
    tools = [run_tests, deploy, ask_format]
    bound = model.bind_tools(tools)
    graph = StateGraph(MessagesState)
    graph.add_node("model", lambda state: {"messages": [bound.invoke(state["messages"])]})
    graph.add_node("tools", ToolNode(tools))
    graph.add_edge(START, "model")
    graph.add_conditional_edges("model", tools_condition)
    graph.add_edge("tools", "model")
    return graph.compile(checkpointer=InMemorySaver())  # interrupts need a checkpointer to resume


async def run(card: CardSession, offline: bool) -> object:
    graph = build_graph(scripted_model() if offline else real_model())
    config = {"configurable": {"thread_id": uuid.uuid4().hex}}
    state = await run_on_card(
        card, graph, {"messages": [("user", "Test, deploy to staging, notes.")]}, config
    )
    return state.values["messages"][-1].content if state is not None else None


if __name__ == "__main__":
    sys.exit(run_example(__doc__ or "", run, title="LangGraph example", key_env="OPENAI_API_KEY"))
