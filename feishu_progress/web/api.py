"""The runtime API (PRODUCT.md "Public HTTP"): tasks, their events, their card, their user actions."""

from __future__ import annotations

import hmac
import json
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web
from pydantic import SecretStr

from feishu_progress.errors import EventRejected, FeishuProgressError, UnknownTask
from feishu_progress.runtime.events import CreateTaskRequest, EventBatch, parse_model
from feishu_progress.runtime.service import TaskConflict, TaskService

log = logging.getLogger(__name__)

MAX_EVENT_BODY = 8 * 1024 * 1024
MAX_WAIT_SECONDS = 60.0

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def _error(status: int, code: str, message: str, **extra: Any) -> web.Response:
    return web.json_response({"error": code, "message": message, **extra}, status=status)


def bearer_auth_middleware(token: SecretStr | None) -> Any:
    """Refuse /v1 requests without the runtime's bearer token (constant-time compare)."""
    expected = token.get_secret_value().encode() if token is not None else None

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        if expected is None or not request.path.startswith("/v1/"):
            return await handler(request)
        header = request.headers.get("Authorization", "")
        scheme, _, presented = header.partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(presented.strip().encode(), expected):
            return _error(
                401, "unauthorized", "a valid 'Authorization: Bearer <FP_API__TOKEN>' header is required"
            )
        return await handler(request)

    return middleware


@web.middleware
async def unavailable_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """A failure on our side (database down, Feishu unreachable) is a JSON 503 the runtime can retry on."""
    try:
        return await handler(request)
    except web.HTTPException:
        raise
    except FeishuProgressError as exc:
        log.warning("%s %s failed: %s", request.method, request.path, exc)
        return _error(503, "unavailable", "Feishu or the database did not answer; retry later")
    except Exception:
        log.exception("%s %s failed", request.method, request.path)
        return _error(503, "unavailable", "the service could not complete the request; retry later")


async def _json_body(request: web.Request) -> Any:
    if request.content_type != "application/json":
        raise web.HTTPUnsupportedMediaType(
            text=json.dumps({"error": "unsupported_media_type", "message": "send application/json"}),
            content_type="application/json",
        )
    if request.content_length is not None and request.content_length > MAX_EVENT_BODY:
        raise web.HTTPRequestEntityTooLarge(max_size=MAX_EVENT_BODY, actual_size=request.content_length)
    raw = await request.read()
    try:
        return json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        raise web.HTTPBadRequest(
            text=json.dumps({"error": "invalid_json", "message": "the body is not valid JSON"}),
            content_type="application/json",
        ) from None


def _session_id(request: web.Request) -> int:
    raw = request.match_info["session_id"]
    if not raw.isdigit() or len(raw) > 19:
        raise web.HTTPNotFound(
            text=json.dumps({"error": "unknown_task", "message": f"no task {raw!r}"}),
            content_type="application/json",
        )
    return int(raw)


class RuntimeApi:
    """aiohttp handlers over a TaskService (looked up per request: it exists once the app has started)."""

    def __init__(self, service: Callable[[], TaskService]) -> None:
        self._service = service

    @property
    def service(self) -> TaskService:
        return self._service()

    def routes(self) -> list[web.RouteDef]:
        return [
            web.post("/v1/tasks", self.create_task),
            web.post("/v1/tasks/{session_id}/events", self.post_events),
            web.get("/v1/tasks/{session_id}", self.get_task),
            web.get("/v1/tasks/{session_id}/actions", self.get_actions),
        ]

    async def create_task(self, request: web.Request) -> web.Response:
        try:
            body = parse_model(CreateTaskRequest, await _json_body(request))
        except EventRejected as exc:
            return _error(422, "invalid_request", exc.message, field=exc.location)
        created = await self.service.create_task(body)
        return web.json_response(
            {"session_id": created.session_id, "message_id": created.message_id}, status=201
        )

    async def post_events(self, request: web.Request) -> web.Response:
        session_id = _session_id(request)
        try:
            batch = parse_model(EventBatch, await _json_body(request))
            applied = await self.service.apply_events(session_id, batch)
        except EventRejected as exc:
            return _error(422, "invalid_event", exc.message, field=exc.location)
        except UnknownTask:
            return _error(404, "unknown_task", f"no task {session_id}")
        except TaskConflict as exc:
            return _error(409, "task_finished", str(exc))
        return web.json_response({"accepted": applied}, status=202)

    async def get_task(self, request: web.Request) -> web.Response:
        session_id = _session_id(request)
        try:
            view = self.service.describe(session_id)
        except UnknownTask:
            return _error(404, "unknown_task", f"no task {session_id}")
        return web.json_response(view)

    async def get_actions(self, request: web.Request) -> web.Response:
        session_id = _session_id(request)
        try:
            after = int(request.query.get("after", "0"))
            wait = float(request.query.get("wait", "0"))
        except ValueError:
            return _error(422, "invalid_query", "'after' must be an integer and 'wait' a number of seconds")
        if after < 0 or not 0 <= wait <= MAX_WAIT_SECONDS:
            return _error(422, "invalid_query", f"'after' >= 0 and 0 <= 'wait' <= {MAX_WAIT_SECONDS:g}")
        try:
            actions, cursor = await self.service.wait_actions(session_id, after, wait)
        except UnknownTask:
            return _error(404, "unknown_task", f"no task {session_id}")
        return web.json_response({"actions": actions, "cursor": cursor})
