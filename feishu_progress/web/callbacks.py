"""``POST /feishu/callback``: Feishu card callbacks and the URL check, over aiohttp.

The handler reads the raw body under a hard cap, lets ``feishu.callback.parse_callback`` verify and
parse it, and hands the click to the transport-free ``CallbackPipeline`` (dedupe, the action handler
under its deadline, Feishu's reply body) that the long connection uses too. Bad input gets a 4xx with
a short JSON reason; a failing action handler gets a 200 with an error toast (Feishu shows it to the
user) and a logged traceback. Nothing answers 500 for anything a client sends.

Each app has its own route, ``/feishu/callback/<name>``, checked with that app's keys only;
``/feishu/callback`` is the default app's. A route exists only for an app in webhook mode (see
``app.create_app``). The click is tagged with the route's app: a click for another app's card is refused.

The routes are registered before the app starts, the pipeline is built when it has: they are given how
to find it (``app.create_app``: the started app's ``SERVICES``), and look it up per request.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Sequence
from contextlib import nullcontext

from aiohttp import web

from feishu_progress.config import DEFAULT_APP, FeishuSettings, Settings
from feishu_progress.errors import CallbackRejected
from feishu_progress.feishu.callback import CardActionEvent, UrlVerification, parse_callback
from feishu_progress.feishu.pipeline import CallbackPipeline
from feishu_progress.ports import Clock
from feishu_progress.web.http import HttpError, json_error, read_body
from feishu_progress.web.load import HeavyGate

CALLBACK_PATH = "/feishu/callback"


def callback_path(app: str) -> str:
    """The route an app's console names: ``/feishu/callback`` for ``default``, else its own."""
    return CALLBACK_PATH if app == DEFAULT_APP else f"{CALLBACK_PATH}/{app}"


log = logging.getLogger(__name__)

Observe = Callable[[float], None]
PipelineLookup = Callable[[], CallbackPipeline]


class CallbackEndpoint:
    """The aiohttp handler: verify and parse the request, answer through the shared pipeline."""

    def __init__(
        self,
        pipeline: PipelineLookup,
        settings: Settings,
        clock: Clock,
        *,
        app: str | None = None,
        keys: FeishuSettings | None = None,
        observe: Observe | None = None,
        priority: HeavyGate | None = None,
    ) -> None:
        self._pipeline = pipeline
        self._priority = priority  # large bodies wait while a click is answered (web/load.py)
        self._settings = settings
        self._app = app
        self._keys = keys
        self._clock = clock
        self._observe = observe

    async def handle(self, request: web.Request) -> web.Response:
        """Answer one callback request; records its latency with ``observe``."""
        started = self._clock.monotonic()
        try:
            with nullcontext() if self._priority is None else self._priority.urgent():
                return await self._respond(request)
        except CallbackRejected as rejected:
            log.info("feishu callback (app %s) rejected: %s %r", self._app, rejected.status, rejected.reason)
            return json_error(rejected.status, "callback_rejected", rejected.reason)
        except HttpError as refused:  # the body itself: type, size, time
            log.info("feishu callback refused: %s %s", refused.status, refused.code)
            return json_error(refused.status, refused.code, refused.message)
        finally:
            if self._observe is not None:
                self._observe(self._clock.monotonic() - started)

    async def _respond(self, request: web.Request) -> web.Response:
        raw_body = await read_body(
            request,
            limit=self._settings.callback.max_body_bytes,
            timeout=self._settings.callback.body_timeout_seconds,
        )
        parsed = self._parse(raw_body, request)
        if isinstance(parsed, UrlVerification):
            return web.json_response({"challenge": parsed.challenge})
        return web.json_response(await self._pipeline().answer(dataclasses.replace(parsed, app=self._app)))

    def _parse(self, raw_body: bytes, request: web.Request) -> UrlVerification | CardActionEvent:
        try:
            return parse_callback(
                raw_body, request.headers, self._settings, now=self._clock.wall(), keys=self._keys
            )
        except CallbackRejected:
            raise
        except Exception as exc:
            # A parser bug must still not turn client input into a 500; the traceback names no payload.
            log.exception("unexpected error while parsing a feishu callback")
            raise CallbackRejected(400, "malformed callback") from exc


def callback_routes(
    pipeline: PipelineLookup,
    settings: Settings,
    clock: Clock,
    observe: Observe | None = None,
    *,
    apps: Sequence[tuple[str, FeishuSettings]] = (),
    default_app: str | None = None,
    priority: HeavyGate | None = None,
) -> list[web.RouteDef]:
    """``POST /feishu/callback/<name>`` per webhook app in ``apps`` and ``/feishu/callback`` for the default.

    Without ``apps``: only ``/feishu/callback``, with the keys of ``settings.feishu``.
    ``observe(seconds)`` receives each request's latency; while one is answered, large request bodies
    wait at their next step (``priority``, the runtime API's HeavyGate).
    """
    if not apps:
        endpoint = CallbackEndpoint(pipeline, settings, clock, observe=observe, priority=priority)
        return [web.post(CALLBACK_PATH, endpoint.handle)]
    endpoints = {
        name: CallbackEndpoint(
            pipeline, settings, clock, app=name, keys=keys, observe=observe, priority=priority
        )
        for name, keys in apps
    }

    async def per_app(request: web.Request) -> web.Response:
        endpoint = endpoints.get(request.match_info["app"])
        if endpoint is None:
            return json_error(404, "unknown_app", "no app of that name takes callbacks here")
        return await endpoint.handle(request)

    routes = [web.post(CALLBACK_PATH + "/{app}", per_app)]
    if default_app in endpoints:
        routes.append(web.post(CALLBACK_PATH, endpoints[default_app].handle))
    return routes
