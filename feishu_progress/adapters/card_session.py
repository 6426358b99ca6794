"""One task's card as an agent adapter drives it: events out, the user's decisions in.

Events go through one ``EventStream`` (in order, deltas coalesced). One reader task long-polls the
task's actions and routes each to whoever waits for it: an approval click to its ``decide`` call, a
form's answers to its ``ask`` call, 取消任务 to the ``cancelled`` event and the ``on_cancel`` callbacks.
Only clicks the service accepted reach the actions: the task's requester's, or a chat member's when
FP_CALLBACK__ALLOW_CHAT_MEMBERS widens it (runtime/card_actions.py decides, not the adapter).

A question or approval nobody answers within ``approval_timeout`` seconds (default 10 min) is denied:
the card leaves WAITING and the tool line says why (``tool.approval.timed_out``).

始终允许(本任务) (allow always for this task): an approval offers it unless the adapter says otherwise
(``Approval.allow_always``). The session keeps the rule itself: once clicked for a tool, every later
approval of that tool in this task that offers it is approved without asking (one waiting at the same
moment too), so every adapter can honour it; an adapter also hands it to its SDK where the SDK keeps
such rules. An approval with ``allow_always=False`` is asked every time.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from feishu_progress.client import DEFAULT_WAIT_SECONDS, FeishuProgressClient, ReceiveIdType
from feishu_progress.i18n.core import Msg, translate
from feishu_progress.runtime.responses import (
    AnswersAction,
    AnswersPayload,
    ApprovalAction,
    CancelAction,
    UserAction,
)

log = logging.getLogger(__name__)

DEFAULT_APPROVAL_TIMEOUT_SECONDS = 600.0
DEFAULT_LOCALE = "zh_cn"
EndStatus = Literal["COMPLETED", "FAILED", "CANCELLED"]
_ERROR_CHARS = 5000  # the finished event's ``error`` bound


@dataclass(frozen=True, slots=True)
class Approval:
    """A tool call waiting for the user: the card shows its name and summary with 同意 / 拒绝."""

    approval_id: str
    tool_name: str
    summary: str = ""
    allow_always: bool = True  # offer 始终允许(本任务): the session keeps that rule (``decide``)


@dataclass(frozen=True, slots=True)
class Decision:
    """What became of an approval: ``reason`` (the card's text) says why it was not approved."""

    approved: bool
    operator_open_id: str | None = None
    timed_out: bool = False
    reason: str = ""
    always: bool = False  # 始终允许(本任务): this tool is approved for the rest of the task


class CardSession:
    """The card of one task, opened by ``open_card``: what adapters call to show progress and to ask."""

    def __init__(
        self,
        fp: FeishuProgressClient,
        session_id: int,
        *,
        approval_timeout: float = DEFAULT_APPROVAL_TIMEOUT_SECONDS,
        locale: str | None = None,
        message_id: str | None = None,
        poll_wait: float = DEFAULT_WAIT_SECONDS,
    ) -> None:
        self.fp = fp
        self.session_id = session_id
        self.message_id = message_id  # the card's Feishu message
        self.poll_wait = poll_wait  # one actions long-poll; the service holds an abandoned one this long
        self.approval_timeout = approval_timeout
        self.locale = locale or DEFAULT_LOCALE
        self.round = 1
        self.finished: EndStatus | None = None
        self.cancelled = asyncio.Event()
        self._events = fp.event_stream(session_id)
        self._waiting: dict[str, asyncio.Future[UserAction | None]] = {}
        self._waiting_tools: dict[str, str] = {}  # approval_id → tool, of those waiting that offer always
        self.always_allowed: set[str] = set()  # tools the user allowed for the rest of the task
        self._cancel_callbacks: list[Callable[[], object]] = []
        self._reader: asyncio.Task[None] | None = None

    # -- lifetime -------------------------------------------------------------------------------------

    async def start(self) -> None:
        await self._events.add({"type": "status", "status": "RUNNING", "round": self.round})
        await self._events.flush()
        self._reader = asyncio.create_task(self._read_actions(), name=f"fp-actions-{self.session_id}")

    async def close(self) -> None:
        if self._reader is not None:
            self._reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reader
        await self._events.close()

    def on_cancel(self, callback: Callable[[], object]) -> None:
        """Call ``callback`` when the user clicks 取消任务 (at once if they already did)."""
        self._cancel_callbacks.append(callback)
        if self.cancelled.is_set():
            callback()

    # -- progress -------------------------------------------------------------------------------------

    async def text(self, delta: str) -> None:
        if delta:
            await self._events.add({"type": "content_delta", "text": delta})

    async def tool_started(self, call_id: str, name: str, args: Mapping[str, Any] | None = None) -> None:
        event: dict[str, Any] = {"type": "tool_started", "call_id": call_id, "name": name or "tool"}
        if args is not None:
            event["args"] = dict(args)
        await self._events.add(event)

    async def tool_finished(self, call_id: str, result: Any) -> None:
        await self._events.add({"type": "tool_finished", "call_id": call_id, "result": result})

    async def tool_failed(self, call_id: str, reason: str) -> None:
        """The line shows ``(失败: reason)`` (a result with ``error`` is a failure: tools/line_parts.py)."""
        await self.tool_finished(call_id, {"error": reason or "error"})

    async def subagent_started(
        self, task_id: str, title: str, *, agent_type: str | None = None, description: str | None = None
    ) -> None:
        event: dict[str, Any] = {"type": "subagent_started", "task_id": task_id, "title": title[:1000]}
        if agent_type:
            event["agent_type"] = agent_type[:64]
        if description:
            event["task_description"] = description[:20_000]
        await self._events.add(event)

    async def subagent_round(self, task_id: str, round_: int) -> None:
        await self._events.add({"type": "subagent_round", "task_id": task_id, "round": round_})

    async def subagent_finished(self, task_id: str, status: EndStatus, total_rounds: int = 0) -> None:
        event = {"type": "subagent_finished", "task_id": task_id, "status": status}
        await self._events.add({**event, "total_rounds": total_rounds})

    async def finish(
        self, status: EndStatus, *, content: str | None = None, error: str | None = None
    ) -> None:
        """End the task (once): the final card goes out."""
        if self.finished is not None:
            return
        self.finished = status
        event: dict[str, Any] = {"type": "finished", "status": status}
        if content is not None:
            event["content"] = content
        if error:
            event["error"] = error[:_ERROR_CHARS]
        await self._events.add(event)

    # -- asking ---------------------------------------------------------------------------------------

    async def decide(self, approvals: Sequence[Approval]) -> list[Decision]:
        """Show the approvals on the card and wait for each click, until the timeout denies the rest.

        A tool the user allowed always (始终允许(本任务)) earlier in the task is approved without asking,
        unless this approval withholds the offer (``allow_always=False``: asked every time).
        """
        asked = [a for a in approvals if not (a.allow_always and a.tool_name in self.always_allowed)]
        if not asked:
            return [ALLOWED_ALWAYS for _ in approvals]
        waits = [self._wait_for(approval.approval_id) for approval in asked]
        for approval in asked:
            if approval.allow_always:
                self._waiting_tools[approval.approval_id] = approval.tool_name
            await self._events.add(_approval_event(approval))
        actions = dict(
            zip([approval.approval_id for approval in asked], await self._gather(waits), strict=True)
        )
        await self.resume()
        return [
            self._decision(actions[a.approval_id]) if a.approval_id in actions else ALLOWED_ALWAYS
            for a in approvals
        ]

    async def ask(self, ask_id: str, questions: Sequence[Mapping[str, Any]]) -> AnswersPayload | None:
        """Show the questions as the card's form; the answers, or None (timeout, cancel)."""
        wait = self._wait_for(ask_id)
        await self._events.add({"type": "ask", "ask_id": ask_id, "questions": [dict(q) for q in questions]})
        action = (await self._gather([wait]))[0]
        await self.resume()
        return action.payload if isinstance(action, AnswersAction) else None

    async def resume(self) -> None:
        """Back to RUNNING (the same round: the tool lines stay); closes what still waited on the card.

        Not while another call still waits (parallel tool calls each ask): RUNNING would take its
        approval or form off the card; the last one to be answered resumes.
        """
        if self.finished is None and not self.cancelled.is_set() and not self._waiting:
            await self._events.add({"type": "status", "status": "RUNNING", "round": self.round})
            await self._events.flush()

    def _wait_for(self, key: str) -> asyncio.Future[UserAction | None]:
        future: asyncio.Future[UserAction | None] = asyncio.get_running_loop().create_future()
        self._waiting[key] = future
        if self.cancelled.is_set():
            future.set_result(None)
        return future

    async def _gather(self, waits: list[asyncio.Future[UserAction | None]]) -> list[UserAction | None]:
        await self._events.flush()  # the card shows the question before anyone can answer it
        await asyncio.wait(waits, timeout=self.approval_timeout)
        for key, future in list(self._waiting.items()):
            if future in waits:
                del self._waiting[key]
                self._waiting_tools.pop(key, None)
        return [future.result() if future.done() else None for future in waits]

    def _decision(self, action: UserAction | None) -> Decision:
        if isinstance(action, ApprovalAction):
            payload = action.payload
            reason = "" if payload.approved else translate(Msg("tool.approval.denied"), self.locale)
            always = payload.approved and payload.always
            return Decision(payload.approved, action.operator_open_id, reason=reason, always=always)
        if self.cancelled.is_set():
            return Decision(False, reason=translate(Msg("tool.approval.denied"), self.locale))
        minutes = max(1, round(self.approval_timeout / 60))
        reason = translate(Msg("tool.approval.timed_out", {"minutes": minutes}), self.locale)
        return Decision(False, timed_out=True, reason=reason)

    # -- the actions ----------------------------------------------------------------------------------

    async def _read_actions(self) -> None:
        cursor = 0
        while True:
            try:
                async for action in self.fp.actions(self.session_id, after=cursor, wait=self.poll_wait):
                    cursor = action.cursor
                    self._route(action)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # the service restarting: read on after the last action routed
                log.warning("reading the actions of task %s failed: %r", self.session_id, exc)
                await asyncio.sleep(1.0)

    def _route(self, action: UserAction) -> None:
        if isinstance(action, CancelAction):
            self._cancel()
            return
        key = None
        if isinstance(action, ApprovalAction):
            key = action.payload.approval_id
            if action.payload.approved and action.payload.always:
                self._allow_always(action)
        elif isinstance(action, AnswersAction):
            key = action.payload.ask_id
        future = self._waiting.get(key) if key is not None else None
        if future is not None and not future.done():
            future.set_result(action)

    def _allow_always(self, action: ApprovalAction) -> None:
        """始终允许(本任务): the tool needs no approval from now on, the ones waiting now included."""
        tool = action.payload.tool_name
        self.always_allowed.add(tool)
        for key, waiting_tool in self._waiting_tools.items():
            future = self._waiting.get(key)
            if waiting_tool == tool and future is not None and not future.done():
                future.set_result(action)

    def _cancel(self) -> None:
        if self.cancelled.is_set():
            return
        self.cancelled.set()
        for future in self._waiting.values():
            if not future.done():
                future.set_result(None)
        for callback in self._cancel_callbacks:
            callback()


ALLOWED_ALWAYS = Decision(True, always=True)  # a tool allowed for the rest of the task: not asked again


def _approval_event(approval: Approval) -> dict[str, Any]:
    event: dict[str, Any] = {"type": "approval", "approval_id": approval.approval_id}
    event["tool_name"] = approval.tool_name
    if approval.allow_always:  # only then: a service older than the flag refuses unknown fields
        event["allow_always"] = True
    return {**event, "summary": approval.summary[:5000]}


@contextlib.asynccontextmanager
async def open_card(
    fp: FeishuProgressClient,
    *,
    receive_id: str,
    requester_open_id: str,
    receive_id_type: ReceiveIdType = "chat_id",
    title: str = "",
    locale: str | None = None,
    idempotency_key: str | None = None,
    approval_timeout: float = DEFAULT_APPROVAL_TIMEOUT_SECONDS,
    poll_wait: float = DEFAULT_WAIT_SECONDS,
) -> AsyncIterator[CardSession]:
    """Create the task, yield its card; the card ends FAILED (with the error) if the block raises,
    CANCELLED if the user cancelled, else COMPLETED (unless the adapter finished it already)."""
    task = await fp.create_task(
        receive_id=receive_id,
        receive_id_type=receive_id_type,
        requester_open_id=requester_open_id,
        title=title,
        locale=locale,
        idempotency_key=idempotency_key,
    )
    card = CardSession(fp, task.session_id, approval_timeout=approval_timeout, locale=locale,
                       message_id=task.message_id, poll_wait=poll_wait)  # fmt: skip
    await card.start()
    try:
        yield card
    except BaseException as exc:
        cancelled = card.cancelled.is_set() or isinstance(exc, asyncio.CancelledError)
        await card.finish("CANCELLED" if cancelled else "FAILED", error=None if cancelled else repr(exc))
        raise
    else:
        await card.finish("CANCELLED" if card.cancelled.is_set() else "COMPLETED")
    finally:
        await card.close()
