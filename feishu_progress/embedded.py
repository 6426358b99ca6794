"""The service inside a runtime's own asyncio program: the runtime API as Python calls.

    async with EmbeddedService(settings) as fp:
        task = await fp.create_task(receive_id="oc_x", receive_id_type="chat_id", requester_open_id="ou_y")
        await fp.post_events(task.session_id, [{"type": "status", "status": "RUNNING", "round": 1}])

Every call validates exactly like the HTTP API (a bad event raises ``EventRejected`` naming
``events[i].field`` and nothing of the batch is applied). With ``serve_http`` the public listener
still runs, because in webhook mode Feishu must reach ``POST /feishu/callback`` for clicks.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from types import TracebackType
from typing import Any, Self

from aiohttp import web

from feishu_progress.app import create_app
from feishu_progress.config import Settings
from feishu_progress.ports import Clock
from feishu_progress.runtime.creation import CreatedTask
from feishu_progress.runtime.events import CreateTaskRequest, EventBatch, parse_model
from feishu_progress.runtime.service import TaskService
from feishu_progress.services import SERVICES, Services


class EmbeddedService:
    def __init__(self, settings: Settings, *, serve_http: bool = True, clock: Clock | None = None) -> None:
        self.settings = settings
        self.serve_http = serve_http
        self._app = create_app(settings, clock=clock)
        self._runner = web.AppRunner(self._app, access_log=None)
        self.public_url: str | None = None

    @property
    def services(self) -> Services:
        return self._app[SERVICES]

    @property
    def _service(self) -> TaskService:
        return self.services.service

    async def __aenter__(self) -> Self:
        await self._runner.setup()  # runs the app's startup: database, Feishu client, scheduler...
        if self.serve_http:
            site = web.TCPSite(self._runner, self.settings.bind_host, self.settings.http.port)
            await site.start()
            host, port = self._runner.addresses[0][:2]
            self.public_url = f"http://{host}:{port}"
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self._runner.cleanup()  # flushes pending final card states, then closes everything

    async def create_task(self, idempotency_key: str | None = None, **fields: Any) -> CreatedTask:
        """Same fields as ``POST /v1/tasks`` (and its Idempotency-Key); sends the first card."""
        return await self._service.create_task(parse_model(CreateTaskRequest, fields), idempotency_key)

    async def post_events(self, session_id: int, events: Sequence[Mapping[str, Any]]) -> int:
        """Same as ``POST /v1/tasks/{id}/events``; returns how many events were applied."""
        batch = parse_model(EventBatch, {"events": list(events)})
        return await self._service.apply_events(session_id, batch)

    async def get_task(self, session_id: int) -> dict[str, Any]:
        """Same as ``GET /v1/tasks/{id}``."""
        return (await self._service.view(session_id)).json_body()

    async def actions(
        self, session_id: int, after: int = 0, wait: float = 0.0
    ) -> tuple[list[dict[str, Any]], int]:
        """Same as ``GET /v1/tasks/{id}/actions``: (actions, cursor)."""
        actions, cursor = await self._service.wait_actions(session_id, after, wait)
        return [action.json_body() for action in actions], cursor
