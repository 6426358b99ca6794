"""The runtime API's response bodies (docs/openapi.json): every 2xx body and the one error body.

The task service returns these models, the handlers send exactly their JSON, the OpenAPI document
(``web/openapi.py``) is generated from them and the Python client (``feishu_progress.client``) parses
answers with them: what the service sends, what the contract says and what the client expects are one
definition. Unknown fields are ignored when a body is parsed, so a client keeps working against a newer
service that adds a field.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, JsonValue, TypeAdapter
from pydantic.json_schema import SkipJsonSchema

from feishu_progress.domain import TaskStatus

DATE_TIME: dict[str, JsonValue] = {"format": "date-time"}


class _Body(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)

    def json_body(self) -> dict[str, Any]:
        """The body as sent (fields that are None only where the model says they are absent)."""
        return self.model_dump(mode="json", by_alias=True)


class TaskCreated(_Body):
    """``201``: the task and the Feishu message its card lives in (the same task again for a repeated key)."""

    session_id: int = Field(description="The task's id: the agent's own session id when it gave one.")
    message_id: str = Field(description="The Feishu message id (om_...) of the task's card.")


class EventsAccepted(_Body):
    """``202``: the whole batch was applied, in order."""

    accepted: int = Field(ge=0, description="How many events of the batch were applied.")


class TaskView(_Body):
    """``200``: the task as the service holds it now, and the card as it would be sent now."""

    session_id: int
    status: TaskStatus = Field(description="LOST: no event for FP_TASK__STALE_AFTER, shown as 失去联系.")
    round: int = Field(ge=0)
    message_id: str | None = Field(description="The card's Feishu message id.")
    disliked: bool = Field(description="Whether the requester's 点踩 is on.")
    stop_reason: str | None = Field(
        description="Why the card is no longer updated (recalled, deleted, past Feishu's 14-day window), "
        "or null while it is."
    )
    card: dict[str, Any] = Field(description="The current card, Feishu card JSON 2.0.")
    app: str = Field(description="The Feishu/Lark app the card belongs to (FP_APPS_FILE; `default`).")


class EmptyPayload(_Body):
    """A cancel or retry click carries nothing more."""


class DislikePayload(_Body):
    disliked: bool = Field(description="The new state of the 点踩 button (a second click takes it back).")


class Answer(_Body):
    question: str
    selected_labels: list[str] = Field(description="The labels of the chosen options, in option order.")
    custom_input: str = Field(description="What the user typed (the '其他' input); empty when nothing.")


class AnswersPayload(_Body):
    ask_id: str = Field(description="The ``ask_id`` of the ``ask`` event answered.")
    answers: list[Answer] = Field(description="One per question of the ask, in order.")


class ApprovalPayload(_Body):
    # ``always`` is always sent (its default is for action rows recorded before it existed).
    model_config = ConfigDict(extra="ignore", frozen=True, json_schema_serialization_defaults_required=True)

    approval_id: str = Field(description="The ``approval_id`` of the ``approval`` event decided.")
    tool_name: str
    approved: bool
    always: bool = Field(
        default=False,
        description="The user clicked 始终允许(本任务) (offered only when the ``approval`` event had "
        "``allow_always``): approved, and later calls of ``tool_name`` in this task run without asking.",
    )


class _Action(_Body):
    cursor: int = Field(ge=1, description="Pass it as ``after`` to read only what came later.")
    operator_open_id: str = Field(description="Who clicked (the requester, or a chat member when allowed).")
    created_at: str = Field(
        json_schema_extra=DATE_TIME, description="When the click was recorded (UTC, ISO 8601)."
    )


class CancelAction(_Action):
    """The user clicked 取消任务: stop the task and send ``finished`` CANCELLED."""

    kind: Literal["cancel"]
    payload: EmptyPayload


class RetryAction(_Action):
    """The user clicked 重试 on a FAILED (or LOST) task."""

    kind: Literal["retry"]
    payload: EmptyPayload


class DislikeAction(_Action):
    """The user toggled 点踩."""

    kind: Literal["dislike"]
    payload: DislikePayload


class AnswersAction(_Action):
    """The user submitted the form of an ``ask``."""

    kind: Literal["answers"]
    payload: AnswersPayload


class ApprovalAction(_Action):
    """The user approved or denied an ``approval``."""

    kind: Literal["approval"]
    payload: ApprovalPayload


UserAction = Annotated[
    CancelAction | RetryAction | DislikeAction | AnswersAction | ApprovalAction,
    Field(discriminator="kind"),
]
USER_ACTION: TypeAdapter[UserAction] = TypeAdapter(UserAction)


class ActionsPage(_Body):
    """``200``: the user actions after the cursor asked for (at most 100), oldest first."""

    actions: list[UserAction]
    cursor: int = Field(
        ge=0, description="The last action's cursor, or the ``after`` asked for when there is none."
    )


class ImageUploaded(_Body):
    """``201``: the image is uploaded; a tool result names it by ``image_ref``."""

    image_ref: str = Field(
        pattern=r"^fpimg:[0-9a-f]{32}$",
        description="Put it in a generate_image/edit_image result as ``image_url`` (or ``image_path``). "
        "The same bytes give the same ref.",
    )
    image_key: str = Field(description="Feishu's image_key of the upload.")
    mime: Literal["image/png", "image/jpeg", "image/gif", "image/webp"]
    bytes: int = Field(ge=1)


def absent_when_none(schema: dict[str, Any]) -> None:
    # The field is left out of the body when it has no value: its schema shows no null default.
    schema.pop("default", None)


class ErrorBody(_Body):
    """Every error any endpoint answers: a stable machine code, a sentence for people, maybe more."""

    error: str = Field(description="A stable code such as ``unknown_task`` or ``invalid_event``.")
    message: str = Field(description="For people; may change between versions.")
    field: str | SkipJsonSchema[None] = Field(
        default=None,
        json_schema_extra=absent_when_none,
        description="On a 422: which field is wrong, as the request wrote it (``events[3].call_id``). "
        "Absent otherwise.",
    )
    retry_after: Annotated[int, Field(ge=0)] | SkipJsonSchema[None] = Field(
        default=None,
        json_schema_extra=absent_when_none,
        description="On a 503: seconds to wait before retrying (also in the Retry-After header). "
        "Absent otherwise.",
    )

    def json_body(self) -> dict[str, Any]:
        return self.model_dump(mode="json", exclude_none=True)


RESPONSE_MODELS: tuple[type[BaseModel], ...] = (
    TaskCreated,
    EventsAccepted,
    TaskView,
    ActionsPage,
    ImageUploaded,
    ErrorBody,
)
