"""Rich views that tools/ parses out of tool results and cards/ renders (images, answers, subagents, asktool).

Strings inside these objects are raw, untrusted text (paths, queries, model output): cards/
escapes every one of them when it renders.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from feishu_progress.domain import AskQuestion


@dataclass(frozen=True, slots=True)
class ImageItem:
    url: str | None
    path: str | None
    size_bytes: int | None
    mime: str | None  # e.g. "image/png"


@dataclass(frozen=True, slots=True)
class ImageGridView:
    """generate_image / edit_image result (seed 000 §4 step 2-3, D1, D5)."""

    prompt: str
    model: str
    size: str
    items: tuple[ImageItem, ...]  # every image; the card shows the first 9


@dataclass(frozen=True, slots=True)
class AskAnswer:
    question: str
    labels: tuple[str, ...]
    custom_input: str  # "" when none


@dataclass(frozen=True, slots=True)
class AskAnswersView:
    """ask_user_questions answers (seed 000 goal 3)."""

    answers: tuple[AskAnswer, ...]


class StatusKind(StrEnum):
    RUNNING = "running"
    OK = "ok"
    FAIL = "fail"
    MUTED = "muted"


@dataclass(frozen=True, slots=True)
class SubagentRow:
    task_id: str  # as the tool reported it ("" when absent)
    agent_type: str
    status: str
    status_kind: StatusKind
    rounds: int | None
    tool_calls: int | None
    prompt_tokens: int | None
    completion_tokens: int | None
    recent_output: str


@dataclass(frozen=True, slots=True)
class WaitSummary:
    completed: int
    all_completed: bool
    timed_out: bool


@dataclass(frozen=True, slots=True)
class SubagentRowsView:
    """check_subagent / wait_subagents (timeout branch) progress rows (seed 000 goal 4, D3)."""

    rows: tuple[SubagentRow, ...]
    wait: WaitSummary | None = None


class AskToolHeadline(StrEnum):
    ANSWERED = "answered"
    UNANSWERED = "unanswered"
    PENDING = "pending"


@dataclass(frozen=True, slots=True)
class AskToolView:
    """asktool answer summary (seed 001 §4.1): questions from args, answers from the result text.

    ``answers[i]`` is None when question i was skipped or the whole ask declined; all None with
    ``pending`` False means declined. ``pending`` means no result text yet.
    """

    questions: tuple[AskQuestion, ...]
    answers: tuple[tuple[str, ...] | None, ...]
    pending: bool
    headline: AskToolHeadline
    answered: int


ToolView = ImageGridView | AskAnswersView | SubagentRowsView | AskToolView
