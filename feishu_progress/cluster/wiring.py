"""Cluster mode, wired into the app: the same rooms as single mode with the cluster parts plugged in.

Single mode is not a second implementation: this module only sets the hooks the rooms already have
(the scheduler's gate, the snapshot store's owner, the task service's ownership, the action log's nudge,
card actions' remote clicks) and adds two HTTP pieces: a middleware that sends a request for a card to
the instance that writes it, and ``/internal/v1/clicks`` where that instance takes a forwarded click.
"""

from __future__ import annotations

import asyncio
import json
import logging
import uuid
from collections.abc import Awaitable, Callable
from contextlib import AsyncExitStack
from dataclasses import dataclass

from aiohttp import web
from aiohttp.typedefs import Middleware
from sqlalchemy.exc import SQLAlchemyError

from feishu_progress.cluster.forward import FORWARDED_HEADER, INTERNAL_CLICKS_PATH, event_from_json
from feishu_progress.cluster.mode import ClusterMode
from feishu_progress.cluster.trust import from_peer
from feishu_progress.db.engine import Database
from feishu_progress.db.repo import CallbackDedupeRepository, storable_key
from feishu_progress.db.times import utc_datetime
from feishu_progress.errors import ForwardFailed, NotWritableHere, OwnedElsewhere, UnknownTask
from feishu_progress.feishu.callback import CardActionEvent, render_reply
from feishu_progress.feishu.pipeline import DUPLICATE_REPLY
from feishu_progress.ports import Deduper
from feishu_progress.runtime.event_log import EventLog
from feishu_progress.runtime.responses import EventsAccepted
from feishu_progress.runtime.service import TaskService
from feishu_progress.services import Services
from feishu_progress.web.api import read_event_batch
from feishu_progress.web.http import HttpError, parse_id, parse_json, read_body

log = logging.getLogger(__name__)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
INTERNAL_CLICK_MAX_BYTES = 256 * 1024  # a click's form values; the public callback caps them lower
ACTIONS_LONG_POLL_SECONDS = 1.0  # long-polls look at the table this often (a nudge may be lost)


async def open_cluster(services: Services, db: Database, service: TaskService, stack: AsyncExitStack) -> int:
    """Plug cluster mode into a built service, take the lease and this instance's cards; how many."""
    settings = services.settings
    cluster = ClusterMode(settings, db, services.clock, services.metrics, services.background)
    stack.push_async_callback(cluster.close)
    services.cluster = cluster
    service.ownership = cluster
    service.applier.durable = True
    service.applier.event_log = EventLog(cluster.event_log, services.background)
    service.snapshots.owner = settings.instance_id
    service.snapshots.on_lost = service.drop_local
    for app in service.apps:  # each app's writes go through its own shared budget (Redis keys per app_id)
        app.scheduler.gate = cluster.gate_for(app.feishu.app_id, app.spec.rate)
    service.creator.owner = settings.instance_id
    service.action_log.recorded = cluster.nudge
    service.action_log.poll_interval = ACTIONS_LONG_POLL_SECONDS
    assert services.actions is not None
    services.actions.remote = cluster
    services.deduper = ClusterDeduper(
        cluster, CallbackDedupeRepository(db), settings.callback.dedupe_ttl_seconds, services
    )
    return await cluster.start(service)


class ClusterDeduper:
    """Callback dedupe every instance shares: Redis SET NX, or the database's unique key without Redis."""

    def __init__(
        self, cluster: ClusterMode, repo: CallbackDedupeRepository, ttl_seconds: int, services: Services
    ) -> None:
        self._cluster = cluster
        self._repo = repo
        self._ttl = ttl_seconds
        self._services = services

    async def warm(self) -> int:
        return 0  # nothing kept in memory: every answer comes from Redis or the database

    async def first_seen(self, key: str) -> bool:
        stored = storable_key(key)
        seen = await self._cluster.first_seen(stored, self._ttl)
        if seen is not None:
            return seen
        return await self._repo.first_seen(stored, self._ttl, utc_datetime(self._services.clock.wall()))


def writer_routing(services: Services) -> Middleware:
    """Middleware: a request for one task goes to the instance that writes its card.

    An event batch that cannot reach the writer is stored in the event log and answered 202: the writer
    (or the instance that takes the card over) applies it in order. Only a database out of reach is a 503.
    """

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        session_id = _routed_session(request)
        if session_id is None or services.service is None:
            return await handler(request)
        try:
            await services.service.task(session_id)
        except NotWritableHere:
            if _is_event_batch(request) and services.cluster is not None:
                return await _forward_events(services, request, session_id, None)
            raise HttpError(
                503, "unavailable", "this instance is not writing cards now; retry", retry_after=1
            ) from None
        except OwnedElsewhere as elsewhere:
            if _is_event_batch(request) and services.cluster is not None:
                return await _forward_events(services, request, session_id, elsewhere)
            return await _forward(services, request, elsewhere)
        try:
            return await handler(request)
        except NotWritableHere:  # the card changed hands while the batch was applied: not saved here
            if _is_event_batch(request) and services.cluster is not None:
                return await _forward_events(services, request, session_id, None)
            raise

    return middleware


def _routed_session(request: web.Request) -> int | None:
    raw = request.match_info.get("session_id")
    if raw is None or request.path.endswith("/actions"):
        return None  # the action log answers from any instance
    return parse_id(raw)


def _is_event_batch(request: web.Request) -> bool:
    return request.method == "POST" and request.path.endswith("/events")


async def _forward(services: Services, request: web.Request, elsewhere: OwnedElsewhere) -> web.StreamResponse:
    if request.headers.get(FORWARDED_HEADER) or elsewhere.address is None or services.cluster is None:
        raise HttpError(503, "unavailable", "the card's writer is changing; retry", retry_after=1)
    try:
        forwarded: web.StreamResponse = await services.cluster.forwarder.request(request, elsewhere.address)
        return forwarded
    except ForwardFailed as exc:
        log.warning("forwarding %r to %s failed: %s", request.path, elsewhere.owner, exc)
        raise HttpError(
            503, "unavailable", "the card's writer did not answer; retry", retry_after=1
        ) from None


async def _forward_events(
    services: Services, request: web.Request, session_id: int, elsewhere: OwnedElsewhere | None
) -> web.Response:
    """A batch goes to the card's writer; the event log takes it if the writer does not, in time.

    The batch is checked here first (a bad one is refused here as the writer would). Forwarded and
    logged copies carry one Idempotency-Key (made up when the runtime sent none): a writer that
    applied the forwarded copy after all skips the logged one.
    """
    cluster = services.cluster
    assert cluster is not None
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


def internal_routes(services: Services) -> list[web.RouteDef]:
    """``POST /internal/v1/clicks``: a click a peer verified and deduplicated, for a card here.

    Only a peer may send one: the request must carry the cluster secret's signature (``cluster/trust.py``);
    the runtime token is refused, since every runtime holds it. A click replayed within the signature's
    window is answered as a duplicate, never applied twice.
    """

    async def clicks(request: web.Request) -> web.Response:
        body = await read_body(request, limit=INTERNAL_CLICK_MAX_BYTES)
        _require_peer(services, request, body)
        if services.actions is None or services.deduper is None:
            raise HttpError(503, "unavailable", "starting up", retry_after=1)
        try:
            event = event_from_json(parse_json(body))
        except ValueError as exc:
            raise HttpError(400, "invalid_click", str(exc)) from None
        if await _seen_here(services.deduper, event):
            log.info("forwarded click %r is a replay: not applied again", event.event_id[:64])
            return web.json_response(render_reply(DUPLICATE_REPLY, services.settings.card.locales))
        reply = await services.actions.handle(event, forwarded=True)
        return web.json_response(render_reply(reply, services.settings.card.locales))

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


async def stop_cluster(services: Services) -> bool:
    """Graceful stop with live peers: hand the cards over instead of flushing them; False: not done."""
    cluster, apps, service = services.cluster, services.apps, services.service
    if cluster is None or apps is None or service is None or cluster.lease.live_instances() < 2:
        return False
    wait = services.settings.cluster.write_timeout_seconds
    in_flight: set[str] = set()
    for flights in await asyncio.gather(*(app.scheduler.stop_and_report(wait) for app in apps)):
        in_flight |= flights
    await service.snapshots.flush()
    released = await cluster.hand_over(in_flight)
    log.info(
        "handed %d card(s) over (%d with a write in flight wait out its timeout)", released, len(in_flight)
    )
    return True
