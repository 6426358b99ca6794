"""Cluster mode's HTTP pieces: a request for a card goes to the instance that writes it.

Two pieces, registered by ``app.create_app`` in cluster mode only (the rooms themselves get the cluster's
parts at construction, ``cluster/topology.py``): a middleware that sends a request for one task to the
instance that writes its card (an event batch that cannot reach it goes to the event log), and
``/internal/v1/clicks`` where that instance takes a click a peer forwarded. Both read what the app holds
once started: ``SERVICES`` and this module's ``CLUSTER`` (the running ClusterMode), set by the app's
cleanup context.
"""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from aiohttp import web
from aiohttp.typedefs import Middleware
from sqlalchemy.exc import SQLAlchemyError

from feishu_progress.cluster.clicks import forwarded_click
from feishu_progress.cluster.forward import FORWARDED_HEADER, INTERNAL_CLICKS_PATH, event_from_json
from feishu_progress.cluster.mode import ClusterMode
from feishu_progress.cluster.trust import from_peer
from feishu_progress.errors import ForwardFailed, NotWritableHere, OwnedElsewhere, UnknownTask
from feishu_progress.feishu.callback import CardActionEvent, render_reply
from feishu_progress.feishu.pipeline import DUPLICATE_REPLY
from feishu_progress.ports import Deduper
from feishu_progress.runtime.responses import EventsAccepted
from feishu_progress.services import SERVICES, Services
from feishu_progress.web.api import read_event_batch
from feishu_progress.web.http import HttpError, parse_id, parse_json, read_body

log = logging.getLogger(__name__)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
INTERNAL_CLICK_MAX_BYTES = 256 * 1024  # a click's form values; the public callback caps them lower
CLUSTER = web.AppKey("cluster", ClusterMode)


def writer_routing() -> Middleware:
    """Middleware: a request for one task goes to the instance that writes its card.

    An event batch that cannot reach the writer is stored in the event log and answered 202: the writer
    (or the instance that takes the card over) applies it in order. Only a database out of reach is a 503.
    """

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        session_id = _routed_session(request)
        if session_id is None:
            return await handler(request)
        cluster = request.app[CLUSTER]
        try:
            await request.app[SERVICES].service.task(session_id)
        except NotWritableHere:
            if _is_event_batch(request):
                return await _forward_events(cluster, request, session_id, None)
            raise HttpError(
                503, "unavailable", "this instance is not writing cards now; retry", retry_after=1
            ) from None
        except OwnedElsewhere as elsewhere:
            if _is_event_batch(request):
                return await _forward_events(cluster, request, session_id, elsewhere)
            return await _forward(cluster, request, elsewhere)
        try:
            return await handler(request)
        except NotWritableHere:  # the card changed hands while the batch was applied: not saved here
            if _is_event_batch(request):
                return await _forward_events(cluster, request, session_id, None)
            raise

    return middleware


def _routed_session(request: web.Request) -> int | None:
    raw = request.match_info.get("session_id")
    if raw is None or request.path.endswith("/actions"):
        return None  # the action log answers from any instance
    return parse_id(raw)


def _is_event_batch(request: web.Request) -> bool:
    return request.method == "POST" and request.path.endswith("/events")


async def _forward(
    cluster: ClusterMode, request: web.Request, elsewhere: OwnedElsewhere
) -> web.StreamResponse:
    if request.headers.get(FORWARDED_HEADER) or elsewhere.address is None:
        raise HttpError(503, "unavailable", "the card's writer is changing; retry", retry_after=1)
    try:
        forwarded: web.StreamResponse = await cluster.forwarder.request(request, elsewhere.address)
        return forwarded
    except ForwardFailed as exc:
        log.warning("forwarding %r to %s failed: %s", request.path, elsewhere.owner, exc)
        raise HttpError(
            503, "unavailable", "the card's writer did not answer; retry", retry_after=1
        ) from None


async def _forward_events(
    cluster: ClusterMode, request: web.Request, session_id: int, elsewhere: OwnedElsewhere | None
) -> web.Response:
    """A batch goes to the card's writer; the event log takes it if the writer does not, in time.

    The batch is checked here first (a bad one is refused here as the writer would). Forwarded and
    logged copies carry one Idempotency-Key (made up when the runtime sent none): a writer that
    applied the forwarded copy after all skips the logged one.
    """
    read = await read_event_batch(request)
    key = read.key or f"fp-forwarded:{uuid.uuid4().hex}"
    body = json.dumps(read.payload, ensure_ascii=False, separators=(",", ":"))
    logged = _EventsToLog(session_id, key, body, len(read.batch.events))
    if request.headers.get(FORWARDED_HEADER) or elsewhere is None or elsewhere.address is None:
        return await _log_events(cluster, logged)
    try:
        # The default timeout (the lease: a paused writer's runs out meanwhile), not a short one: under
        # load a writer answers slowly but does apply, and each batch logged after a short timeout was
        # applied twice (skipped by its key, but read, checked and saved again) — in the 200-card bench
        # that tripled p99 (3.9 → 13 s) and drew client timeouts.
        answer = await cluster.forwarder.request(
            request, elsewhere.address, body=read.raw, idempotency_key=key
        )
    except ForwardFailed as exc:
        log.warning("forwarding %r to %s failed: %s; logging it", request.path, elsewhere.owner, exc)
        return await _log_events(cluster, logged)
    if answer.status == 503:  # the writer could not take it either (its lease lapsed meanwhile)
        return await _log_events(cluster, logged)
    return answer


@dataclass(frozen=True, slots=True)
class _EventsToLog:
    session_id: int
    idempotency_key: str
    body: str  # the validated batch, as JSON
    events: int


async def _log_events(cluster: ClusterMode, batch: _EventsToLog) -> web.Response:
    """Append the batch to the task's event log and nudge its writer; 202 once it is stored durably."""
    try:
        await cluster.event_log.append(batch.session_id, batch.idempotency_key, batch.body)
    except UnknownTask:
        raise HttpError(404, "unknown_task", f"no task {batch.session_id}") from None
    except (SQLAlchemyError, OSError) as exc:
        log.warning("event batch for task %s not logged: %s", batch.session_id, type(exc).__name__)
        raise HttpError(503, "unavailable", "the database is out of reach; retry", retry_after=1) from None
    cluster.metrics.events_logged.inc()
    cluster.nudge(batch.session_id)
    return web.json_response(EventsAccepted(accepted=batch.events).json_body(), status=202)


def internal_routes() -> list[web.RouteDef]:
    """``POST /internal/v1/clicks``: a click a peer verified and deduplicated, for a card here.

    Only a peer may send one: the request must carry the cluster secret's signature (``cluster/trust.py``);
    the runtime token is refused, since every runtime holds it. A click replayed within the signature's
    window is answered as a duplicate, never applied twice.
    """

    async def clicks(request: web.Request) -> web.Response:
        services = request.app[SERVICES]
        body = await read_body(request, limit=INTERNAL_CLICK_MAX_BYTES)
        _require_peer(services, request, body)
        try:
            event = event_from_json(parse_json(body))
        except ValueError as exc:
            raise HttpError(400, "invalid_click", str(exc)) from None
        locales = services.settings.card.locales
        if await _seen_here(services.topology.deduper, event):
            log.info("forwarded click %r is a replay: not applied again", event.event_id[:64])
            return web.json_response(render_reply(DUPLICATE_REPLY, locales))
        reply = await forwarded_click(services.actions, services.service.snapshots.load, event)
        return web.json_response(render_reply(reply, locales))

    return [web.post(INTERNAL_CLICKS_PATH, clicks)]


def _require_peer(services: Services, request: web.Request, body: bytes) -> None:
    secret = services.settings.cluster.secret
    now = services.clock.wall()
    if secret is None or not from_peer(
        secret.get_secret_value(), request.method, request.path, request.headers, body, now=now
    ):
        raise HttpError(
            401, "unauthorized", "only a peer instance may call /internal/ (signed with FP_CLUSTER__SECRET)"
        )


async def _seen_here(deduper: Deduper, event: CardActionEvent) -> bool:
    # Its own keys: the forwarding peer already recorded the click's event and token keys.
    new_event = await deduper.first_seen(f"forwarded-event:{event.event_id}")
    new_token = await deduper.first_seen(f"forwarded-token:{event.token}")
    return not (new_event and new_token)
