"""The one table of what the service's errors answer over HTTP (web/http.py ``domain_answer``).

Every route lets the service's errors rise to the ``json_errors`` middleware: the same error answers the
same status, code and field wherever it comes from, and an error that is no fault of the request stays a
retryable 503.
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient

from feishu_progress.errors import (
    REUSED_KEY,
    EventRejected,
    FeishuAPIError,
    FeishuProgressError,
    FirstCardFailed,
    ImageRefused,
    NotWritableHere,
    RequestRejected,
    TaskExists,
    TaskFinished,
    TooManyImages,
    TooManyLive,
    UnknownApp,
    UnknownRequestedApp,
    UnknownTask,
    UploadsBusy,
)
from feishu_progress.web.http import domain_answer, json_errors

TAKEN = "that session id or idempotency key is already taken"
AT_MOST = "a task may hold at most 100 images"
NOT_SENT = "the first card could not be sent yet: busy"
ANSWERS: list[tuple[FeishuProgressError, tuple[int, str, str, str | None, int | None]]] = [
    (UnknownTask(42), (404, "unknown_task", "no task 42", None, None)),
    (TaskExists(TAKEN), (409, "task_exists", TAKEN, None, None)),
    (TaskFinished("task 42 has finished"), (409, "task_finished", "task 42 has finished", None, None)),
    (
        EventRejected("events[3].call_id", "Field required"),
        (422, "invalid_event", "Field required", "events[3].call_id", None),
    ),
    (
        EventRejected("Idempotency-Key", REUSED_KEY),
        (422, "invalid_event", REUSED_KEY, "Idempotency-Key", None),
    ),
    (
        RequestRejected("Idempotency-Key", REUSED_KEY),
        (422, "invalid_request", REUSED_KEY, "Idempotency-Key", None),
    ),
    (TooManyImages("image", AT_MOST), (422, "too_many_images", AT_MOST, "image", None)),
    (
        UnknownRequestedApp("x", ["default"]),
        (422, "unknown_app", "unknown app 'x'; known apps: default", "app", None),
    ),
    (
        ImageRefused("not_an_image"),
        (422, "invalid_image", "not an image we can show: not_an_image", "image", None),
    ),
    (UploadsBusy("no slot"), (429, "too_busy", "every image upload slot is taken; retry", None, 1)),
    (FirstCardFailed(NOT_SENT, 3), (503, "unavailable", NOT_SENT, None, 3)),
    (TooManyLive("10 live tasks"), (503, "unavailable", "10 live tasks; retry", None, 5)),
]


@pytest.mark.parametrize(("error", "expected"), ANSWERS, ids=lambda value: type(value).__name__)
def test_each_error_answers_its_status_code_and_field(error: FeishuProgressError, expected: Any) -> None:
    answer = domain_answer(error)
    assert answer is not None
    assert (answer.status, answer.code, answer.message, answer.field, answer.retry_after) == expected


@pytest.mark.parametrize(
    "error",
    [
        UnknownApp("gone", ["default"]),  # a stored task's app no longer configured: the operator's to fix
        NotWritableHere("lease lapsed"),
        FeishuAPIError(99991400, "rate limited"),
        FeishuProgressError("anything else"),
    ],
    ids=lambda value: type(value).__name__,
)
def test_an_error_that_is_no_fault_of_the_request_is_left_to_the_503(error: FeishuProgressError) -> None:
    assert domain_answer(error) is None


async def test_the_middleware_answers_a_raised_error_with_its_table_entry_and_body(
    aiohttp_client: Any,
) -> None:
    async def finished(request: web.Request) -> web.Response:
        raise TaskFinished("task 7 has finished")

    async def broken(request: web.Request) -> web.Response:
        raise UnknownApp("gone", ["default"])

    app = web.Application(middlewares=[json_errors])
    app.router.add_post("/finished", finished)
    app.router.add_get("/broken", broken)
    client: TestClient[web.Request, web.Application] = await aiohttp_client(app)
    answer = await client.post("/finished")
    assert (answer.status, await answer.json()) == (
        409,
        {"error": "task_finished", "message": "task 7 has finished"},
    )
    answer = await client.get("/broken")
    assert answer.status == 503 and answer.headers["Retry-After"] == "1"
    assert (await answer.json())["error"] == "unavailable"


def test_no_runtime_api_handler_maps_an_error_itself() -> None:
    source = (Path(__file__).resolve().parents[1] / "feishu_progress" / "web" / "api.py").read_text()
    handlers = [node for node in ast.walk(ast.parse(source)) if isinstance(node, ast.Try)]
    caught = [ast.unparse(handler.type) for node in handlers for handler in node.handlers if handler.type]
    assert caught == ["ValueError"]  # the query parameters' own parse, nothing of the service's
