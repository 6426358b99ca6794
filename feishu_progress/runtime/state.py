"""A task's state as the runtime's events build it, and its JSON snapshot for restarts.

Pure: applying an event is a plain mutation with no I/O; the task service does the I/O around it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from feishu_progress.domain import (
    AskOption,
    AskQuestion,
    CardModel,
    CardState,
    Notice,
    PendingApproval,
    PendingAsk,
    SubagentSummary,
    TaskStatus,
    ToolCall,
)
from feishu_progress.runtime import events as ev

# Streamed content is kept whole up to this size; past it the head is dropped with a marker (the card
# cuts much earlier, visibly, and points at 会话详情 for the full text).
MAX_CONTENT_CHARS = 1_000_000
MAX_TOOLS_PER_ROUND = 2000
_DROPPED_MARKER = "…\n"

# Notices that the runtime's next RUNNING status makes obsolete.
_CLEARED_BY_RUNNING = frozenset({Notice.RETRYING, Notice.ANSWERS_SUBMITTED, Notice.APPROVED, Notice.DENIED})


@dataclass
class TaskState:
    """Everything we know about one task; the live card is built from it."""

    session_id: int
    requester_open_id: str
    receive_id: str
    receive_id_type: str
    title: str = ""
    locale: str | None = None
    message_id: str | None = None
    status: TaskStatus = TaskStatus.RUNNING
    round: int = 0
    content: str = ""
    tools: dict[str, ToolCall] = field(default_factory=dict)
    pending_asks: dict[str, PendingAsk] = field(default_factory=dict)
    answered_asks: set[str] = field(default_factory=set)
    approvals: dict[str, PendingApproval] = field(default_factory=dict)
    resolved_approvals: set[str] = field(default_factory=set)
    disliked: bool = False
    notice: Notice | None = None
    error: str = ""
    started_at: float = 0.0
    last_event_at: float = 0.0
    retry_requested: bool = False
    image_keys: dict[str, str] = field(default_factory=dict)
    finished_at: float | None = None

    # ----------------------------------------------------------------- events
    def apply(self, event: ev.Event) -> None:
        """Apply one runtime event (subagent events only touch the database: see TaskService)."""
        handler = _HANDLERS.get(type(event))
        if handler is not None:
            handler(self, event)

    def _status(self, event: ev.StatusEvent) -> None:
        if event.round > self.round:
            self.tools.clear()  # 本轮工具 shows the current round's calls
        self.round = max(self.round, event.round)
        self.status = TaskStatus(event.status)
        if self.status is TaskStatus.RUNNING:
            self.pending_asks.clear()
            self.approvals.clear()
            self.retry_requested = False
            self.finished_at = None
            self.error = ""
            if self.notice in _CLEARED_BY_RUNNING:
                self.notice = None

    def _content(self, event: ev.ContentEvent) -> None:
        self.content = _bounded(event.text)

    def _content_delta(self, event: ev.ContentDeltaEvent) -> None:
        self.content = _bounded(self.content + event.text)

    def _tool_started(self, event: ev.ToolStartedEvent) -> None:
        if len(self.tools) >= MAX_TOOLS_PER_ROUND and event.call_id not in self.tools:
            self.tools.pop(next(iter(self.tools)))
        self.tools[event.call_id] = ToolCall(call_id=event.call_id, name=event.name, args=event.args)

    def _tool_args(self, event: ev.ToolArgsEvent) -> None:
        call = self.tools.get(event.call_id)
        if call is not None:
            self.tools[event.call_id] = ToolCall(
                call.call_id, call.name, event.args, call.result, call.finished
            )

    def _tool_finished(self, event: ev.ToolFinishedEvent) -> None:
        call = self.tools.get(event.call_id)
        name = call.name if call is not None else "tool"
        args = call.args if call is not None else None
        self.tools[event.call_id] = ToolCall(event.call_id, name, args, event.result, True)

    def _round_finished(self, event: ev.RoundFinishedEvent) -> None:
        self.round = max(self.round, event.round)

    def _ask(self, event: ev.AskEvent) -> None:
        questions = tuple(
            AskQuestion(
                question=q.question,
                options=tuple(AskOption(o.label, o.description) for o in q.options),
                multi_select=q.multi_select,
            )
            for q in event.questions
        )
        self.pending_asks[event.ask_id] = PendingAsk(event.ask_id, questions)
        self.status = TaskStatus.WAITING

    def _approval(self, event: ev.ApprovalEvent) -> None:
        self.approvals[event.approval_id] = PendingApproval(event.approval_id, event.tool_name, event.summary)
        self.status = TaskStatus.WAITING

    def _finished(self, event: ev.FinishedEvent) -> None:
        self.status = TaskStatus(event.status)
        if event.content is not None:
            self.content = _bounded(event.content)
        self.error = event.error or ""
        self.pending_asks.clear()
        self.approvals.clear()
        self.notice = None

    # ----------------------------------------------------------------- views
    def card_state(self, placeholder: str = "") -> CardState:
        """What the live card shows; ``placeholder`` stands in for content until the runtime says anything."""
        content = self.content
        if not content and not self.tools and self.round == 0 and self.status is TaskStatus.RUNNING:
            content = placeholder
        return CardState(
            status=self.status,
            round=self.round,
            content=content,
            tools=tuple(self.tools.values()),
            pending_asks=tuple(self.pending_asks.values()),
            pending_approvals=tuple(self.approvals.values()),
            disliked=self.disliked,
            notice=self.notice,
            error=self.error,
            image_keys=dict(self.image_keys),
            finished_at=self.finished_at if self.status.is_terminal else None,
        )

    def card_model(
        self,
        *,
        elapsed_ms: int,
        subagents: tuple[SubagentSummary, ...],
        locales: tuple[str, ...],
        session_detail_url: str | None,
    ) -> CardModel:
        return CardModel(
            session_id=self.session_id,
            status=self.status,
            round=self.round,
            content=self.content,
            title=self.title,
            tools=tuple(self.tools.values()),
            subagents=subagents,
            elapsed_ms=elapsed_ms,
            pending_asks=tuple(self.pending_asks.values()),
            pending_approvals=tuple(self.approvals.values()),
            disliked=self.disliked,
            notice=self.notice,
            error=self.error,
            locales=locales,
            session_detail_url=session_detail_url,
            image_keys=dict(self.image_keys),
        )

    # ----------------------------------------------------------------- snapshot
    def to_snapshot(self) -> str:
        """JSON of what a restarted process needs to re-attach the card."""
        return json.dumps(
            {
                "v": 1,
                "title": self.title,
                "content": self.content,
                "tools": [
                    {
                        "call_id": c.call_id,
                        "name": c.name,
                        "args": c.args,
                        "result": c.result,
                        "finished": c.finished,
                    }
                    for c in self.tools.values()
                ],
                "pending_asks": [_ask_to_json(a) for a in self.pending_asks.values()],
                "answered_asks": sorted(self.answered_asks),
                "approvals": [
                    {"approval_id": a.approval_id, "tool_name": a.tool_name, "summary": a.summary}
                    for a in self.approvals.values()
                ],
                "resolved_approvals": sorted(self.resolved_approvals),
                "notice": self.notice.value if self.notice else None,
                "error": self.error,
                "started_at": self.started_at,
                "retry_requested": self.retry_requested,
                "image_keys": self.image_keys,
                "finished_at": self.finished_at,
            },
            ensure_ascii=False,
            default=str,
        )

    def restore_snapshot(self, snapshot: str) -> None:
        """Load a snapshot written by ``to_snapshot``; a damaged one leaves the defaults."""
        try:
            data = json.loads(snapshot) if snapshot else {}
        except ValueError:
            return
        if not isinstance(data, dict):
            return
        self.title = str(data.get("title") or self.title)
        self.content = str(data.get("content") or "")
        for raw in data.get("tools") or []:
            call = ToolCall(
                str(raw["call_id"]),
                str(raw["name"]),
                raw.get("args"),
                raw.get("result"),
                bool(raw.get("finished")),
            )
            self.tools[call.call_id] = call
        for raw in data.get("pending_asks") or []:
            ask = _ask_from_json(raw)
            self.pending_asks[ask.ask_id] = ask
        self.answered_asks = set(data.get("answered_asks") or [])
        for raw in data.get("approvals") or []:
            approval = PendingApproval(
                str(raw["approval_id"]), str(raw["tool_name"]), str(raw.get("summary", ""))
            )
            self.approvals[approval.approval_id] = approval
        self.resolved_approvals = set(data.get("resolved_approvals") or [])
        notice = data.get("notice")
        self.notice = (
            Notice(notice) if isinstance(notice, str) and notice in Notice._value2member_map_ else None
        )
        self.error = str(data.get("error") or "")
        self.started_at = float(data.get("started_at") or self.started_at)
        self.retry_requested = bool(data.get("retry_requested"))
        self.image_keys = {str(k): str(v) for k, v in (data.get("image_keys") or {}).items()}
        finished_at = data.get("finished_at")
        self.finished_at = float(finished_at) if isinstance(finished_at, int | float) else None


def _bounded(text: str) -> str:
    if len(text) <= MAX_CONTENT_CHARS:
        return text
    return _DROPPED_MARKER + text[-(MAX_CONTENT_CHARS - len(_DROPPED_MARKER)) :]


def _ask_to_json(ask: PendingAsk) -> dict[str, Any]:
    return {
        "ask_id": ask.ask_id,
        "questions": [
            {
                "question": q.question,
                "multi_select": q.multi_select,
                "options": [{"label": o.label, "description": o.description} for o in q.options],
            }
            for q in ask.questions
        ],
    }


def _ask_from_json(raw: dict[str, Any]) -> PendingAsk:
    return PendingAsk(
        str(raw["ask_id"]),
        tuple(
            AskQuestion(
                str(q["question"]),
                tuple(
                    AskOption(str(o["label"]), str(o.get("description", ""))) for o in q.get("options", [])
                ),
                bool(q.get("multi_select")),
            )
            for q in raw.get("questions", [])
        ),
    )


_HANDLERS: dict[type, Any] = {
    ev.StatusEvent: TaskState._status,
    ev.ContentEvent: TaskState._content,
    ev.ContentDeltaEvent: TaskState._content_delta,
    ev.ToolStartedEvent: TaskState._tool_started,
    ev.ToolArgsEvent: TaskState._tool_args,
    ev.ToolFinishedEvent: TaskState._tool_finished,
    ev.RoundFinishedEvent: TaskState._round_finished,
    ev.AskEvent: TaskState._ask,
    ev.ApprovalEvent: TaskState._approval,
    ev.FinishedEvent: TaskState._finished,
}
