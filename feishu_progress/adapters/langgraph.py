"""LangGraph on a live card: ``pip install "feishu-progress[langgraph]"``.

    async with FeishuProgressClient(url, token) as fp, open_card(fp, receive_id=chat,
            requester_open_id=user, title="Report") as card:
        state = await run_on_card(card, graph, {"messages": [("user", "Write the report")]},
                                  {"configurable": {"thread_id": "t1"}})

The graph is streamed with ``stream_mode=["messages", "updates"]`` and ``subgraphs=True`` (it needs a
checkpointer to be resumed after an ``interrupt()``). What becomes what:

* a chat model's message chunks → ``content_delta`` (the root graph's only; their text blocks, when the
  content is a list of blocks);
* an ``AIMessage``'s ``tool_calls`` → tool lines; each ``ToolMessage`` → its result (``status="error"``
  → the line's failure with the message's text);
* a subgraph (a namespace ``node:<task id>``) → a running subagent titled with its node's name; each of
  its model messages → its next round; it ends when its parent node's update arrives;
* ``interrupt(value)`` → the card asks, then the graph resumes with ``Command(resume=answer)``:
  ``{"type": "approval", "tool_name", "summary"?, "allow_always"?}`` → 同意 / 拒绝 / 始终允许(本任务)
  (unless ``allow_always`` is false), resumed with ``{"approved": bool, "reason": str, "always":
  bool}`` (the timeout: ``approved`` false, the reason says so); after 始终允许(本任务) the adapter
  resumes every later approval interrupt of that ``tool_name`` in the task at once, approved (one with
  ``"allow_always": false`` is asked every time);
  ``{"question", "options"?, "multiSelect"?}`` → the form, resumed with the chosen labels joined by
  ", " (or the typed text); ``{"questions": [...]}`` → resumed with one ``{"question",
  "selectedLabels", "customInput"}`` per question; a string → a free-text question, resumed with the
  text. Unanswered (timeout, cancel): resumed with None.
* 取消任务 → the streaming task is cancelled; the card ends CANCELLED.

Not shown: reasoning / thinking content blocks (the runtime API has no thinking event and the card no
place for one).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from langchain_core.messages import AIMessage, AIMessageChunk, ToolMessage
from langgraph.types import Command, Interrupt

from feishu_progress.adapters.card_session import Approval, CardSession
from feishu_progress.runtime.responses import AnswersPayload


async def run_on_card(card: CardSession, graph: Any, input: Any, config: Mapping[str, Any]) -> Any:
    """Stream ``graph`` on ``card`` until it ends (interrupts answered on the card); its final state.

    A 取消任务 click cancels the run (the card ends CANCELLED; this returns None).
    """
    mapper = _Mapper(card)
    running = asyncio.create_task(mapper.run(graph, input, dict(config)))
    card.on_cancel(running.cancel)
    try:
        await running
    except asyncio.CancelledError:
        if not card.cancelled.is_set():
            raise
        await mapper.end("CANCELLED")
        return None
    await mapper.end("COMPLETED")
    return await graph.aget_state(config)


@dataclass
class _Mapper:
    card: CardSession
    subgraphs: dict[str, int] = field(default_factory=dict)  # namespace → rounds
    tools_seen: set[str] = field(default_factory=set)
    asked: int = 0

    async def run(self, graph: Any, input: Any, config: dict[str, Any]) -> None:
        while True:
            interrupts: list[Interrupt] = []
            stream = graph.astream(input, config, stream_mode=["messages", "updates"], subgraphs=True)
            async for namespace, mode, chunk in stream:
                if mode == "messages":
                    await self._message(tuple(namespace), chunk[0])
                elif mode == "updates":
                    interrupts.extend(await self._updates(tuple(namespace), chunk))
            if not interrupts:
                return
            input = Command(resume={i.id: await self._answer(i.value) for i in interrupts})

    async def _message(self, namespace: tuple[str, ...], message: Any) -> None:
        if namespace:
            return  # a subagent's text stays off the task's content; its rounds show its progress
        if isinstance(message, AIMessage | AIMessageChunk):
            await self.card.text(str(message.text))  # text blocks only: reasoning blocks stay off

    async def _updates(self, namespace: tuple[str, ...], chunk: Mapping[str, Any]) -> list[Interrupt]:
        if namespace:
            await self._subgraph_progress(namespace[0], chunk)
        found: list[Interrupt] = []
        for node, update in chunk.items():
            if node == "__interrupt__":
                found.extend(update)
                continue
            await self._subgraph_done(node)
            for message in _messages(update):
                await self._tool_events(message)
        return found

    async def _subgraph_progress(self, task: str, chunk: Mapping[str, Any]) -> None:
        if task not in self.subgraphs:
            self.subgraphs[task] = 0
            title = task.split(":", 1)[0]
            await self.card.subagent_started(task, title, agent_type=title[:64])
        if any(isinstance(m, AIMessage) for update in chunk.values() for m in _messages(update)):
            self.subgraphs[task] += 1
            await self.card.subagent_round(task, self.subgraphs[task])

    async def _subgraph_done(self, node: str) -> None:
        for task in [task for task in self.subgraphs if task.split(":", 1)[0] == node]:
            await self.card.subagent_finished(task, "COMPLETED", self.subgraphs.pop(task))

    async def _tool_events(self, message: Any) -> None:
        if isinstance(message, AIMessage):
            for call in message.tool_calls:
                call_id = call.get("id") or f"call-{len(self.tools_seen)}"
                if call_id not in self.tools_seen:
                    self.tools_seen.add(call_id)
                    await self.card.tool_started(call_id, call["name"], call.get("args"))
        elif isinstance(message, ToolMessage):
            if message.status == "error":
                await self.card.tool_failed(message.tool_call_id, _text(message.content))
            else:
                await self.card.tool_finished(message.tool_call_id, _result(message.content))

    async def _answer(self, value: Any) -> Any:
        """Ask the card what ``interrupt(value)`` asks; the value the graph resumes with."""
        self.asked += 1
        key = f"interrupt-{self.asked}"
        if isinstance(value, Mapping) and value.get("type") == "approval":
            tool, summary = str(value.get("tool_name") or "tool"), _text(value.get("summary", ""))
            approval = Approval(key, tool, summary, allow_always=value.get("allow_always") is not False)
            decision = (await self.card.decide([approval]))[0]
            return {"approved": decision.approved, "reason": decision.reason, "always": decision.always}
        questions = _questions(value)
        answers = await self.card.ask(key, questions)
        if answers is None:
            return None
        return _resume_value(value, answers)

    async def end(self, status: Any) -> None:
        for task, rounds in list(self.subgraphs.items()):
            await self.card.subagent_finished(task, status, rounds)
        self.subgraphs.clear()


def _messages(update: Any) -> list[Any]:
    if isinstance(update, Mapping):
        messages = update.get("messages")
        if isinstance(messages, list):
            return messages
        if messages is not None:
            return [messages]
    return []


def _questions(value: Any) -> list[dict[str, Any]]:
    if isinstance(value, Mapping) and isinstance(value.get("questions"), list):
        return [_question(q) for q in value["questions"]]
    if isinstance(value, Mapping) and "question" in value:
        return [_question(value)]
    return [{"question": _text(value) or "?", "options": []}]


def _question(value: Any) -> dict[str, Any]:
    if not isinstance(value, Mapping):
        return {"question": _text(value) or "?", "options": []}
    return {
        "question": _text(value.get("question")) or "?",
        "options": list(value.get("options") or []),
        "multiSelect": bool(value.get("multiSelect", value.get("multi_select", False))),
    }


def _resume_value(value: Any, answers: AnswersPayload) -> Any:
    if isinstance(value, Mapping) and isinstance(value.get("questions"), list):
        return [
            {"question": a.question, "selectedLabels": a.selected_labels, "customInput": a.custom_input}
            for a in answers.answers
        ]
    first = answers.answers[0] if answers.answers else None
    if first is None:
        return None
    return ", ".join(first.selected_labels) or first.custom_input


def _text(value: Any) -> str:
    if value is None:
        return ""
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str)


def _result(content: Any) -> Any:
    if isinstance(content, str):
        try:
            parsed = json.loads(content)
        except ValueError:
            return content
        return parsed if isinstance(parsed, dict) else content
    return _text(content)
