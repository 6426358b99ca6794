"""The nouns of feishu-progress: frozen value objects shared by every room.

Nothing here does I/O. Everything is a frozen, slotted dataclass or an enum so that a snapshot
handed to the card builder can never change under it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any


class TaskStatus(StrEnum):
    """Where a task is in its life. The last four are terminal."""

    RUNNING = "RUNNING"
    WAITING = "WAITING"
    COMPLETED = "COMPLETED"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"
    LOST = "LOST"  # no event for FP_TASK__STALE_AFTER: shown as 失去联系

    @property
    def is_terminal(self) -> bool:
        return self in _TERMINAL


_TERMINAL = frozenset({TaskStatus.COMPLETED, TaskStatus.FAILED, TaskStatus.CANCELLED, TaskStatus.LOST})


class SubagentStatus(StrEnum):
    RUNNING = "RUNNING"
    RECOVERING = "RECOVERING"
    COMPLETED = "COMPLETED"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"


class InvocationType(StrEnum):
    BACKGROUND = "BACKGROUND"
    FOLLOWUP = "FOLLOWUP"
    DELEGATE = "DELEGATE"  # historical (seed 002 §1.3): stored, never shown


# An ``image_keys`` entry whose key is this marker: the image's upload is still on its way (the card
# says so, instead of 图片不可达). Riding in ``image_keys`` means every comparison of what the card shows
# (a pending upload ending with no key is a change) sees it without a field of its own.
IMAGE_UPLOADING = ""


@dataclass(frozen=True, slots=True)
class SubagentSummary:
    """One running subagent as the card shows it (seed 002 §4.1.3)."""

    task_id: int
    agent_type: str | None
    title: str
    status: str
    round: int


@dataclass(frozen=True, slots=True)
class ToolCall:
    """One tool call of the current round, exactly as the runtime reported it.

    ``args`` is the latest full argument object (possibly partial while streaming); ``result`` is the
    tool's return value (a JSON object, list, string...) once ``finished``. The card turns this into a
    one-line summary and, where it can, a rich view; nothing is interpreted here.
    """

    call_id: str
    name: str
    args: Mapping[str, Any] | None = None
    result: Any = None
    finished: bool = False


@dataclass(frozen=True, slots=True)
class AskOption:
    label: str
    description: str = ""


@dataclass(frozen=True, slots=True)
class AskQuestion:
    question: str
    options: tuple[AskOption, ...] = ()
    multi_select: bool = False


@dataclass(frozen=True, slots=True)
class PendingAsk:
    """Questions the agent waits on; the card shows them as a form."""

    ask_id: str
    questions: tuple[AskQuestion, ...]


@dataclass(frozen=True, slots=True)
class PendingApproval:
    """A tool call the agent may only run after the requester approves it."""

    approval_id: str
    tool_name: str
    summary: str = ""
    # The runtime can honour 始终允许(本任务): later calls of this tool in the task need no approval.
    allow_always: bool = False


class Notice(StrEnum):
    """A transient line shown right after a click, until the runtime catches up."""

    CANCELLING = "cancelling"  # 正在取消…
    RETRYING = "retrying"  # 正在重试…
    ANSWERS_SUBMITTED = "answers_submitted"  # 已提交回答
    APPROVED = "approved"
    APPROVED_ALWAYS = "approved_always"  # approved, and the tool is not asked about again in the task
    DENIED = "denied"


@dataclass(frozen=True, slots=True)
class CardPanels:
    """Everything a task's card shows besides its answer text, declared once.

    The task's state builds it, the live card compares it whole (a CardKit card streams the text on its
    own and rewrites the panels only when these differ), and the card builder reads it through CardModel.
    """

    status: TaskStatus = TaskStatus.RUNNING
    round: int = 0
    tools: tuple[ToolCall, ...] = ()
    earlier_tools: int = 0  # calls of this round before ``tools`` that are no longer kept
    pending_asks: tuple[PendingAsk, ...] = ()
    pending_approvals: tuple[PendingApproval, ...] = ()
    disliked: bool = False
    notice: Notice | None = None
    error: str = ""
    image_keys: Mapping[str, str] = field(default_factory=dict)
    finished_at: float | None = None  # wall-clock seconds when the task ended: elapsed time freezes there


@dataclass(frozen=True, slots=True)
class CardState:
    """The newest state of a task's card, as the task service records it on the live card."""

    panels: CardPanels = field(default_factory=CardPanels)
    content: str = ""
    content_chars: int = 0  # the whole content's length; ``content`` may be only its head

    @property
    def status(self) -> TaskStatus:
        """The panels' status: it decides the card's life (subagents, streaming, the final write)."""
        return self.panels.status


def elapsed_ms(started_at: float, now: float, finished_at: float | None = None) -> int:
    """Milliseconds from ``started_at`` to ``now`` (wall clock), frozen at ``finished_at``; never negative."""
    end = finished_at if finished_at is not None else now
    return max(0, int((end - started_at) * 1000))


@dataclass(frozen=True, slots=True)
class CardModel:
    """Everything the progress card is built from. Pure data: the builder reads no clock.

    ``elapsed_ms`` is computed by the caller at build time; ``panels.image_keys`` maps an image's
    path or URL (as it appears in a tool result) to its uploaded Feishu image_key, or to
    ``IMAGE_UPLOADING`` while its upload is in flight.
    """

    session_id: int
    panels: CardPanels = field(default_factory=CardPanels)
    content: str = ""
    content_chars: int = 0  # the whole content's length when ``content`` is only its head
    title: str = ""
    subagents: tuple[SubagentSummary, ...] = ()
    elapsed_ms: int = 0
    locales: tuple[str, ...] = ("zh_cn", "en_us")
    session_detail_url: str | None = None

    @classmethod
    def from_state(
        cls,
        state: CardState,
        *,
        session_id: int,
        title: str,
        locales: tuple[str, ...],
        session_detail_url: str | None,
        started_at: float,
        now: float,
        subagents: tuple[SubagentSummary, ...] = (),
    ) -> CardModel:
        """The one way to build a CardModel: a card's recorded state plus what never changes for it.

        Running subagents are shown only while RUNNING (seed 002 §4.2.2: a terminal card has none),
        and the elapsed time stops at ``panels.finished_at``. ``now`` and ``started_at`` are wall-clock
        seconds, read by the caller: the card builder reads no clock.
        """
        panels = state.panels
        return cls(
            session_id=session_id,
            panels=panels,
            content=state.content,
            content_chars=state.content_chars,
            title=title,
            subagents=subagents if panels.status is TaskStatus.RUNNING else (),
            elapsed_ms=elapsed_ms(started_at, now, panels.finished_at),
            locales=locales,
            session_detail_url=session_detail_url,
        )
