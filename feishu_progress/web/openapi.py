"""The runtime API's contract as an OpenAPI 3.1 document, generated from the models the service uses.

Request schemas are the pydantic models that validate requests (``runtime/events.py``); response schemas
are the models the handlers build their JSON from (``runtime/responses.py``); pydantic writes JSON Schema
2020-12, which OpenAPI 3.1 uses as is. Nothing here is written by hand but the paths, their parameters,
the statuses each endpoint answers, and the examples (``openapi_examples.py``, real payloads).

The document is served at ``GET /v1/openapi.json`` without the bearer token — the contract is not a
secret, and a client generator must be able to read it before it is configured — and committed as
``docs/openapi.json`` (``feishu-progress openapi > docs/openapi.json``; a test keeps the copy equal).
The admin listener (health, readiness, metrics, live cards: its own port, for operators) and the sandbox
preview page (only next to a sandbox) are not part of this contract.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping
from typing import Any

from aiohttp import web
from pydantic import BaseModel, ConfigDict, Field
from pydantic.json_schema import JsonSchemaMode, SkipJsonSchema, models_json_schema

from feishu_progress import __version__
from feishu_progress.config import MAX_IMAGE_BYTES
from feishu_progress.errors import REUSED_KEY
from feishu_progress.feishu.callback import ToastType
from feishu_progress.runtime.events import (
    APP_NAME_PATTERN,
    MAX_EVENTS_PER_BATCH,
    CreateTaskRequest,
    EventBatch,
)
from feishu_progress.runtime.responses import RESPONSE_MODELS, absent_when_none
from feishu_progress.web import openapi_examples as ex
from feishu_progress.web.api import MAX_EVENT_BODY, MAX_IDEMPOTENCY_KEY_CHARS, MAX_WAIT_SECONDS

OPENAPI_PATH = "/v1/openapi.json"
SCHEMA_REF = "#/components/schemas/{model}"
JSON = "application/json"

DESCRIPTION = f"""\
An agent runtime (any language) creates a task, posts its events, and reads back what the user
clicked on the task's Feishu card. The service keeps one live card per task.

**Authentication.** Every `/v1/` call but this document needs `Authorization: Bearer <FP_API__TOKEN>`
(a service without a token — sandbox mode on loopback only — accepts calls without one).

**Errors.** Every error is `{{"error": "<code>", "message": "..."}}` (`ErrorBody`): `field` names the
offending field on a 422, `retry_after` (and the `Retry-After` header) the seconds to wait on a 503.
A 503 is a failure on the service's side (Feishu or the database): retry it. Any other method on these
paths answers 405 `method_not_allowed` with the same body.

**Ids.** `session_id` is an integer (a JSON number) everywhere: `POST /v1/tasks`'s body and answer, and
`{{session_id}}` in the paths. The other ids in events (`call_id`, `task_id`, `child_session_id`) are text; a
number sent there is taken as its text.

**A failed tool call** is told by its `tool_finished` `result`: a non-blank `"error"` (a string, or an
object with a `"message"`) marks it failed with that reason, `"success": false` marks it failed without one.

**Limits.** A request body is at most {MAX_EVENT_BODY} bytes, a batch at most {MAX_EVENTS_PER_BATCH}
events, an image {MAX_IMAGE_BYTES} bytes; a long-poll waits at most {MAX_WAIT_SECONDS:g} s.

**Not here.** The admin listener (`FP_ADMIN__PORT`: `/healthz`, `/readyz`, `/metrics`, `/admin/cards`)
is for operators on its own port; the sandbox preview (`/sandbox/`) exists only next to a sandbox.
The Python client `feishu_progress.client` speaks this API.
"""


# -- Feishu's side of POST /feishu/callback (documented here only; the pipeline renders the answer) ----


class _Feishu(BaseModel):
    model_config = ConfigDict(extra="allow")


class EncryptedCallback(_Feishu):
    """What Feishu posts when an Encrypt Key is set: the event, AES-256-CBC encrypted, base64."""

    encrypt: str


class CallbackToast(_Feishu):
    type: ToastType
    content: str = Field(description="In the card's first locale.")
    i18n: dict[str, str] | SkipJsonSchema[None] = Field(
        default=None,
        json_schema_extra=absent_when_none,
        description="Per Feishu locale code, for the viewer's language.",
    )


class CallbackCard(_Feishu):
    type: str = Field(description="Always ``raw``.")
    data: dict[str, Any] = Field(description="The card after the click, Feishu card JSON 2.0.")


class CallbackAnswer(_Feishu):
    """The answer to a click: a toast for the user and, for a PATCHed card (``FP_CARD__TRANSPORT=patch``),
    the card as it is now. A CardKit card gets no card in the answer: Feishu does not update a streaming
    card entity from a callback answer; the click's change is written to the entity at once instead."""

    toast: CallbackToast | SkipJsonSchema[None] = Field(default=None, json_schema_extra=absent_when_none)
    card: CallbackCard | SkipJsonSchema[None] = Field(default=None, json_schema_extra=absent_when_none)


class UrlVerificationAnswer(_Feishu):
    """The answer to Feishu's URL check: its challenge, echoed."""

    challenge: str


FEISHU_MODELS: tuple[type[BaseModel], ...] = (EncryptedCallback, CallbackAnswer, UrlVerificationAnswer)


# -- helpers -----------------------------------------------------------------------------------------


def _ref(name: str, kind: str = "schemas") -> dict[str, str]:
    return {"$ref": f"#/components/{kind}/{name}"}


def _examples(examples: Mapping[str, Any]) -> dict[str, Any]:
    return {name: {"value": value} for name, value in examples.items()}


def _success(description: str, schema: str, examples: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "description": description,
        "content": {JSON: {"schema": _ref(schema), "examples": _examples(examples)}},
    }


def _error(description: str, *examples: ex.ErrorExample, retry: bool = False) -> dict[str, Any]:
    bodies = {name: {"error": code, "message": message, **extra} for name, code, message, extra in examples}
    response: dict[str, Any] = {
        "description": description,
        "content": {JSON: {"schema": _ref("ErrorBody"), "examples": _examples(bodies)}},
    }
    if retry:
        response["headers"] = {"Retry-After": _ref("RetryAfter", "headers")}
    return response


def _shared(*names: str) -> dict[str, Any]:
    """References to the shared responses, keyed by their status."""
    return {SHARED_STATUS[name]: _ref(name, "responses") for name in names}


SHARED_STATUS = {
    "InvalidJson": "400",
    "Unauthorized": "401",
    "UnknownTask": "404",
    "BodyTimeout": "408",
    "BodyTooLarge": "413",
    "NotJson": "415",
    "Unavailable": "503",
}


def _shared_responses() -> dict[str, Any]:
    return {
        "InvalidJson": _error("The body is not JSON.", ex.INVALID_JSON),
        "Unauthorized": _error("No or a wrong bearer token.", ex.UNAUTHORIZED),
        "UnknownTask": _error("No task with that session id.", ex.UNKNOWN_TASK),
        "BodyTimeout": _error("The body did not arrive within 10 s.", ex.SLOW_BODY),
        "BodyTooLarge": _error("The body is over the limit.", ex.TOO_LARGE),
        "NotJson": _error("The body is not application/json.", ex.NOT_JSON),
        "Unavailable": _error(
            "Feishu or the database failed: retry after `retry_after` s.", ex.UNAVAILABLE, retry=True
        ),
    }


def _parameters() -> dict[str, Any]:
    return {
        "SessionId": {
            "name": "session_id",
            "in": "path",
            "required": True,
            "description": "The task's id, as `POST /v1/tasks` answered it.",
            "schema": {"type": "integer", "format": "int64", "minimum": 0, "maximum": 2**63 - 1},
        },
        "IdempotencyKey": {
            "name": "Idempotency-Key",
            "in": "header",
            "required": False,
            "description": "Makes the request safe to repeat. A create: the same key answers the same "
            "task (and a create whose first card failed resumes with the same Feishu dedupe uuid). A batch "
            "of events: the same key on the same task is answered again without applying it twice (the "
            "task remembers its last 64 batch keys); send a new key per batch and the same one on a retry.",
            "schema": {"type": "string", "minLength": 1, "maxLength": MAX_IDEMPOTENCY_KEY_CHARS},
        },
        "After": {
            "name": "after",
            "in": "query",
            "required": False,
            "description": "The cursor of the last action already read (0: from the start).",
            "schema": {"type": "integer", "minimum": 0, "default": 0},
        },
        "Wait": {
            "name": "wait",
            "in": "query",
            "required": False,
            "description": "Seconds to wait for a first action when there is none yet (long-poll).",
            "schema": {"type": "number", "minimum": 0, "maximum": MAX_WAIT_SECONDS, "default": 0},
        },
    }


# -- the components ------------------------------------------------------------------------------------


def _component_schemas() -> dict[str, Any]:
    models: list[tuple[type[BaseModel], JsonSchemaMode]] = [
        (CreateTaskRequest, "validation"),
        (EventBatch, "validation"),
        *((model, "serialization") for model in RESPONSE_MODELS),
        (EncryptedCallback, "validation"),
        *((model, "serialization") for model in FEISHU_MODELS[1:]),
    ]
    _, top = models_json_schema(models, ref_template=SCHEMA_REF)
    schemas: dict[str, Any] = top["$defs"]
    event = _name_union(schemas, "EventBatch", "events", "Event", "One event; `type` says which.")
    _name_union(schemas, "ActionsPage", "actions", "UserAction", "One user action; `kind` says which.")
    for kind, target in event["discriminator"]["mapping"].items():
        schemas[target.rsplit("/", 1)[1]]["examples"] = [ex.EVENT_EXAMPLES[kind]]
    return dict(sorted(schemas.items()))


def _name_union(
    schemas: dict[str, Any], owner: str, field: str, name: str, description: str
) -> dict[str, Any]:
    """Give the discriminated union of ``owner.field``'s items a component of its own: ``name``."""
    items = schemas[owner]["properties"][field]["items"]
    schemas[name] = {"description": description, **items}
    schemas[owner]["properties"][field]["items"] = _ref(name)
    union: dict[str, Any] = schemas[name]
    return union


def _components() -> dict[str, Any]:
    return {
        "schemas": _component_schemas(),
        "parameters": _parameters(),
        "responses": _shared_responses(),
        "headers": {
            "RetryAfter": {
                "description": "Seconds to wait before retrying (the body's `retry_after`).",
                "schema": {"type": "integer", "minimum": 0},
            }
        },
        "securitySchemes": {
            "bearerAuth": {
                "type": "http",
                "scheme": "bearer",
                "description": "FP_API__TOKEN, as `Authorization: Bearer <token>`.",
            }
        },
    }


# -- the paths -------------------------------------------------------------------------------------------


def _create_task() -> dict[str, Any]:
    return {
        "operationId": "createTask",
        "tags": ["tasks"],
        "summary": "Create a task and send its first card",
        "description": "Sends the first card (「任务已接收,正在准备执行。」) to the chat or user, "
        "or as a reply. Without an `Idempotency-Key`, a create whose first card cannot be sent leaves "
        "nothing behind.",
        "parameters": [_ref("IdempotencyKey", "parameters")],
        "requestBody": {
            "required": True,
            "content": {JSON: {"schema": _ref("CreateTaskRequest"), "examples": ex.CREATE_TASK_EXAMPLES}},
        },
        "responses": {
            "201": _success(
                "The task (the same one again for a repeated key).",
                "TaskCreated",
                {"created": ex.TASK_CREATED_EXAMPLE},
            ),
            **_shared("InvalidJson", "Unauthorized", "BodyTimeout"),
            "409": _error(
                "`session_id` is another task's.", ("task_exists", "task_exists", "task 42 exists", {})
            ),
            **_shared("BodyTooLarge", "NotJson"),
            "422": _error(
                "A field (or the Idempotency-Key) is wrong; `field` names it.",
                ("missing", "invalid_request", "Field required", {"field": "requester_open_id"}),
                ("reused_key", "invalid_request", REUSED_KEY, {"field": "Idempotency-Key"}),
                (
                    "bad_locale",
                    "invalid_request",
                    "Value error, unknown locale 'en'; use a Feishu code such as zh_cn or en_us",
                    {"field": "locale"},
                ),
                (
                    "unknown_app",
                    "unknown_app",
                    "unknown app 'sales'; known apps: default, research",
                    {"field": "app"},
                ),
            ),
            "503": _error(
                "Feishu did not take the first card, the send budget is busy (the first card would wait past "
                "`FP_RATE__CREATE_WAIT_SECONDS`; `retry_after` is when the callers queued now have had their "
                "turn), or the database failed: retry after `retry_after` s with the same key (same task).",
                ex.FIRST_CARD_FAILED,
                ex.UNAVAILABLE,
                retry=True,
            ),
        },
    }


def _post_events() -> dict[str, Any]:
    return {
        "operationId": "postEvents",
        "tags": ["tasks"],
        "summary": "Apply a batch of events, in order",
        "description": "The batch is validated whole first: a rejected batch changes nothing. "
        "Consecutive `content_delta`s may be sent as one (the client coalesces them). With an "
        "`Idempotency-Key` a retried batch is applied once, whichever instance the retry reaches.",
        "parameters": [_ref("SessionId", "parameters"), _ref("IdempotencyKey", "parameters")],
        "requestBody": {
            "required": True,
            "content": {JSON: {"schema": _ref("EventBatch"), "examples": ex.EVENT_BATCH_EXAMPLES}},
        },
        "responses": {
            "202": _success(
                "Every event was applied.", "EventsAccepted", {"accepted": ex.EVENTS_ACCEPTED_EXAMPLE}
            ),
            **_shared("InvalidJson", "Unauthorized", "UnknownTask", "BodyTimeout"),
            "409": _error(
                "The task has finished: no event is accepted after `finished`.",
                ("task_finished", "task_finished", "task 42 has finished", {}),
            ),
            **_shared("BodyTooLarge", "NotJson"),
            "422": _error(
                "An event is wrong; `field` names it as the batch wrote it. Nothing was applied.",
                ("bad_field", "invalid_event", "Field required", {"field": "events[3].call_id"}),
                (
                    "bad_type",
                    "invalid_event",
                    "Input tag 'tool_start' found using 'type' does not match any of the expected tags",
                    {"field": "events[0].type"},
                ),
                ("too_deep", "too_deep", "the body nests arrays/objects more than 64 levels deep", {}),
                ("reused_key", "invalid_event", REUSED_KEY, {"field": "Idempotency-Key"}),
            ),
            "429": _error(
                "Too many large bodies (over 256 KiB) in progress: this one waited its turn "
                "(`FP_HTTP__LARGE_BODY_WAIT_SECONDS`) and was not read. Retry after `Retry-After` s.",
                ("too_busy", "too_busy", "too many large bodies in progress; retry", {"retry_after": 1}),
                retry=True,
            ),
            **_shared("Unavailable"),
        },
    }


def _get_task() -> dict[str, Any]:
    return {
        "operationId": "getTask",
        "tags": ["tasks"],
        "summary": "The task's status, round, message and current card",
        "parameters": [_ref("SessionId", "parameters")],
        "responses": {
            "200": _success("The task now.", "TaskView", {"running": ex.TASK_VIEW_EXAMPLE}),
            **_shared("Unauthorized", "UnknownTask", "Unavailable"),
        },
    }


def _get_actions() -> dict[str, Any]:
    return {
        "operationId": "getActions",
        "tags": ["tasks"],
        "summary": "User actions after a cursor (long-poll)",
        "description": "Clicks on the card (cancel, retry, dislike, answers, approval), each recorded "
        "before the user was told it was taken. Answers at once when there are actions after `after`, "
        "else waits up to `wait` seconds for the first. Read on from the answer's `cursor`; a reader "
        "that stopped resumes from the last cursor it handled.",
        "parameters": [_ref(name, "parameters") for name in ("SessionId", "After", "Wait")],
        "responses": {
            "200": _success(
                "The actions (maybe none) and the cursor to read on from.",
                "ActionsPage",
                {"clicks": ex.ACTIONS_EXAMPLE, "none_yet": ex.NO_ACTIONS_EXAMPLE},
            ),
            **_shared("Unauthorized", "UnknownTask"),
            "422": _error(
                "`after` or `wait` is out of range.",
                ("bad_wait", "invalid_query", f"'after' >= 0 and 0 <= 'wait' <= {MAX_WAIT_SECONDS:g}", {}),
            ),
            **_shared("Unavailable"),
        },
    }


def _upload_image() -> dict[str, Any]:
    form = {
        "type": "object",
        "required": ["image"],
        "properties": {
            "image": {
                "type": "string",
                "contentMediaType": "application/octet-stream",
                "description": "PNG, JPEG, GIF or WEBP (told by its bytes, not its name).",
            }
        },
    }
    return {
        "operationId": "uploadImage",
        "tags": ["tasks"],
        "summary": "Hand over an image a tool produced",
        "description": "Uploads it to Feishu; a later `generate_image`/`edit_image` result names it "
        "by `image_ref` (as `image_url`) and the card shows it.",
        "parameters": [_ref("SessionId", "parameters")],
        "requestBody": {"required": True, "content": {"multipart/form-data": {"schema": form}}},
        "responses": {
            "201": _success("Uploaded.", "ImageUploaded", {"uploaded": ex.IMAGE_UPLOADED_EXAMPLE}),
            "400": _error(
                "The body is not valid multipart/form-data.",
                ("invalid_multipart", "invalid_multipart", "the body is not valid multipart/form-data", {}),
            ),
            **_shared("Unauthorized", "UnknownTask", "BodyTimeout"),
            "413": _error(
                "The image is over 10 MB.",
                ("too_large", "body_too_large", f"'image' is over {MAX_IMAGE_BYTES} bytes", {}),
            ),
            "415": _error(
                "The body is not multipart/form-data.",
                (
                    "not_multipart",
                    "unsupported_media_type",
                    "send multipart/form-data with a 'image' file",
                    {},
                ),
            ),
            "422": _error(
                "No `image` file, not an image, or the task holds too many.",
                ("no_file", "invalid_request", "no 'image' file in the form", {"field": "image"}),
                (
                    "not_an_image",
                    "invalid_image",
                    "not an image we can show: not_an_image",
                    {"field": "image"},
                ),
                ("too_many", "too_many_images", "a task may hold at most 100 images", {"field": "image"}),
                (
                    "too_many_pixels",
                    "invalid_image",
                    "not an image we can show: too_many_pixels",
                    {"field": "image"},
                ),
            ),
            "409": _error(
                "The task has finished: it takes no more images (nothing was uploaded).",
                ("task_finished", "task_finished", "task 42 has finished", {}),
            ),
            "429": _error(
                "Every upload slot (`FP_IMAGES__CONCURRENCY`) stayed taken for 2 s: the body was not "
                "read. Retry after `Retry-After` s.",
                ("too_busy", "too_busy", "every image upload slot is taken; retry", {"retry_after": 1}),
                retry=True,
            ),
            **_shared("Unavailable"),
        },
    }


def _get_openapi() -> dict[str, Any]:
    return {
        "operationId": "getOpenApi",
        "tags": ["contract"],
        "summary": "This document",
        "description": "Served without the bearer token: the contract is not a secret.",
        "security": [],
        "responses": {
            "200": {
                "description": "The OpenAPI 3.1 document.",
                "content": {JSON: {"schema": {"type": "object"}}},
            }
        },
    }


# What the callback endpoint refuses, by status: (description, (example name, error code, message)).
_CALLBACK_REFUSALS = {
    "400": ("A malformed callback.", ("malformed", "callback_rejected", "missing field event.action")),
    "401": (
        "A missing or wrong signature, or verification token.",
        ("bad_signature", "callback_rejected", "invalid signature"),
    ),
    "403": (
        "A timestamp outside the replay window.",
        ("stale", "callback_rejected", "stale X-Lark-Request-Timestamp: outside the 300 s window"),
    ),
    "408": (
        "The body did not arrive in time.",
        ("body_timeout", "body_timeout", "the body did not arrive within 10 s"),
    ),
    "413": (
        "The body is over FP_CALLBACK__MAX_BODY_BYTES.",
        ("too_large", "body_too_large", "the body is over 1048576 bytes"),
    ),
    "415": (
        "The body is not application/json.",
        ("not_json", "unsupported_media_type", "send application/json"),
    ),
}
_CALLBACK_ANSWERS = {
    "toast_and_card": {
        "toast": {
            "type": "success",
            "content": "回答已提交",
            "i18n": {"zh_cn": "回答已提交", "en_us": "Answers submitted"},
        },
        "card": {"type": "raw", "data": {"schema": "2.0", "body": {"elements": []}}},
    },
    "url_check": {"challenge": "ajls384kdjx98XX"},
}


def _feishu_callback(per_app: bool = False) -> dict[str, Any]:
    operation: dict[str, Any] = {
        "operationId": "feishuAppCallback" if per_app else "feishuCallback",
        "tags": ["feishu"],
        "summary": "Feishu's card callbacks (card.action.trigger) and URL check"
        + (" of one app" if per_app else " of the default app"),
        "description": "Feishu's side, not the runtime's: set it as the card callback request URL in the "
        "developer console. Signed (X-Lark-Signature over the raw body), encrypted when an Encrypt Key is "
        "set, answered within Feishu's 3-second deadline. Only for an app in webhook mode. "
        + (
            "Each app (FP_APPS_FILE) has its own URL, checked with that app's keys only; a click on a card "
            "of another app is refused. 404 for a name no webhook app has."
            if per_app
            else "The default app's (FP_FEISHU__*, or the only app); /feishu/callback/{app} is every app's."
        ),
        "security": [],
        "requestBody": {"required": True, "content": {JSON: {"schema": _callback_body_schema()}}},
        "responses": {
            "200": {
                "description": "A toast (and, for a PATCHed card, the card), or the URL check's challenge.",
                "content": {
                    JSON: {
                        "schema": {"anyOf": [_ref("CallbackAnswer"), _ref("UrlVerificationAnswer")]},
                        "examples": _examples(_CALLBACK_ANSWERS),
                    }
                },
            },
            **{
                status: _error(text, (name, code, message, {}))
                for status, (text, (name, code, message)) in _CALLBACK_REFUSALS.items()
            },
        },
    }
    if per_app:
        operation["parameters"] = [
            {
                "name": "app",
                "in": "path",
                "required": True,
                "description": "The app's name in FP_APPS_FILE (`default`: FP_FEISHU__*).",
                "schema": {"type": "string", "pattern": APP_NAME_PATTERN, "maxLength": 64},
            }
        ]
    return operation


def _callback_body_schema() -> dict[str, Any]:
    plain = {"type": "object", "description": "A plain (unencrypted) callback or url_verification."}
    return {"oneOf": [_ref("EncryptedCallback"), plain]}


def _paths() -> dict[str, Any]:
    return {
        "/v1/tasks": {"post": _create_task()},
        "/v1/tasks/{session_id}": {"get": _get_task()},
        "/v1/tasks/{session_id}/events": {"post": _post_events()},
        "/v1/tasks/{session_id}/actions": {"get": _get_actions()},
        "/v1/tasks/{session_id}/images": {"post": _upload_image()},
        OPENAPI_PATH: {"get": _get_openapi()},
        "/feishu/callback": {"post": _feishu_callback()},
        "/feishu/callback/{app}": {"post": _feishu_callback(per_app=True)},
    }


@functools.cache
def openapi_document() -> Mapping[str, Any]:
    """The OpenAPI 3.1 document (built once; do not change it: copy it)."""
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "feishu-progress runtime API",
            "version": __version__,
            "description": DESCRIPTION,
            "license": {"name": "MIT", "identifier": "MIT"},
        },
        "tags": [
            {"name": "tasks", "description": "What an agent runtime calls."},
            {"name": "contract", "description": "This document."},
            {"name": "feishu", "description": "What Feishu calls."},
        ],
        "security": [{"bearerAuth": []}],
        "paths": _paths(),
        "components": _components(),
    }


@functools.cache
def openapi_json() -> str:
    """The document as the committed ``docs/openapi.json`` holds it (2-space indent, UTF-8, final newline)."""
    return json.dumps(openapi_document(), ensure_ascii=False, indent=2) + "\n"


async def serve_openapi(request: web.Request) -> web.Response:
    """``GET /v1/openapi.json``."""
    return web.Response(text=openapi_json(), content_type=JSON)


def openapi_routes() -> list[web.RouteDef]:
    return [web.get(OPENAPI_PATH, serve_openapi)]
