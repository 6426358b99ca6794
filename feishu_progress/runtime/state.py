"""A task's state as the runtime's events and the user's clicks build it, and its JSON snapshot.

Pure: every change is a method here (an event applied, a click's effect, the task closed as lost); the
runtime services do the I/O around them. Everything kept has a size chosen on purpose, because a
runtime can send megabytes and a process holds thousands of tasks:

- content: the first ``CONTENT_KEEP_CHARS`` characters (the card shows the head and marks the cut; it can
  never show more than ~40 000 characters in 30 KB) plus the total length, for the marker;
- tools: the newest ``MAX_TOOLS_KEPT`` calls of the round (the card shows at most 30) plus how many older
  ones were dropped; each call's arguments and result capped to 16 KiB (runtime/bounds.py);
- pending asks and approvals: at most ``MAX_PENDING`` each (a batch that would exceed it is refused);
- ids of answered asks and resolved approvals: the newest ``MAX_REMEMBERED_IDS``.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Annotated, Any, NamedTuple, TypeVar, get_type_hints

from pydantic import BeforeValidator, PlainSerializer, TypeAdapter, ValidationError

from feishu_progress.domain import (
    IMAGE_UPLOADING,
    AskOption,
    AskQuestion,
    CardPanels,
    CardState,
    Notice,
    PendingApproval,
    PendingAsk,
    TaskStatus,
    ToolCall,
)
from feishu_progress.errors import EventRejected, TaskFinished, TooManyImages
from feishu_progress.runtime import events as ev
from feishu_progress.runtime.bounds import bound_json

CONTENT_KEEP_CHARS = 50_000
MAX_TOOLS_KEPT = 50
MAX_PENDING = 10
MAX_REMEMBERED_IDS = 200
# Batches a repeat is recognised for: a runtime retries its newest batch, never one 64 batches back
# (≈ 2.2 KB of snapshot).
MAX_REMEMBERED_BATCHES = 64
MAX_IMAGE_KEYS = 100  # images a card can name (uploaded by the runtime, or from tool results)
UPLOADED_IMAGE_PREFIX = "fpimg:"
SNAPSHOT_VERSION = 2

# Notices that the runtime's next RUNNING status makes obsolete.
# A retry click asks the runtime to run a task again: only one that failed or lost contact.
RETRYABLE = frozenset({TaskStatus.FAILED, TaskStatus.LOST})
_CLEARED_BY_RUNNING = frozenset(
    {Notice.RETRYING, Notice.ANSWERS_SUBMITTED, Notice.APPROVED, Notice.APPROVED_ALWAYS, Notice.DENIED}
)


def request_digest(request: str | bytes) -> str:
    """What is kept of a request that came with an Idempotency-Key (its JSON): 32 hex digits."""
    data = request if isinstance(request, bytes) else request.encode("utf-8", "surrogatepass")
    return hashlib.sha256(data).hexdigest()[:32]


def batch_digest(idempotency_key: str) -> str:
    """What a state keeps of a batch's Idempotency-Key (up to 255 characters): 32 hex digits."""
    return hashlib.sha256(idempotency_key.encode("utf-8")).hexdigest()[:32]


_T = TypeVar("_T")


class _InSnapshot:
    """The mark of a field the snapshot holds (see ``InSnapshot``)."""


_IN_SNAPSHOT = _InSnapshot()
# A TaskState field saved in the task's snapshot (task_card.snapshot); unmarked ones come from the card
# row's columns or live in memory only.
InSnapshot = Annotated[_T, _IN_SNAPSHOT]


def _by_key(key: str) -> Callable[[Any], Any]:
    def keyed(saved: Any) -> Any:
        if isinstance(saved, list):
            return {item[key]: item for item in saved if isinstance(item, Mapping) and key in item}
        return saved

    return keyed


# Records by id, saved as the list of their values in order (the snapshot's shape since v1).
_AS_LIST = PlainSerializer(lambda by_id: list(by_id.values()))
_ToolsById = Annotated[dict[str, ToolCall], BeforeValidator(_by_key("call_id")), _AS_LIST]
_AsksById = Annotated[dict[str, PendingAsk], BeforeValidator(_by_key("ask_id")), _AS_LIST]
_ApprovalsById = Annotated[dict[str, PendingApproval], BeforeValidator(_by_key("approval_id")), _AS_LIST]
# An insertion-ordered set of ids, saved as a list.
_IdSet = Annotated[
    dict[str, None],
    BeforeValidator(lambda ids: dict.fromkeys(ids) if isinstance(ids, list) else ids),
    PlainSerializer(list),
]


def _remember(ids: dict[str, None], new_id: str, keep: int = MAX_REMEMBERED_IDS) -> None:
    """An insertion-ordered set that forgets its oldest ids past ``keep``."""
    ids[new_id] = None
    while len(ids) > keep:
        del ids[next(iter(ids))]


@dataclass
class TaskState:
    """Everything we know about one task; the live card is built from it (``card_state``).

    Declared once, here: a field marked ``InSnapshot`` is in the task's snapshot, serialised by ``SNAPSHOT``
    from these declarations; the card row's columns (status, round, disliked...) are saved beside it, and
    the rest lives in memory only. Every change is a method below, called under the task's lock.
    """

    session_id: int
    requester_open_id: str
    receive_id: str
    receive_id_type: str
    title: InSnapshot[str] = ""
    locale: str | None = None
    message_id: str | None = None
    status: TaskStatus = TaskStatus.RUNNING
    round: int = 0
    content: InSnapshot[str] = ""
    content_chars: InSnapshot[int] = 0  # length of the whole content, of which ``content`` is the head
    tools: InSnapshot[_ToolsById] = field(default_factory=dict)
    tools_dropped: InSnapshot[int] = 0  # older calls of this round no longer kept
    pending_asks: InSnapshot[_AsksById] = field(default_factory=dict)
    answered_asks: InSnapshot[_IdSet] = field(default_factory=dict)
    approvals: InSnapshot[_ApprovalsById] = field(default_factory=dict)
    resolved_approvals: InSnapshot[_IdSet] = field(default_factory=dict)
    disliked: bool = False
    notice: InSnapshot[Notice | None] = None
    error: InSnapshot[str] = ""
    started_at: InSnapshot[float] = 0.0
    last_event_at: float = 0.0
    retry_requested: InSnapshot[bool] = False
    image_keys: InSnapshot[dict[str, str]] = field(default_factory=dict)
    # Image refs whose upload is in flight (never saved: after a restart no upload is running).
    uploading_images: set[str] = field(default_factory=set)
    finished_at: InSnapshot[float | None] = None
    stop_reason: str | None = None  # why the card can no longer be updated (recalled, expired...)
    actions_applied: InSnapshot[int] = 0  # the last action-log id whose effect this state carries
    events_applied: InSnapshot[int] = 0  # the last event-log seq of this task whose batch this state carries
    # Digests of the Idempotency-Keys of the last batches applied: a repeat is answered, not applied.
    applied_batches: InSnapshot[_IdSet] = field(default_factory=dict)
    # ... and the digest of each one's events (``request_digest``): the key reused for others is refused.
    batch_bodies: InSnapshot[dict[str, str]] = field(default_factory=dict)
    fence: int = 0  # the writing epoch this process holds the card at (task_card.fence)
    card_id: str | None = None  # the CardKit card entity the message shows (None: PATCHed whole)
    app: str = "default"  # the Feishu/Lark app that sent the card and writes it (apps.py)

    # ----------------------------------------------------------------- events
    def check_batch(self, events: Sequence[ev.Event]) -> None:
        """Refuse a batch this task cannot take, before any of it is applied."""
        if self.status.is_terminal and not self._revived_by(events[0]):
            raise TaskFinished(f"task {self.session_id} has finished ({self.status.value})")
        for index, event in enumerate(events[:-1]):
            if isinstance(event, ev.FinishedEvent):
                raise EventRejected(f"events[{index + 1}]", "no event may follow 'finished' in a batch")
        self._check_room(events)

    def _revived_by(self, first: ev.Event) -> bool:
        # A failed or cancelled task whose requester clicked 重试 comes back with a status event.
        reviving = self.status in (TaskStatus.FAILED, TaskStatus.CANCELLED, TaskStatus.LOST)
        return self.retry_requested and reviving and isinstance(first, ev.StatusEvent)

    def _check_room(self, events: Sequence[ev.Event]) -> None:
        asks, approvals = set(self.pending_asks), set(self.approvals)
        for index, event in enumerate(events):
            if isinstance(event, ev.AskEvent):
                asks.add(event.ask_id)
                if len(asks) > MAX_PENDING:
                    raise EventRejected(f"events[{index}].ask_id", f"more than {MAX_PENDING} pending asks")
            elif isinstance(event, ev.ApprovalEvent):
                approvals.add(event.approval_id)
                if len(approvals) > MAX_PENDING:
                    raise EventRejected(
                        f"events[{index}].approval_id", f"more than {MAX_PENDING} pending approvals"
                    )
            elif isinstance(event, ev.StatusEvent | ev.FinishedEvent) and event.status != "WAITING":
                asks, approvals = set(), set()

    def apply(self, event: ev.Event) -> None:
        """Apply one runtime event (subagent events touch the database only: see runtime/applier.py)."""
        handler = _HANDLERS.get(type(event))
        if handler is not None:
            handler(self, event)

    def _status(self, event: ev.StatusEvent) -> None:
        if event.round > self.round:
            self.tools.clear()  # 本轮工具 shows the current round's calls
            self.tools_dropped = 0
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

    def _set_content(self, text: str) -> None:
        self.content = text[:CONTENT_KEEP_CHARS]
        self.content_chars = len(text)

    def _content(self, event: ev.ContentEvent) -> None:
        self._set_content(event.text)

    def _content_delta(self, event: ev.ContentDeltaEvent) -> None:
        room = CONTENT_KEEP_CHARS - len(self.content)
        if room > 0:
            self.content += event.text[:room]
        self.content_chars += len(event.text)

    def _keep_tool(self, call: ToolCall) -> None:
        if call.call_id not in self.tools and len(self.tools) >= MAX_TOOLS_KEPT:
            self.tools.pop(next(iter(self.tools)))
            self.tools_dropped += 1
        self.tools[call.call_id] = call

    def _tool_started(self, event: ev.ToolStartedEvent) -> None:
        self._keep_tool(ToolCall(event.call_id, event.name, bound_json(event.args)))

    def _tool_args(self, event: ev.ToolArgsEvent) -> None:
        call = self.tools.get(event.call_id)
        if call is not None:
            args = bound_json(event.args)
            self.tools[event.call_id] = ToolCall(call.call_id, call.name, args, call.result, call.finished)

    def _tool_finished(self, event: ev.ToolFinishedEvent) -> None:
        call = self.tools.get(event.call_id)
        name = call.name if call is not None else "tool"
        args = call.args if call is not None else None
        self._keep_tool(ToolCall(event.call_id, name, args, bound_json(event.result), True))

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
        self.approvals[event.approval_id] = PendingApproval(
            event.approval_id, event.tool_name, event.summary, event.allow_always
        )
        self.status = TaskStatus.WAITING

    def _finished(self, event: ev.FinishedEvent) -> None:
        self.status = TaskStatus(event.status)
        if event.content is not None:
            self._set_content(event.content)
        self.error = event.error or ""
        self._close_questions()

    def _close_questions(self) -> None:
        self.pending_asks.clear()
        self.approvals.clear()
        self.notice = None

    def end_batch(self, now: float) -> None:
        """After a batch: the runtime was heard from; a terminal state freezes the elapsed time."""
        self.last_event_at = now
        if self.status.is_terminal and self.finished_at is None:
            self.finished_at = now

    def add_uploaded_image(self, ref: str, image_key: str) -> None:
        """An image the runtime uploaded (``POST /v1/tasks/{id}/images``): tool results may name ``ref``."""
        if ref not in self.image_keys and len(self.image_keys) >= MAX_IMAGE_KEYS:
            raise TooManyImages("image", f"a task may hold at most {MAX_IMAGE_KEYS} images")
        self.image_keys[ref] = image_key

    def images_on_their_way(self, refs: Iterable[str]) -> None:
        """Images of a tool result being uploaded: the card says so (图片上传中) until they settle."""
        self.uploading_images.update(refs)

    def images_settled(self, refs: Iterable[str]) -> None:
        """Those uploads ended, each with a key or not (then the card says 图片不可达)."""
        self.uploading_images.difference_update(refs)

    def add_result_images(self, keys: Mapping[str, str]) -> None:
        """Images a tool result named, uploaded: {image_path or image_url: image_key}.

        Within the same cap as the runtime's uploads; past it an image stays 图片不可达 on the card.
        """
        for source, image_key in keys.items():
            if source in self.image_keys or len(self.image_keys) < MAX_IMAGE_KEYS:
                self.image_keys[source] = image_key

    # ----------------------------------------------------------------- clicks and housekeeping
    def mark_lost(self, now: float) -> None:
        """The runtime went silent: 失去联系."""
        self.status = TaskStatus.LOST
        self._close_questions()
        self.finished_at = now

    def request_cancel(self) -> None:
        self.notice = Notice.CANCELLING

    def request_retry(self) -> None:
        self.retry_requested = True
        self.notice = Notice.RETRYING

    def set_disliked(self, disliked: bool) -> None:
        self.disliked = disliked

    def sent_as(self, message_id: str, card_id: str | None = None) -> None:
        """The first card went out as ``message_id``, showing the CardKit entity ``card_id`` if any."""
        self.message_id = message_id
        self.card_id = card_id

    def hold_at(self, fence: int) -> None:
        """This process writes the card at writing epoch ``fence`` from now (task_card.fence)."""
        self.fence = fence

    def card_stopped(self, reason: str) -> None:
        """The card can never be updated again (recalled, expired, rejected)."""
        self.stop_reason = reason

    def logged_batch_applied(self, seq: int) -> None:
        """The event log's batch ``seq`` has had its effect (applied, or refused as it would be live)."""
        self.events_applied = seq

    def remember_batch(self, digest: str, body: str | None = None) -> None:
        """A batch with this Idempotency-Key digest was applied (``batch_digest``), with these events."""
        _remember(self.applied_batches, digest, MAX_REMEMBERED_BATCHES)
        if body is not None:
            self.batch_bodies[digest] = body
        for forgotten in [key for key in self.batch_bodies if key not in self.applied_batches]:
            del self.batch_bodies[forgotten]

    def reused_key(self, digest: str, body: str | None) -> bool:
        """Whether the key of an applied batch came back with other events (not a repeat: a reuse)."""
        earlier = self.batch_bodies.get(digest)
        return body is not None and earlier is not None and earlier != body

    def answer(self, ask_id: str) -> None:
        """The requester answered ``ask_id``: it leaves the form and is never accepted twice."""
        self.pending_asks.pop(ask_id, None)
        _remember(self.answered_asks, ask_id)
        self.notice = Notice.ANSWERS_SUBMITTED

    def decide(self, approval_id: str, approved: bool, always: bool = False) -> None:
        """The requester decided ``approval_id``; ``always``: approved for the rest of the task."""
        self.approvals.pop(approval_id, None)
        _remember(self.resolved_approvals, approval_id)
        self.notice = Notice.DENIED if not approved else Notice.APPROVED_ALWAYS if always else Notice.APPROVED

    def apply_logged_action(self, action_id: int, kind: str, payload: Mapping[str, Any]) -> None:
        """Apply a click recorded in the action log as ``action_id``, once (by id).

        A click is logged before it changes the task (runtime/card_actions.py), which then applies it here
        at once. When the process that applied it died before saving, or another instance recorded it
        while the owner was out of reach, whoever holds the task next replays it from the log through
        this same method, so a live click and a replayed one can never mean different things.
        """
        if action_id <= self.actions_applied:
            return
        self.actions_applied = action_id
        self.apply_action(kind, payload)

    def apply_action(self, kind: str, payload: Mapping[str, Any]) -> None:
        """The one interpreter of a recorded click: what it changes in the task's state now.

        The same rules the card's answer is decided by: a click the task has moved past (a cancel or
        an answer after the end, a retry of a task that is not failed) changes nothing.
        """
        ask_id, approval_id = payload.get("ask_id"), payload.get("approval_id")
        if kind == "dislike":
            self.set_disliked(payload.get("disliked") is True)
        elif kind == "retry":
            if self.status in RETRYABLE:
                self.request_retry()
        elif self.status.is_terminal:
            return  # a cancel, answer or approval the task finished before
        elif kind == "cancel":
            self.request_cancel()
        elif kind == "answers" and isinstance(ask_id, str) and ask_id in self.pending_asks:
            self.answer(ask_id)
        elif kind == "approval" and isinstance(approval_id, str) and approval_id in self.approvals:
            self.decide(approval_id, payload.get("approved") is True, payload.get("always") is True)

    # ----------------------------------------------------------------- views
    def card_state(self) -> CardState:
        """What the live card shows."""
        panels = CardPanels(
            status=self.status,
            round=self.round,
            tools=tuple(self.tools.values()),
            earlier_tools=self.tools_dropped,
            pending_asks=tuple(self.pending_asks.values()),
            pending_approvals=tuple(self.approvals.values()),
            disliked=self.disliked,
            notice=self.notice,
            error=self.error,
            image_keys={**dict.fromkeys(self.uploading_images, IMAGE_UPLOADING), **self.image_keys},
            finished_at=self.finished_at if self.status.is_terminal else None,
        )
        return CardState(panels, self.content, self.content_chars)

    # ----------------------------------------------------------------- snapshot
    def to_snapshot(self) -> str:
        """The snapshot as stored: the ``InSnapshot`` fields (cheap to call on the loop)."""
        return dump_snapshot(self)

    def _within_bounds(self) -> None:
        """A restored state within today's bounds (a v1 snapshot kept the whole content and every call)."""
        self.content_chars = max(self.content_chars, len(self.content))
        self.content = self.content[:CONTENT_KEEP_CHARS]
        for stale in list(self.tools)[:-MAX_TOOLS_KEPT]:
            del self.tools[stale]
            self.tools_dropped += 1
        self.batch_bodies = {
            key: body for key, body in self.batch_bodies.items() if key in self.applied_batches
        }


SNAPSHOT: TypeAdapter[TaskState] = TypeAdapter(TaskState)
SAVED_FIELDS = frozenset(
    name
    for name, hint in get_type_hints(TaskState, include_extras=True).items()
    if _IN_SNAPSHOT in getattr(hint, "__metadata__", ())
)
_INCLUDE = set(SAVED_FIELDS)  # the adapter's ``include`` takes a set


class Restored(NamedTuple):
    """A state loaded from its card row and snapshot, and the saved fields that were damaged (dropped)."""

    state: TaskState
    damaged: frozenset[str]


def dump_snapshot(state: TaskState) -> str:
    """``state``'s snapshot as stored: JSON of its ``InSnapshot`` fields, led by the version of that shape."""
    body = SNAPSHOT.dump_json(state, include=_INCLUDE, fallback=str)
    # The version is not a field of the state: it leads the object the adapter wrote ('{"title":...').
    return f'{{"v":{SNAPSHOT_VERSION},' + body[1:].decode()


def restore(row: Mapping[str, Any], snapshot: str | None) -> Restored:
    """A task from its card row's values (by TaskState field name) and the snapshot saved with them.

    Any snapshot written so far loads (v1 lacks the newer fields: they keep their defaults). A saved value
    that is empty keeps the row's value or the default (a v1 task without its title kept the session's);
    a damaged snapshot, or a damaged field of one, is dropped and named, never fatal.
    """
    saved = _saved_values(snapshot)
    damaged = frozenset({"snapshot"}) if saved is None else frozenset()
    values = {**row, **(saved or {})}
    try:
        state = SNAPSHOT.validate_python(values)
    except ValidationError as exc:
        damaged = frozenset(str(error["loc"][0]) for error in exc.errors() if error["loc"]) & SAVED_FIELDS
        state = SNAPSHOT.validate_python(
            {name: value for name, value in values.items() if name not in damaged}
        )
    state._within_bounds()
    return Restored(state, damaged)


def _saved_values(snapshot: str | None) -> dict[str, Any] | None:
    """The saved fields a snapshot holds, but the empty ones; None when it is not a JSON object."""
    if not snapshot:
        return {}
    try:
        data = json.loads(snapshot)
    except ValueError:
        return None
    if not isinstance(data, dict):
        return None
    return {name: value for name, value in data.items() if name in SAVED_FIELDS and value}


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
