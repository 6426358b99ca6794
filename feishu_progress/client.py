"""A Python client of the runtime API (docs/openapi.json): async, typed, one aiohttp session.

    async with FeishuProgressClient("http://127.0.0.1:8000", token) as fp:
        task = await fp.create_task(
            receive_id="oc_x", receive_id_type="chat_id", requester_open_id="ou_y", idempotency_key="run-1"
        )
        async with fp.event_stream(task.session_id) as events:   # batches, coalesces content_deltas
            await events.add({"type": "content_delta", "text": "Hello"})
        async for action in fp.actions(task.session_id):          # long-polls; resumable by cursor
            ...

Answers are parsed into the models the service builds them from (``runtime/responses.py``). A 503 is
retried after the ``retry_after`` it names, a bounded number of times (``RetryPolicy``), on an injectable
clock; any other error raises at once, typed by status (``InvalidRequest`` carries the ``field``). Events
are posted as they are: a dict as the API documents it, or one of ``runtime/events.py``'s models.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Literal, Self, TypeVar

import aiohttp
from pydantic import BaseModel

from feishu_progress.errors import FeishuProgressError
from feishu_progress.ports import Clock, SystemClock
from feishu_progress.runtime.events import MAX_EVENTS_PER_BATCH, MAX_TEXT
from feishu_progress.runtime.responses import (
    ActionsPage,
    ErrorBody,
    EventsAccepted,
    ImageUploaded,
    TaskCreated,
    TaskView,
    UserAction,
)

Event = Mapping[str, Any] | BaseModel
ReceiveIdType = Literal["chat_id", "open_id", "user_id", "union_id", "email"]
B = TypeVar("B", bound=BaseModel)

DEFAULT_TIMEOUT_SECONDS = 30.0
DEFAULT_WAIT_SECONDS = 30.0  # one long-poll; the service allows at most 60
DEFAULT_FLUSH_SECONDS = 0.25  # the card is PATCHed at most every 250 ms: waiting longer shows nothing sooner
DEFAULT_MAX_BUFFERED = 200


class ApiError(FeishuProgressError):
    """The service answered an error: its status, machine code, message, and the field it names."""

    def __init__(self, status: int, body: ErrorBody) -> None:
        super().__init__(
            f"{status} {body.error}: {body.message}" + (f" ({body.field})" if body.field else "")
        )
        self.status = status
        self.code = body.error
        self.message = body.message
        self.field = body.field
        self.retry_after = body.retry_after


class InvalidRequest(ApiError):
    """400, 413, 415, 422: what was sent is wrong (``field`` names it on a 422); a retry fails again."""


class Unauthorized(ApiError):
    """401: no token, or the wrong one."""


class NotFound(ApiError):
    """404: no such task."""


class Conflict(ApiError):
    """409: the session id is taken, or the task has finished."""


class Unavailable(ApiError):
    """503 on every attempt: Feishu or the service's database is failing."""


_ERRORS: dict[int, type[ApiError]] = {
    400: InvalidRequest,
    401: Unauthorized,
    404: NotFound,
    409: Conflict,
    413: InvalidRequest,
    415: InvalidRequest,
    422: InvalidRequest,
    503: Unavailable,
}


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """How a 503 is retried (every other error is raised at once).

    At most ``attempts`` tries; before each retry the answer's ``retry_after`` seconds
    (``default_delay`` when it names none), never more than ``max_delay``.
    """

    attempts: int = 5
    default_delay: float = 1.0
    max_delay: float = 30.0

    def delay(self, error: ApiError) -> float:
        wanted = error.retry_after if error.retry_after is not None else self.default_delay
        return min(self.max_delay, max(0.0, float(wanted)))


def event_json(event: Event) -> dict[str, Any]:
    """An event as the API takes it (a model is dumped by alias: ``multiSelect``)."""
    if isinstance(event, BaseModel):
        return event.model_dump(mode="json", by_alias=True, exclude_none=True)
    return dict(event)


class FeishuProgressClient:
    """The runtime API over one aiohttp session; use it as ``async with``."""

    def __init__(
        self,
        base_url: str,
        token: str | None = None,
        *,
        retry: RetryPolicy | None = None,
        clock: Clock | None = None,
        timeout: float = DEFAULT_TIMEOUT_SECONDS,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self._headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.retry = retry or RetryPolicy()
        self.clock: Clock = clock or SystemClock()
        self._timeout = timeout
        self._session: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> Self:
        self._session = aiohttp.ClientSession(headers=self._headers)
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    # -- the calls ------------------------------------------------------------------------------------

    async def create_task(
        self,
        *,
        receive_id: str,
        receive_id_type: ReceiveIdType,
        requester_open_id: str,
        title: str = "",
        session_id: int | None = None,
        reply_to_message_id: str | None = None,
        locale: str | None = None,
        idempotency_key: str | None = None,
        app: str | None = None,
    ) -> TaskCreated:
        """Create a task and send its first card; with ``idempotency_key`` a repeat is the same task.

        ``app``: the Feishu/Lark app that sends the card (FP_APPS_FILE); omitted: the default app.
        """
        body = {
            "receive_id": receive_id,
            "receive_id_type": receive_id_type,
            "requester_open_id": requester_open_id,
            "title": title,
            "session_id": session_id,
            "reply_to_message_id": reply_to_message_id,
            "locale": locale,
            "app": app,
        }
        headers = {"Idempotency-Key": idempotency_key} if idempotency_key is not None else {}
        sent = {key: value for key, value in body.items() if value is not None}
        answer = await self._call(_Request("POST", "/v1/tasks", json=sent, headers=headers))
        return TaskCreated.model_validate(answer)

    async def post_events(self, session_id: int, events: Iterable[Event]) -> int:
        """Post events in order; returns how many were applied.

        More than the service's 1000 per batch go as several batches, each applied whole or not at all.
        """
        batch = [event_json(event) for event in events]
        accepted = 0
        for start in range(0, len(batch), MAX_EVENTS_PER_BATCH):
            chunk = batch[start : start + MAX_EVENTS_PER_BATCH]
            # One key per batch, the same on each retry: a retry after a lost answer is applied once.
            headers = {"Idempotency-Key": f"fpc-{uuid.uuid4().hex}"}
            path = f"/v1/tasks/{session_id}/events"
            answer = await self._call(_Request("POST", path, json={"events": chunk}, headers=headers))
            accepted += EventsAccepted.model_validate(answer).accepted
        return accepted

    def event_stream(
        self,
        session_id: int,
        *,
        flush_after: float = DEFAULT_FLUSH_SECONDS,
        max_buffered: int = DEFAULT_MAX_BUFFERED,
    ) -> EventStream:
        """A buffer for one task's events: see ``EventStream``."""
        return EventStream(self, session_id, flush_after=flush_after, max_buffered=max_buffered)

    async def get_task(self, session_id: int) -> TaskView:
        """The task's status, round, message and current card."""
        return TaskView.model_validate(await self._call(_Request("GET", f"/v1/tasks/{session_id}")))

    async def upload_image(self, session_id: int, data: bytes, *, filename: str = "image") -> ImageUploaded:
        """Hand over an image (PNG, JPEG, GIF, WEBP, at most 10 MB); a tool result names its ``image_ref``."""

        def form() -> aiohttp.FormData:
            built = aiohttp.FormData()
            built.add_field("image", data, filename=filename, content_type="application/octet-stream")
            return built

        answer = await self._call(_Request("POST", f"/v1/tasks/{session_id}/images", form=form))
        return ImageUploaded.model_validate(answer)

    async def poll_actions(self, session_id: int, *, after: int = 0, wait: float = 0.0) -> ActionsPage:
        """One long-poll: the actions after the cursor ``after``, waiting up to ``wait`` s for the first."""
        params = {"after": str(after), "wait": f"{wait:g}"}
        answer = await self._call(
            _Request("GET", f"/v1/tasks/{session_id}/actions", params=params, wait=wait)
        )
        return ActionsPage.model_validate(answer)

    async def actions(
        self, session_id: int, *, after: int = 0, wait: float = DEFAULT_WAIT_SECONDS
    ) -> AsyncIterator[UserAction]:
        """Every user action after the cursor ``after``, as it comes; never ends by itself.

        To resume after a restart, pass the ``cursor`` of the last action handled as ``after``.
        """
        cursor = after
        while True:
            page = await self.poll_actions(session_id, after=cursor, wait=wait)
            for action in page.actions:
                yield action
            cursor = page.cursor

    # -- HTTP -----------------------------------------------------------------------------------------

    async def _call(self, request: _Request) -> Any:
        """One request, retried on 503 as ``retry`` says; the JSON body of a 2xx, else a typed error."""
        for attempt in range(1, self.retry.attempts + 1):
            answer = await self._send(request)
            if answer.status < 400:
                return answer.payload
            error = answer.error()
            if not isinstance(error, Unavailable) or attempt == self.retry.attempts:
                raise error
            await self.clock.sleep(self.retry.delay(error))
        raise AssertionError("unreachable")

    async def _send(self, request: _Request) -> _Answer:
        if self._session is None:
            raise RuntimeError("use the client as 'async with FeishuProgressClient(...) as client'")
        async with self._session.request(
            request.method,
            self.base_url + request.path,
            json=request.json,
            data=request.form() if request.form is not None else None,  # a sent form cannot be sent again
            params=request.params,
            headers=request.headers,
            timeout=aiohttp.ClientTimeout(total=self._timeout + request.wait),  # a long-poll takes ``wait``
        ) as response:
            text = await response.text()
            try:
                payload = json.loads(text)
            except ValueError:
                payload = text
            return _Answer(response.status, payload, response.headers.get("Retry-After"))


@dataclass(frozen=True, slots=True)
class _Request:
    method: str
    path: str
    json: Any = None
    form: Callable[[], aiohttp.FormData] | None = None
    params: Mapping[str, str] | None = None
    headers: Mapping[str, str] | None = None
    wait: float = 0.0


@dataclass(frozen=True, slots=True)
class _Answer:
    status: int
    payload: Any
    retry_after_header: str | None

    def error(self) -> ApiError:
        """The typed error of a non-2xx answer (one a proxy wrote in HTML too)."""
        try:
            body = ErrorBody.model_validate(self.payload)
        except ValueError:
            text = self.payload if isinstance(self.payload, str) else ""
            body = ErrorBody(error=f"http_{self.status}", message=text[:200])
        header = self.retry_after_header
        if body.retry_after is None and header is not None and header.isdigit():
            body = body.model_copy(update={"retry_after": int(header)})
        return _ERRORS.get(self.status, ApiError)(self.status, body)


class EventStream:
    """Buffers one task's events and posts them in order, in batches.

    Consecutive ``content_delta``s become one event (their texts joined), so a model streaming tokens
    costs a request per ``flush_after`` seconds, not per token. A batch goes out ``flush_after`` seconds
    after the oldest buffered event, when ``max_buffered`` events wait, on ``finished``, on ``flush()``
    and when the ``async with`` block ends. A batch posted in the background that fails (after the 503
    retries) is lost; its error is raised by the next ``add``, ``flush`` or the block's end.
    """

    def __init__(
        self,
        client: FeishuProgressClient,
        session_id: int,
        *,
        flush_after: float = DEFAULT_FLUSH_SECONDS,
        max_buffered: int = DEFAULT_MAX_BUFFERED,
    ) -> None:
        self._client = client
        self.session_id = session_id
        self._flush_after = flush_after
        self._max_buffered = max(1, min(max_buffered, MAX_EVENTS_PER_BATCH))
        self._pending: list[dict[str, Any]] = []
        self._lock = asyncio.Lock()  # one batch in flight at a time: batches arrive in order
        self._timer: asyncio.Task[None] | None = None  # while it sleeps: cancelled by an earlier flush
        self._sending: set[asyncio.Task[None]] = set()  # timers past their sleep: never cancelled
        self._failure: Exception | None = None

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    async def add(self, event: Event) -> None:
        """Buffer ``event`` (joined to the previous one when both are ``content_delta``)."""
        self._raise_failure()
        item = event_json(event)
        if not self._joined(item):
            self._pending.append(item)
        if len(self._pending) >= self._max_buffered or item.get("type") == "finished":
            await self.flush()
        elif self._timer is None:  # a timer already sending took its batch before this event came
            self._timer = asyncio.create_task(self._flush_later(), name=f"fp-events-{self.session_id}")

    def _joined(self, item: dict[str, Any]) -> bool:
        if item.get("type") != "content_delta" or not self._pending:
            return False
        last = self._pending[-1]
        if last.get("type") != "content_delta" or set(last) != {"type", "text"} or set(item) != set(last):
            return False
        text = str(last["text"]) + str(item["text"])
        if len(text) > MAX_TEXT:
            return False
        self._pending[-1] = {"type": "content_delta", "text": text}
        return True

    async def flush(self) -> None:
        """Post what is buffered now (after any batch already on its way)."""
        self._stop_timer()
        await self._send_pending()
        self._raise_failure()

    async def close(self) -> None:
        """Flush, and wait for every batch a timer has on its way."""
        await self.flush()
        await asyncio.gather(*self._sending)
        self._raise_failure()

    async def _flush_later(self) -> None:
        await self._client.clock.sleep(self._flush_after)
        # From here a batch may be in flight: the task leaves ``_timer`` so no flush cancels it.
        me = asyncio.current_task()
        assert me is not None
        self._timer = None
        self._sending.add(me)
        try:
            await self._send_pending()
        except Exception as exc:  # kept for the caller's next call: nobody awaits this task
            self._failure = exc
        finally:
            self._sending.discard(me)

    def _stop_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    async def _send_pending(self) -> None:
        async with self._lock:
            batch, self._pending = self._pending, []
            if batch:
                await self._client.post_events(self.session_id, batch)

    def _raise_failure(self) -> None:
        failure, self._failure = self._failure, None
        if failure is not None:
            raise failure


__all__ = [
    "ApiError",
    "Conflict",
    "EventStream",
    "FeishuProgressClient",
    "InvalidRequest",
    "NotFound",
    "RetryPolicy",
    "Unauthorized",
    "Unavailable",
    "event_json",
]
