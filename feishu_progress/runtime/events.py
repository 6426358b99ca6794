"""The runtime API's request models (README.md "The runtime API"; docs/openapi.json), validated with pydantic.

A batch is validated whole before anything is applied, so a rejected batch changes nothing.
Every model forbids unknown fields: a typo in an event is an error the runtime sees, not a field
silently dropped.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from feishu_progress.errors import EventRejected, RequestRejected
from feishu_progress.i18n.locales import FEISHU_LOCALES, SINGLE_LANGUAGE_LOCALES

_SHORT = 256
# What the database columns hold (db/models.py): a value the edge accepts must be savable, or a 202 would
# hide a state that can never reach the database (every save of it fails, for ever).
MAX_ROUND = 2**31 - 1  # INT columns (task_card.round, subagent_execution.total_rounds)
_REF = 64  # VARCHAR(64): open ids, message ids, subagent task refs
_RECEIVE_ID = 255  # VARCHAR(255)
M = TypeVar("M", bound=BaseModel)
MAX_EVENTS_PER_BATCH = 1000
MAX_TEXT = 1_000_000
MESSAGE_ID_PATTERN = (
    r"^om_[A-Za-z0-9_-]+$"  # a content event may carry a long answer; the card cuts it visibly
)

# An app's name is a URL path segment (/feishu/callback/<name>) and a VARCHAR(64) (task_card.app).
APP_NAME_PATTERN = r"^[a-z0-9][a-z0-9_-]*$"


class _Event(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def _integer_too(schema: dict[str, Any]) -> None:
    """JSON Schema of an id field: the ``_id_from_number`` validator takes integers as well as text."""
    if "anyOf" in schema:  # an optional id: text, integer or null
        schema["anyOf"].insert(1, {"type": "integer"})
        return
    text = {key: schema.pop(key) for key in ("type", "minLength", "maxLength") if key in schema}
    schema["anyOf"] = [text, {"type": "integer"}]


Id = Annotated[
    str,
    Field(
        min_length=1,
        max_length=_SHORT,
        json_schema_extra=_integer_too,
        description="Text; an integer is accepted and taken as its decimal text.",
    ),
]
RefId = Annotated[
    str,
    Field(
        min_length=1,
        max_length=_REF,
        json_schema_extra=_integer_too,
        description="Text (stored in a 64-character column); an integer is accepted as its decimal text.",
    ),
]
Round = Annotated[int, Field(ge=0, le=MAX_ROUND)]


def _id_from_number(value: Any) -> Any:
    # Runtimes written in other languages often send numeric ids; accept them as text.
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    return value


class StatusEvent(_Event):
    """The agent is working (RUNNING) or waiting for the user (WAITING) in this round."""

    type: Literal["status"]
    status: Literal["RUNNING", "WAITING"]
    round: Round


class ContentEvent(_Event):
    """The agent's whole text so far (replaces what the card shows)."""

    type: Literal["content"]
    text: str = Field(max_length=MAX_TEXT)


class ContentDeltaEvent(_Event):
    """More streamed text, appended to what the card shows."""

    type: Literal["content_delta"]
    text: str = Field(max_length=MAX_TEXT)


class ToolStartedEvent(_Event):
    """A tool call began; the card shows it as one line (a collapsible panel for rich results)."""

    type: Literal["tool_started"]
    call_id: Id
    name: Annotated[str, Field(min_length=1, max_length=_SHORT)]
    args: dict[str, Any] | None = None

    _ids = field_validator("call_id", mode="before")(_id_from_number)


class ToolArgsEvent(_Event):
    """The call's latest full arguments (may be partial while the model still streams them)."""

    type: Literal["tool_args"]
    call_id: Id
    args: dict[str, Any]

    _ids = field_validator("call_id", mode="before")(_id_from_number)


class ToolFinishedEvent(_Event):
    """The call ended; its result decides the line's failure reason and any rich view."""

    type: Literal["tool_finished"]
    call_id: Id
    result: Any = Field(
        default=None,
        description="A JSON object or string, exactly as the tool returned it (a string holding a JSON "
        "object is read as that object). The call is shown failed when the object has a non-blank "
        '`"error"` string, or an `"error"` object with a non-blank `"message"` (its first 40 characters '
        'are the reason), or `"success": false` (failed, no reason).',
    )

    _ids = field_validator("call_id", mode="before")(_id_from_number)


class RoundFinishedEvent(_Event):
    """The round's tool calls are done."""

    type: Literal["round_finished"]
    round: Round


class SubagentStartedEvent(_Event):
    """A subagent began; BACKGROUND and FOLLOWUP ones are listed on the card while they run."""

    type: Literal["subagent_started"]
    task_id: RefId
    child_session_id: Annotated[str, Field(max_length=64)] | None = Field(
        default=None, json_schema_extra=_integer_too
    )
    agent_type: Annotated[str, Field(max_length=64)] | None = None
    title: Annotated[str, Field(max_length=1000)] | None = None
    task_description: Annotated[str, Field(max_length=20_000)] | None = None
    invocation_type: Literal["BACKGROUND", "FOLLOWUP", "DELEGATE"] = "BACKGROUND"

    _ids = field_validator("task_id", "child_session_id", mode="before")(_id_from_number)


class SubagentRoundEvent(_Event):
    """A running subagent moved to another round."""

    type: Literal["subagent_round"]
    task_id: RefId
    round: Round

    _ids = field_validator("task_id", mode="before")(_id_from_number)


class SubagentStatusEvent(_Event):
    """A running subagent is recovering (or running again)."""

    type: Literal["subagent_status"]
    task_id: RefId
    status: Literal["RUNNING", "RECOVERING"]

    _ids = field_validator("task_id", mode="before")(_id_from_number)


class SubagentFinishedEvent(_Event):
    """A subagent ended; it leaves the card's running list."""

    type: Literal["subagent_finished"]
    task_id: RefId
    status: Literal["COMPLETED", "FAILED", "CANCELLED"]
    total_rounds: Round = 0

    _ids = field_validator("task_id", mode="before")(_id_from_number)


class AskOptionModel(_Event):
    """One choice of a question."""

    label: Annotated[str, Field(min_length=1, max_length=500)]
    description: Annotated[str, Field(max_length=2000)] = ""


def _string_options_too(schema: dict[str, Any]) -> None:
    """JSON Schema of ``options``: ``_plain_options`` takes a bare label for ``{"label": ...}``."""
    schema["items"] = {"anyOf": [schema["items"], {"type": "string", "minLength": 1, "maxLength": 500}]}


class AskQuestionModel(_Event):
    """One question; ``multiSelect`` lets the user pick several options."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    question: Annotated[str, Field(min_length=1, max_length=5000)]
    options: list[AskOptionModel] = Field(
        default_factory=list,
        max_length=100,
        json_schema_extra=_string_options_too,
        description="Choices, each ``{label, description?}`` or a bare label; none: a free-text answer.",
    )
    multi_select: bool = Field(default=False, alias="multiSelect")

    @field_validator("options", mode="before")
    @classmethod
    def _plain_options(cls, value: Any) -> Any:
        # Seed 001: an option is a bare string or {label, description}.
        if isinstance(value, list):
            return [{"label": item} if isinstance(item, str) else item for item in value]
        return value


class AskEvent(_Event):
    """The agent asks the user: the card shows a form (WAITING); the answers come back as an action."""

    type: Literal["ask"]
    ask_id: Id
    questions: list[AskQuestionModel] = Field(min_length=1, max_length=20)

    _ids = field_validator("ask_id", mode="before")(_id_from_number)


class ApprovalEvent(_Event):
    """A tool call waits for approval on the card: 同意 / 拒绝 (and 始终允许 with ``allow_always``)."""

    type: Literal["approval"]
    approval_id: Id
    tool_name: Annotated[str, Field(min_length=1, max_length=_SHORT)]
    summary: Annotated[str, Field(max_length=5000)] = ""
    allow_always: bool = Field(
        default=False,
        description="The runtime can honour 始终允许(本任务) (allow always for this task): the card shows "
        "that third button, and its click comes back as an `approval` action with `always: true`. The "
        "runtime then runs later calls of this `tool_name` in the task without asking again. Leave it "
        "false (the default) when the runtime cannot keep such a rule: the card offers 同意 / 拒绝 only.",
    )

    _ids = field_validator("approval_id", mode="before")(_id_from_number)


class FinishedEvent(_Event):
    """The task ended: the final card goes out (no event is accepted after it)."""

    type: Literal["finished"]
    status: Literal["COMPLETED", "FAILED", "CANCELLED"]
    content: str | None = Field(default=None, max_length=MAX_TEXT)
    error: Annotated[str, Field(max_length=5000)] | None = None


Event = Annotated[
    StatusEvent
    | ContentEvent
    | ContentDeltaEvent
    | ToolStartedEvent
    | ToolArgsEvent
    | ToolFinishedEvent
    | RoundFinishedEvent
    | SubagentStartedEvent
    | SubagentRoundEvent
    | SubagentStatusEvent
    | SubagentFinishedEvent
    | AskEvent
    | ApprovalEvent
    | FinishedEvent,
    Field(discriminator="type"),
]


class EventBatch(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    events: list[Event] = Field(min_length=1, max_length=MAX_EVENTS_PER_BATCH)


class CreateTaskRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    # The agent's own session id (the parent id in its database); generated when absent.
    session_id: int | None = Field(
        default=None,
        gt=0,
        lt=2**63,
        description="An integer (not text): the agent's own session id; generated when absent.",
    )
    receive_id: Annotated[str, Field(min_length=1, max_length=_RECEIVE_ID)]
    receive_id_type: Literal["chat_id", "open_id", "user_id", "union_id", "email"]
    requester_open_id: RefId
    title: Annotated[str, Field(max_length=255)] = ""
    # It goes into an Open API URL path: only the shape of a Feishu message id (om_...) may pass.
    reply_to_message_id: Annotated[str, Field(max_length=_REF, pattern=MESSAGE_ID_PATTERN)] | None = None
    locale: Annotated[str, Field(max_length=16)] | None = None
    # The Feishu/Lark app that sends the card (FP_APPS_FILE names them); omitted: the default app.
    app: Annotated[str, Field(min_length=1, max_length=64, pattern=APP_NAME_PATTERN)] | None = None

    @field_validator("locale")
    @classmethod
    def _known_locale(cls, value: str | None) -> str | None:
        # A typo ("en", "zh-CN") must not silently fall back to the default language.
        if value is not None and value not in (*FEISHU_LOCALES, *SINGLE_LANGUAGE_LOCALES):
            raise ValueError(f"unknown locale {value!r}; use a Feishu code such as zh_cn or en_us")
        return value


def error_location(loc: tuple[int | str, ...]) -> str:
    """pydantic's error location as the runtime wrote it: ``events[3].call_id``.

    The discriminator's tag (``tool_started``) that pydantic inserts into the path is dropped, because
    it is not a key of the runtime's JSON.
    """
    parts: list[str] = []
    for index, item in enumerate(loc):
        if isinstance(item, int):
            parts.append(f"[{item}]")
        elif index > 0 and isinstance(loc[index - 1], int) and loc[:1] == ("events",) and index == 2:
            continue  # the union member name
        else:
            parts.append(("." if parts else "") + item)
    return "".join(parts) or "<body>"


def parse_model(model: type[M], payload: Any, *, rejected: type[RequestRejected] = EventRejected) -> M:
    """Validate ``payload`` or raise ``rejected`` (an event batch's by default) naming the first bad field."""
    try:
        return model.model_validate(payload)
    except ValidationError as exc:
        first = exc.errors(include_url=False)[0]
        location = error_location(tuple(first["loc"]))
        if first["type"] in ("union_tag_invalid", "union_tag_not_found"):
            location += ".type"
        raise rejected(location, first["msg"]) from None
