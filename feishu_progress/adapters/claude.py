"""The Claude Agent SDK (``claude-agent-sdk``) on a live card: ``pip install "feishu-progress[claude]"``.

    async with FeishuProgressClient(url, token) as fp, open_card(fp, receive_id=chat,
            requester_open_id=user, title="Fix the tests") as card:
        result = await run_on_card(card, "Fix the failing tests", ClaudeAgentOptions(cwd="."))

The adapter sets ``can_use_tool`` (streaming mode, ``ClaudeSDKClient``) and maps the messages:

* ``TextBlock`` (or, with ``include_partial_messages``, each ``text_delta``) → ``content_delta``;
* ``ToolUseBlock`` → a tool line with its input; the ``ToolResultBlock`` → its result
  (``is_error`` → the line's failure with the result's text);
* a ``Task``/``Agent`` tool call → a running subagent (title: its ``description``, type: its
  ``subagent_type``); each assistant message with that ``parent_tool_use_id`` → its next round; the
  call's result ends it (COMPLETED, or FAILED when ``is_error``);
* ``can_use_tool`` for any tool → the card's approval: 同意 → ``PermissionResultAllow``, 拒绝 or the
  timeout → ``PermissionResultDeny`` with the reason as its message; 始终允许(本任务) → allowed with
  ``updated_permissions=[PermissionUpdate("addRules", [PermissionRuleValue(tool)], "allow",
  destination="session")]``: Claude Code stops asking for that tool for the rest of the session (one
  ``ClaudeSDKClient``: this task), and the card session approves it should it ask again;
* ``can_use_tool`` for ``AskUserQuestion`` → the card's form (options, multi-select, 其他 free text);
  the answers go back as ``updated_input = {**input, "answers": {question: "label, label" or text}}``,
  the shape Claude Code reads; unanswered → denied ("no answer");
* ``ResultMessage`` → the task's end: COMPLETED with no error, FAILED with its errors;
* 取消任务 → ``ClaudeSDKClient.interrupt()``; the card ends CANCELLED.

Not shown: ``ThinkingBlock`` (the runtime API has no thinking event and the card no place for it), a
subagent's own text and tool calls (its rounds show its progress; its result is the Task line's), the
CLI's permission ``suggestions`` (the card's 始终允许(本任务) is a rule for the whole tool, always kept to
the session; a suggestion may name ``localSettings`` or a narrower rule the card cannot show).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from claude_agent_sdk import (
    AssistantMessage,
    ClaudeAgentOptions,
    ClaudeSDKClient,
    PermissionResultAllow,
    PermissionResultDeny,
    ResultMessage,
    TextBlock,
    ToolPermissionContext,
    ToolResultBlock,
    ToolUseBlock,
    UserMessage,
)
from claude_agent_sdk.types import PermissionResult, PermissionRuleValue, PermissionUpdate, StreamEvent

from feishu_progress.adapters.card_session import Approval, CardSession, EndStatus
from feishu_progress.runtime.responses import AnswersPayload

ASK_TOOL = "AskUserQuestion"
SUBAGENT_TOOLS = frozenset({"Task", "Agent"})
SUMMARY_CHARS = 2000
NO_ANSWER = "The user gave no answer."


async def run_on_card(
    card: CardSession, prompt: str, options: ClaudeAgentOptions | None = None, *, transport: Any = None
) -> ResultMessage | None:
    """Run ``prompt`` with the Claude Agent SDK on ``card``; the run's ``ResultMessage`` (None if none).

    ``transport`` is passed to ``ClaudeSDKClient`` (the default starts the bundled Claude Code CLI).
    """
    mapper = _Mapper(card)
    options = dataclasses.replace(options or ClaudeAgentOptions(), can_use_tool=mapper.can_use_tool)
    result: ResultMessage | None = None
    async with ClaudeSDKClient(options, transport=transport) as client:
        interrupting: list[asyncio.Task[None]] = []
        card.on_cancel(lambda: interrupting.append(asyncio.create_task(client.interrupt())))
        await client.query(prompt)
        async for message in client.receive_response():
            await mapper.handle(message)
            if isinstance(message, ResultMessage):
                result = message
        await asyncio.gather(*interrupting, return_exceptions=True)
    await mapper.end(result)
    return result


@dataclass
class _Mapper:
    card: CardSession
    subagents: dict[str, int] = field(default_factory=dict)  # Task tool_use_id → rounds
    streamed: bool = False  # text came as deltas: the whole TextBlocks would repeat it
    asked: int = 0

    async def handle(self, message: Any) -> None:
        if isinstance(message, StreamEvent):
            await self._delta(message)
        elif isinstance(message, AssistantMessage):
            await self._assistant(message)
        elif isinstance(message, UserMessage) and isinstance(message.content, list):
            for block in message.content:
                if isinstance(block, ToolResultBlock) and message.parent_tool_use_id is None:
                    await self._tool_result(block)

    async def _delta(self, message: StreamEvent) -> None:
        if message.parent_tool_use_id is not None:
            return
        event = message.event
        delta = event.get("delta") if event.get("type") == "content_block_delta" else None
        if isinstance(delta, Mapping) and delta.get("type") == "text_delta":
            self.streamed = True
            await self.card.text(str(delta.get("text", "")))

    async def _assistant(self, message: AssistantMessage) -> None:
        parent = message.parent_tool_use_id
        if parent is not None:  # a subagent's turn: its row counts it
            if parent in self.subagents:
                self.subagents[parent] += 1
                await self.card.subagent_round(parent, self.subagents[parent])
            return
        for block in message.content:
            if isinstance(block, TextBlock) and not self.streamed:
                await self.card.text(block.text)
            elif isinstance(block, ToolUseBlock):
                await self._tool_use(block)

    async def _tool_use(self, block: ToolUseBlock) -> None:
        await self.card.tool_started(block.id, block.name, block.input)
        if block.name in SUBAGENT_TOOLS:
            self.subagents[block.id] = 0
            title = str(block.input.get("description") or block.name)
            kind = block.input.get("subagent_type")
            prompt = block.input.get("prompt")
            await self.card.subagent_started(block.id, title, agent_type=str(kind) if kind else None,
                                             description=str(prompt) if prompt else None)  # fmt: skip

    async def _tool_result(self, block: ToolResultBlock) -> None:
        if block.tool_use_id in self.subagents:
            rounds = self.subagents.pop(block.tool_use_id)
            status: EndStatus = "FAILED" if block.is_error else "COMPLETED"
            await self.card.subagent_finished(block.tool_use_id, status, rounds)
        if block.is_error:
            await self.card.tool_failed(block.tool_use_id, _text(block.content))
        else:
            await self.card.tool_finished(block.tool_use_id, _result(block.content))

    async def can_use_tool(
        self, tool_name: str, input: dict[str, Any], context: ToolPermissionContext
    ) -> PermissionResult:
        self.asked += 1
        key = context.tool_use_id or f"permission-{self.asked}"
        if tool_name == ASK_TOOL:
            answers = await self.card.ask(key, _questions(input))
            if answers is None:
                return PermissionResultDeny(message=NO_ANSWER)
            return PermissionResultAllow(updated_input={**input, "answers": _answer_map(answers)})
        summary = context.description or context.title or json.dumps(input, ensure_ascii=False)
        decision = (await self.card.decide([Approval(key, tool_name, summary[:SUMMARY_CHARS])]))[0]
        if decision.approved:
            return PermissionResultAllow(
                updated_permissions=[_session_rule(tool_name)] if decision.always else None
            )
        return PermissionResultDeny(message=f"The user did not approve this call: {decision.reason}")

    async def end(self, result: ResultMessage | None) -> None:
        cancelled = self.card.cancelled.is_set()
        for task_id, rounds in list(self.subagents.items()):
            await self.card.subagent_finished(task_id, "CANCELLED" if cancelled else "COMPLETED", rounds)
        self.subagents.clear()
        if cancelled:
            await self.card.finish("CANCELLED")
        elif result is not None and result.is_error:
            errors = "; ".join(result.errors or []) or result.result or result.subtype
            await self.card.finish("FAILED", error=errors)


def _session_rule(tool_name: str) -> PermissionUpdate:
    """Allow every use of ``tool_name`` until the session (this task's client) ends."""
    rule = PermissionRuleValue(tool_name=tool_name)
    return PermissionUpdate(type="addRules", rules=[rule], behavior="allow", destination="session")


def _questions(input: Mapping[str, Any]) -> list[dict[str, Any]]:
    """AskUserQuestion's ``questions`` as the ask event takes them (``header`` is not shown)."""
    questions = []
    for raw in input.get("questions") or []:
        if not isinstance(raw, Mapping):
            continue
        options = [
            {"label": str(o.get("label")), "description": str(o.get("description") or "")}
            for o in raw.get("options") or []
            if isinstance(o, Mapping) and o.get("label")
        ]
        question = str(raw.get("question") or "?")
        questions.append(
            {"question": question, "options": options, "multiSelect": bool(raw.get("multiSelect"))}
        )
    return questions or [{"question": "?", "options": []}]


def _answer_map(answers: AnswersPayload) -> dict[str, str]:
    """``{question: answer}``: the chosen labels joined by ", ", else what the user typed."""
    return {a.question: ", ".join(a.selected_labels) or a.custom_input for a in answers.answers}


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = [str(part.get("text", "")) for part in content if isinstance(part, Mapping)]
        return "\n".join(part for part in parts if part)
    return "" if content is None else json.dumps(content, ensure_ascii=False, default=str)


def _result(content: Any) -> Any:
    text = _text(content)
    try:
        parsed = json.loads(text)
    except ValueError:
        return text
    return parsed if isinstance(parsed, dict) else text
