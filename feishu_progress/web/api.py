"""The runtime API (docs/openapi.json): tasks, their events, their card, their user actions.

Handlers let the service's errors rise: ``web/http.py`` ``domain_answer`` is the one table of what each
answers (404 unknown_task, 409 task_finished, 422 invalid_event...), the same on every route.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from feishu_progress.config import MAX_IMAGE_BYTES
from feishu_progress.errors import RequestRejected
from feishu_progress.runtime.events import CreateTaskRequest, EventBatch, parse_model
from feishu_progress.runtime.responses import ActionsPage, EventsAccepted, TaskCreated
from feishu_progress.runtime.service import TaskService
from feishu_progress.runtime.state import request_digest
from feishu_progress.web.http import (
    MAX_ID,
    HttpError,
    parse_id,
    parse_json,
    read_body,
    read_file_field,
    read_json,
)
from feishu_progress.web.load import LARGE_BODY_BYTES, HeavyGate

log = logging.getLogger(__name__)

MAX_EVENT_BODY = 8 * 1024 * 1024
MAX_WAIT_SECONDS = 60.0
MAX_IDEMPOTENCY_KEY_CHARS = 255
UPLOAD_SLOT_WAIT_SECONDS = 2.0  # an upload waits this long for a slot of FP_IMAGES__CONCURRENCY, then 429


def _session_id(request: web.Request) -> int:
    raw = request.match_info["session_id"]
    session_id = parse_id(raw)
    if session_id is None:
        raise HttpError(404, "unknown_task", f"no task {raw[:40]!r}")  # names no task: not even an id
    return session_id


def _idempotency_key(request: web.Request) -> str | None:
    key = request.headers.get("Idempotency-Key")
    if key is None:
        return None
    # Printable ASCII only: the key is stored in a column and compared byte for byte; a header that is
    # not UTF-8 arrives with lone surrogates, which used to fail in the database (a 503).
    printable = key.isascii() and key.isprintable()
    if not key.strip() or len(key) > MAX_IDEMPOTENCY_KEY_CHARS or not printable:
        raise HttpError(
            422,
            "invalid_request",
            f"Idempotency-Key must be 1..{MAX_IDEMPOTENCY_KEY_CHARS} printable ASCII characters",
            field="Idempotency-Key",
        )
    return key


@dataclass(frozen=True, slots=True)
class EventBatchRead:
    """``POST /v1/tasks/{id}/events`` read once: the key, the body as sent and as JSON, the batch."""

    key: str | None
    raw: bytes  # as the runtime sent it: forwarded unchanged, so every copy has one digest
    payload: Any
    batch: EventBatch
    digest: str | None  # request_digest of ``raw`` when there is a key (a reused key is refused)


async def _next_turn() -> None:
    await asyncio.sleep(0)


async def read_event_batch(
    request: web.Request, give_way: Callable[[], Awaitable[None]] = _next_turn
) -> EventBatchRead:
    """Read, parse and validate the batch of ``POST /v1/tasks/{id}/events``, once per request.

    A bad key or batch is a 422 naming the field, a body that is not JSON a 400. Kept on the request:
    cluster mode reads it before forwarding and may still log a batch its handler could not apply. A
    large body ``give_way``s between its steps (each is a long stretch: clicks go in between).
    """
    if _READ_BATCH in request:
        return request[_READ_BATCH]
    key = _idempotency_key(request)
    raw = await read_body(request, limit=MAX_EVENT_BODY)
    large = len(raw) > LARGE_BODY_BYTES
    if large:  # what became ready while the body came in (a click) goes before the parse
        await give_way()
    payload = parse_json(raw)
    if large:
        await give_way()
    batch = parse_model(EventBatch, payload)  # EventRejected: a 422 naming the field
    digest = None
    if key is not None:  # sha256 lets go of the GIL on large inputs: a large body's is hashed off the loop
        digest = await asyncio.to_thread(request_digest, raw) if large else request_digest(raw)
    elif large:
        await give_way()
    request[_READ_BATCH] = read = EventBatchRead(key, raw, payload, batch, digest)
    return read


_READ_BATCH = web.RequestKey("fp.event_batch", EventBatchRead)


class RuntimeApi:
    """aiohttp handlers over a TaskService (looked up per request: it exists once the app has started)."""

    def __init__(self, service: Callable[[], TaskService], gate: HeavyGate | None = None) -> None:
        self._service = service
        self._gate = gate or HeavyGate()

    @property
    def service(self) -> TaskService:
        return self._service()

    def routes(self) -> list[web.RouteDef]:
        return [
            web.post("/v1/tasks", self.create_task),
            web.post("/v1/tasks/{session_id}/events", self.post_events),
            web.get("/v1/tasks/{session_id}", self.get_task),
            web.get("/v1/tasks/{session_id}/actions", self.get_actions),
            web.post("/v1/tasks/{session_id}/images", self.upload_image),
        ]

    async def create_task(self, request: web.Request) -> web.Response:
        key = _idempotency_key(request)
        payload = await read_json(request, limit=MAX_EVENT_BODY)
        body = parse_model(CreateTaskRequest, payload, rejected=RequestRejected)
        created = await self.service.create_task(body, key)
        answer = TaskCreated(session_id=created.session_id, message_id=created.message_id)
        return web.json_response(answer.json_body(), status=201)

    async def post_events(self, request: web.Request) -> web.Response:
        session_id = _session_id(request)
        await self._gate.share.take_turn()
        async with self._gate.admit(request):
            read = await read_event_batch(request, self._gate.give_way)
        if len(read.raw) > LARGE_BODY_BYTES:
            await self._gate.give_way()  # applying it is one more stretch
        applied = await self.service.apply_events(session_id, read.batch, read.key, read.digest)
        return web.json_response(EventsAccepted(accepted=applied).json_body(), status=202)

    async def get_task(self, request: web.Request) -> web.Response:
        view = await self.service.view(_session_id(request))
        return web.json_response(view.json_body())

    async def get_actions(self, request: web.Request) -> web.Response:
        session_id = _session_id(request)
        try:
            after = int(request.query.get("after", "0"))
            wait = float(request.query.get("wait", "0"))
        except ValueError:
            raise HttpError(
                422, "invalid_query", "'after' must be an integer and 'wait' a number of seconds"
            ) from None
        if not 0 <= after <= MAX_ID or not 0 <= wait <= MAX_WAIT_SECONDS:
            raise HttpError(
                422, "invalid_query", f"0 <= 'after' < 2**63 and 0 <= 'wait' <= {MAX_WAIT_SECONDS:g}"
            )
        actions, cursor = await self.service.wait_actions(session_id, after, wait)
        return web.json_response(ActionsPage(actions=actions, cursor=cursor).json_body())

    async def upload_image(self, request: web.Request) -> web.Response:
        """An image the runtime hands over (multipart field ``image``, ≤ 10 MB, PNG/JPEG/GIF/WEBP).

        The body is read only once an upload slot is held (429 when none frees soon: 150 uploads at
        once used to be buffered whole before the gate), and uploaded only if the task takes it.
        """
        session_id = _session_id(request)

        async def body() -> bytes:
            return await read_file_field(request, field="image", limit=MAX_IMAGE_BYTES)

        uploaded = await self.service.add_image_from(session_id, body, max_wait=UPLOAD_SLOT_WAIT_SECONDS)
        return web.json_response(uploaded.json_body(), status=201)
