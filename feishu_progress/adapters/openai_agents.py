"""The OpenAI Agents SDK (``openai-agents``) on a live card: ``pip install "feishu-progress[openai-agents]"``.

    async with FeishuProgressClient(url, token) as fp, open_card(fp, receive_id=chat,
            requester_open_id=user, title="Report") as card:
        result = await run_on_card(card, agent, "Write the report")

What becomes what (``Runner.run_streamed``'s events):

* ``response.output_text.delta`` → ``content_delta``; each model response (``response.created``) of a
  handed-off agent → that subagent's next round;
* ``tool_called`` / ``tool_output`` → the tool line with its arguments and result; a tool that raised →
  the line's failure with the exception's text (the model still gets the tool's own error message);
* a tool with ``needs_approval`` interrupts the run: each interruption → the card's approval; 同意 →
  ``RunState.approve``, 始终允许(本任务) → ``RunState.approve(item, always_approve=True)`` (the SDK
  stops asking for that tool of that agent in this run; the card session approves any other agent's
  call of a tool with the same name without asking), 拒绝 or the timeout → ``RunState.reject`` with
  the reason, then the run resumes from its state;
* ``handoff_occured`` → a running subagent titled with the new agent's name (until the next handoff or
  the end); an agent used as a tool (``Agent.as_tool``) → a subagent for the length of that call;
* 取消任务 → ``RunResultStreaming.cancel()``; the card ends CANCELLED.

Not shown: reasoning items (the runtime API has no thinking event and the card no place for it), MCP
approval requests (hosted tools decide on OpenAI's side).
"""

from __future__ import annotations

import contextvars
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from agents import Agent, Runner, RunResultStreaming, RunState
from agents.items import HandoffOutputItem, ToolApprovalItem, ToolCallItem, ToolCallOutputItem
from agents.run_context import RunContextWrapper
from agents.stream_events import RawResponsesStreamEvent, RunItemStreamEvent, StreamEvent
from agents.tool import (
    FunctionTool,
    ToolOriginType,
    resolve_function_tool_failure_error_function,
    set_function_tool_failure_error_function,
)
from agents.tool_context import ToolContext

from feishu_progress.adapters.card_session import Approval, CardSession, Decision

SUMMARY_CHARS = 2000
_WRAPPED = "_feishu_progress_failures"
_failures: contextvars.ContextVar[dict[str, str] | None] = contextvars.ContextVar(
    "feishu_progress_tool_failures", default=None
)


async def run_on_card(
    card: CardSession, agent: Agent[Any], input: str | list[Any], **run_kwargs: Any
) -> RunResultStreaming:
    """Run ``agent`` streamed, showing it on ``card``; approvals wait for the card's clicks.

    ``run_kwargs`` go to ``Runner.run_streamed`` (``context``, ``max_turns``, ``run_config``...). The
    card ends COMPLETED, CANCELLED after 取消任务, or FAILED with the run's exception (re-raised).
    """
    mapper = _Mapper(card)
    _report_failures(agent)
    _failures.set(mapper.failures)  # the tools' tasks copy this context: their errors reach this run
    result = Runner.run_streamed(agent, input, **run_kwargs)
    card.on_cancel(lambda: mapper.current.cancel() if mapper.current is not None else None)
    while True:
        mapper.current = result
        async for event in result.stream_events():
            await mapper.handle(event)
        if card.cancelled.is_set() or not result.interruptions:
            break
        state = result.to_state()
        await mapper.decide(state, result.interruptions)
        if card.cancelled.is_set():  # cancelled while the card waited: the run stays interrupted
            break
        result = Runner.run_streamed(agent, state, **run_kwargs)
    await mapper.end()
    return result


@dataclass
class _Mapper:
    """Turns one run's stream events into card events."""

    card: CardSession
    current: RunResultStreaming | None = None
    failures: dict[str, str] = field(default_factory=dict)  # call_id → why the tool raised
    denied: dict[str, str] = field(default_factory=dict)  # call_id → why it did not run
    started: set[str] = field(default_factory=set)
    agent_tools: set[str] = field(default_factory=set)  # call_ids of agents used as tools
    handoff: str | None = None  # the task_id of the agent handed off to, while it runs
    handoff_rounds: int = 0
    handoffs: int = 0

    async def handle(self, event: StreamEvent) -> None:
        if isinstance(event, RawResponsesStreamEvent):
            await self._raw(event.data)
        elif isinstance(event, RunItemStreamEvent):
            if isinstance(event.item, ToolCallItem):
                await self._tool_called(event.item)
            elif isinstance(event.item, ToolCallOutputItem):
                await self._tool_output(event.item)
            elif isinstance(event.item, HandoffOutputItem):
                await self._handed_off(event.item.target_agent.name)

    async def _raw(self, data: Any) -> None:
        kind = getattr(data, "type", "")
        if kind == "response.output_text.delta":
            await self.card.text(str(getattr(data, "delta", "")))
        elif kind == "response.created" and self.handoff is not None:
            self.handoff_rounds += 1
            await self.card.subagent_round(self.handoff, self.handoff_rounds)

    async def _tool_called(self, item: ToolCallItem) -> None:
        call_id, name, args = _call_of(item.raw_item)
        if call_id is None or call_id in self.started:
            return
        self.started.add(call_id)
        await self.card.tool_started(call_id, name, args)
        origin = item.tool_origin
        if origin is not None and origin.type is ToolOriginType.AGENT_AS_TOOL:
            self.agent_tools.add(call_id)
            title = origin.agent_name or name
            await self.card.subagent_started(call_id, title, agent_type=title, description=_text(args))

    async def _tool_output(self, item: ToolCallOutputItem) -> None:
        call_id = item.call_id
        if call_id is None:
            return
        if call_id in self.agent_tools:
            self.agent_tools.discard(call_id)
            failed = call_id in self.failures
            await self.card.subagent_finished(call_id, "FAILED" if failed else "COMPLETED", 1)
        reason = self.denied.get(call_id) or self.failures.get(call_id)
        if reason is not None:
            await self.card.tool_failed(call_id, reason)
        else:
            await self.card.tool_finished(call_id, _jsonable(item.output))

    async def _handed_off(self, agent_name: str) -> None:
        await self._end_handoff("COMPLETED")
        self.handoffs += 1
        self.handoff, self.handoff_rounds = f"handoff-{self.handoffs}", 0
        await self.card.subagent_started(self.handoff, agent_name, agent_type=agent_name[:64])

    async def _end_handoff(self, status: Any) -> None:
        if self.handoff is not None:
            await self.card.subagent_finished(self.handoff, status, self.handoff_rounds)
            self.handoff = None

    async def decide(self, state: RunState[Any], items: list[ToolApprovalItem]) -> None:
        approvals = []
        for item in items:
            call_id, name, args = _call_of(item.raw_item)
            approval_id = call_id or f"approval-{id(item)}"
            if call_id is not None and call_id not in self.started:
                self.started.add(call_id)
                await self.card.tool_started(call_id, name, args)
            approvals.append(Approval(approval_id, item.tool_name or name, _text(args)[:SUMMARY_CHARS]))
        decisions = await self.card.decide(approvals)
        for item, approval, decision in zip(items, approvals, decisions, strict=True):
            self._apply(state, item, approval.approval_id, decision)

    def _apply(self, state: RunState[Any], item: ToolApprovalItem, call_id: str, decision: Decision) -> None:
        if decision.approved:
            state.approve(item, always_approve=decision.always)
            return
        self.denied[call_id] = decision.reason
        state.reject(item, rejection_message=f"The user did not approve this call: {decision.reason}")

    async def end(self) -> None:
        status = "CANCELLED" if self.card.cancelled.is_set() else "COMPLETED"
        await self._end_handoff(status)
        for call_id in sorted(self.agent_tools):
            await self.card.subagent_finished(call_id, "CANCELLED", 0)
        self.agent_tools.clear()


def _call_of(raw: Any) -> tuple[str | None, str, dict[str, Any] | None]:
    """(call_id, name, arguments) of a tool call item, a model object or a dict."""

    def get(key: str) -> Any:
        return raw.get(key) if isinstance(raw, Mapping) else getattr(raw, key, None)

    call_id, name, arguments = get("call_id") or get("id"), get("name"), get("arguments")
    args: dict[str, Any] | None = None
    if isinstance(arguments, str) and arguments:
        try:
            parsed = json.loads(arguments)
        except ValueError:
            parsed = {"arguments": arguments}
        args = parsed if isinstance(parsed, dict) else {"arguments": parsed}
    return (str(call_id) if call_id else None), str(name or "tool"), args


def _text(args: Mapping[str, Any] | None) -> str:
    return json.dumps(args, ensure_ascii=False) if args else ""


def _jsonable(value: Any) -> Any:
    try:
        json.dumps(value)
    except (TypeError, ValueError):
        return str(value)
    return value


def _report_failures(agent: Agent[Any], seen: set[int] | None = None) -> None:
    """Have each function tool (of the agent and of the agents it hands off to) report its exception
    to the run's card too; what the model is told stays the tool's own failure message."""
    seen = set() if seen is None else seen
    if id(agent) in seen:
        return
    seen.add(id(agent))
    for tool in agent.tools:
        if isinstance(tool, FunctionTool) and not getattr(tool, _WRAPPED, False):
            original = resolve_function_tool_failure_error_function(tool)
            set_function_tool_failure_error_function(tool, _recording(original))
            setattr(tool, _WRAPPED, True)
    for handoff in agent.handoffs:
        if isinstance(handoff, Agent):
            _report_failures(handoff, seen)


def _recording(original: Any) -> Any:
    async def failure(context: RunContextWrapper[Any], error: Exception) -> str:
        failures = _failures.get()
        if failures is not None and isinstance(context, ToolContext):
            failures[context.tool_call_id] = str(error) or type(error).__name__
        if original is None:
            raise error
        message = original(context, error)
        if hasattr(message, "__await__"):
            message = await message
        return str(message)

    return failure
