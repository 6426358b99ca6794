"""The app factory: wires the rooms together inside aiohttp cleanup contexts.

Nothing connects at import time. ``create_app(settings)`` returns the public application (callbacks +
runtime API); starting it opens the database, the Feishu client (or an in-process sandbox when there
are no credentials), the delivery scheduler, the task service, and the admin listener on its own port.
Stopping it flushes every pending final card state within a deadline, then closes everything.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import threading
import time
from collections.abc import AsyncIterator, Iterable
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from aiohttp import web
from prometheus_client import CollectorRegistry
from pydantic import SecretStr

from feishu_progress.config import FeishuSettings, Settings
from feishu_progress.db.engine import Database
from feishu_progress.db.migrate import migration_state, upgrade
from feishu_progress.db.repo import (
    ActionRepository,
    CallbackDedupeRepository,
    SubagentRepository,
    TaskRepository,
)
from feishu_progress.domain import SubagentSummary
from feishu_progress.errors import ConfigError
from feishu_progress.feishu.callback import CallbackReply, CardActionEvent
from feishu_progress.feishu.client import FeishuClient
from feishu_progress.feishu.sink import CachingImageUploader, FeishuCardSink
from feishu_progress.metrics import Metrics
from feishu_progress.ports import Clock, SystemClock
from feishu_progress.progress.scheduler import Deliverable, DeliveryScheduler
from feishu_progress.runtime.actions import CardActions
from feishu_progress.runtime.background import BackgroundTasks
from feishu_progress.runtime.dedupe import PersistentDeduper
from feishu_progress.runtime.service import Repos, TaskService
from feishu_progress.subagents.batcher import BatchedSubagentSource
from feishu_progress.subagents.manager import SubagentManager
from feishu_progress.web.admin import AdminApi, AdminDeps
from feishu_progress.web.api import RuntimeApi
from feishu_progress.web.callbacks import callback_routes
from feishu_progress.web.http import bearer_auth, json_errors

if TYPE_CHECKING:
    from feishu_progress.sandbox.server import RunningSandbox
    from feishu_progress.sandbox.state import SandboxState

log = logging.getLogger(__name__)

SANDBOX_APP_ID = "cli_sandbox"
SANDBOX_APP_SECRET = "sandbox-secret"
SHUTDOWN_FLUSH_SECONDS = 20.0
BACKGROUND_DRAIN_SECONDS = 5.0


@dataclass
class Services:
    """Everything the running app holds; filled in when the app starts."""

    settings: Settings
    clock: Clock
    metrics: Metrics
    background: BackgroundTasks = field(default_factory=BackgroundTasks)
    db: Database | None = None
    client: FeishuClient | None = None
    scheduler: DeliveryScheduler | None = None
    service: TaskService | None = None
    actions: CardActions | None = None
    deduper: PersistentDeduper | None = None
    sandbox: RunningSandbox | None = None  # only in sandbox mode (no Feishu credentials)
    admin_url: str | None = None
    public_url: str | None = None
    ws_thread: threading.Thread | None = None

    def require_service(self) -> TaskService:
        if self.service is None:
            raise RuntimeError("the app has not started")
        return self.service


SERVICES = web.AppKey("services", Services)


class TimedSubagents:
    """The manager as the live cards see it, with the query latency recorded."""

    def __init__(self, manager: SubagentManager, metrics: Metrics) -> None:
        self.manager = manager
        self.metrics = metrics

    async def list_running(self, parent_session_id: int) -> list[SubagentSummary]:
        with self.metrics.subagent_query_seconds.time():
            return await self.manager.list_running(parent_session_id)

    async def list_running_many(self, parent_session_ids: Iterable[int]) -> dict[int, list[SubagentSummary]]:
        with self.metrics.subagent_query_seconds.time():
            return await self.manager.list_running_many(parent_session_ids)


class _LateActions:
    """The callback route is registered before the app starts; the handler exists only after."""

    def __init__(self, services: Services) -> None:
        self.services = services

    async def handle(self, event: CardActionEvent) -> CallbackReply:
        if self.services.actions is None:
            return CallbackReply(toast_type="error", text="starting up, try again")
        return await self.services.actions.handle(event)


class _LateDeduper:
    def __init__(self, services: Services) -> None:
        self.services = services

    async def first_seen(self, key: str) -> bool:
        if self.services.deduper is None:
            return True
        return await self.services.deduper.first_seen(key)


def create_app(
    settings: Settings,
    *,
    clock: Clock | None = None,
    registry: CollectorRegistry | None = None,
    sandbox: RunningSandbox | None = None,
) -> web.Application:
    """The public application; its startup brings up everything else (see module docstring).

    ``sandbox``: a sandbox the caller runs itself (the demo) and whose cards the preview page shows.
    """
    problems = settings.serving_problems()
    if problems:
        raise ConfigError("; ".join(problems))
    settings = _with_sandbox_callback_keys(settings)
    services = Services(settings=settings, clock=clock or SystemClock(), metrics=Metrics(registry))
    app = web.Application(
        client_max_size=max(settings.callback.max_body_bytes, 8 * 1024 * 1024),
        middlewares=[json_errors, bearer_auth(settings.api.token, prefix="/v1/", name="FP_API__TOKEN")],
    )
    app[SERVICES] = services
    app.router.add_routes(
        callback_routes(
            _LateActions(services),
            _LateDeduper(services),
            settings,
            services.clock,
            observe=services.metrics.callback_latency.observe,
        )
    )
    app.router.add_routes(RuntimeApi(services.require_service).routes())
    if settings.feishu.sandbox or sandbox is not None:
        _mount_preview(app, services, sandbox)
    app.cleanup_ctx.append(_lifecycle)
    return app


def _with_sandbox_callback_keys(settings: Settings) -> Settings:
    """In sandbox mode, callbacks are still signed: with keys made up for this process.

    Only what holds the keys (the sandbox's preview page, a test) can click then; nobody who merely
    reaches the port can forge a click, even when sandbox mode was bound off loopback.
    """
    feishu = settings.feishu
    if not feishu.sandbox or feishu.encrypt_key is not None or feishu.verification_token is not None:
        return settings
    keys = {
        "encrypt_key": SecretStr(secrets.token_urlsafe(32)),
        "verification_token": SecretStr(secrets.token_urlsafe(24)),
    }
    return settings.model_copy(update={"feishu": feishu.model_copy(update=keys)})


def _mount_preview(app: web.Application, services: Services, handed: RunningSandbox | None) -> None:
    """The sandbox preview page at /sandbox/ (sandbox/preview.py): only where a sandbox exists."""
    from feishu_progress.sandbox.preview import callback_keys, mount_preview

    def sandbox_state() -> SandboxState | None:
        running = handed or services.sandbox  # sandbox mode starts its own after the routes are frozen
        return running.state if running is not None else None

    def requester_of(message_id: str) -> str | None:
        service = services.service
        if service is None:
            return None
        for task in service.tasks.values():
            if task.state.message_id == message_id:
                return task.state.requester_open_id
        return None

    feishu = services.settings.feishu
    mount_preview(
        app,
        sandbox_state,
        requester_of,
        keys=callback_keys(feishu.encrypt_key, feishu.verification_token),
        api_token=services.settings.api.token,
        wall=services.clock.wall,
    )


async def _lifecycle(app: web.Application) -> AsyncIterator[None]:
    services = app[SERVICES]
    async with AsyncExitStack() as stack:
        await _start(services, stack)
        yield
        await _stop(services)


async def _start(services: Services, stack: AsyncExitStack) -> None:
    settings = services.settings
    feishu_settings = await _feishu_settings(services, stack)

    if settings.database_url.startswith("sqlite"):
        # The embedded default migrates itself: a newcomer's first run needs no extra command.
        await upgrade(settings.database_url)
    db = Database.open(settings.database_url)
    stack.push_async_callback(db.close)
    services.db = db
    repos = Repos(
        TaskRepository(db), SubagentRepository(db), ActionRepository(db), CallbackDedupeRepository(db)
    )

    client = await FeishuClient.open(feishu_settings)
    stack.push_async_callback(client.close)
    services.client = client

    scheduler = DeliveryScheduler(
        FeishuCardSink(client, message_interval=settings.rate.message_interval_ms / 1000),
        clock=services.clock,
        rate=settings.rate,
        metrics=services.metrics,
        on_stopped=lambda card, reason: _card_stopped(services, card, reason),
    )
    services.scheduler = scheduler
    manager = SubagentManager(db)
    service = TaskService(
        settings=settings,
        repos=repos,
        subagents=manager,
        # Every live card's subagent load goes through one batcher: <= 2 queries/s per process.
        card_subagents=BatchedSubagentSource(TimedSubagents(manager, services.metrics), services.clock),
        scheduler=scheduler,
        sender=client,
        uploader=CachingImageUploader(client),
        clock=services.clock,
        metrics=services.metrics,
        background=services.background,
    )
    services.service = service
    services.actions = CardActions(service, settings, services.background)
    services.deduper = PersistentDeduper(
        repos.dedupe, settings.callback.dedupe_ttl_seconds, services.clock, services.background
    )
    try:
        await services.deduper.warm()
    except Exception:  # clicks are still deduped in memory; redeliveries across the restart may pass
        log.exception("callback dedupe keys could not be loaded")
    restored = await service.restore()
    if restored:
        log.info("re-attached %d unfinished task card(s)", restored)
    scheduler.start()
    services.background.spawn(service.watch_stale(), name="stale-tasks")
    services.background.spawn(service.persist_loop(), name="persist-snapshots")
    await _start_admin(services, stack)
    if settings.feishu.mode == "ws":
        _start_long_connection(services)


async def _feishu_settings(services: Services, stack: AsyncExitStack) -> FeishuSettings:
    settings = services.settings
    if not settings.feishu.sandbox:
        return settings.feishu
    from feishu_progress.sandbox.server import run_sandbox
    from feishu_progress.sandbox.state import SandboxConfig

    sandbox = await stack.enter_async_context(
        run_sandbox(SandboxConfig(app_id=SANDBOX_APP_ID, app_secret=SANDBOX_APP_SECRET))
    )
    services.sandbox = sandbox
    log.warning(
        "NO FEISHU CREDENTIALS (FP_FEISHU__APP_ID / FP_FEISHU__APP_SECRET): cards go to the in-process "
        "SANDBOX at %s, not to Feishu. Nobody will see them.",
        sandbox.base_url,
    )
    return settings.feishu.model_copy(
        update={
            "base_url": sandbox.base_url,
            "app_id": SANDBOX_APP_ID,
            "app_secret": SecretStr(SANDBOX_APP_SECRET),
        }
    )


def _card_stopped(services: Services, card: Deliverable, reason: str) -> None:
    service = services.service
    session_id = getattr(card, "session_id", None)
    if service is None or not isinstance(session_id, int):
        return
    services.background.spawn(
        service.repos.tasks.set_stop_reason(session_id, reason[:255]), name=f"stop-reason-{session_id}"
    )


async def _start_admin(services: Services, stack: AsyncExitStack) -> None:
    settings = services.settings
    admin = AdminApi(_admin_deps(services)).app()
    runner = web.AppRunner(admin, access_log=None)
    await runner.setup()
    stack.push_async_callback(runner.cleanup)
    site = web.TCPSite(runner, settings.admin.host, settings.admin.port)
    await site.start()
    host, port = runner.addresses[0][:2]
    services.admin_url = f"http://{host}:{port}"
    log.info("admin listener on %s", services.admin_url)


def _admin_deps(services: Services) -> AdminDeps:
    async def database() -> str | None:
        assert services.db is not None
        await asyncio.wait_for(services.db.ping(), 2.0)
        current, head = await asyncio.wait_for(migration_state(services.settings.database_url), 5.0)
        return (
            None
            if current == head
            else f"migrations at {current}, head is {head}: run feishu-progress migrate"
        )

    async def feishu_token() -> str | None:
        assert services.client is not None
        return (
            None if await asyncio.wait_for(services.client.token_ok(), 5.0) else "tenant token not obtainable"
        )

    async def scheduler() -> str | None:
        running = services.scheduler is not None and services.scheduler.running
        return None if running else "delivery scheduler not running"

    async def long_connection() -> str | None:
        alive = services.ws_thread is not None and services.ws_thread.is_alive()
        return None if alive else "long-connection receiver thread is not running"

    def cards() -> list[dict[str, object]]:
        service = services.service
        if service is None:
            return []
        now = services.clock.wall()
        return [
            {
                "session_id": task.state.session_id,
                "status": task.state.status.value,
                "round": task.state.round,
                "message_id": task.state.message_id,
                "stopped_reason": task.card.stopped_reason,
                "seconds_since_event": round(now - task.state.last_event_at, 1),
            }
            for task in service.tasks.values()
        ]

    return AdminDeps(
        registry=services.metrics.registry,
        checks={
            "database": database,
            "feishu_token": feishu_token,
            "scheduler": scheduler,
            **({"long_connection": long_connection} if services.settings.feishu.mode == "ws" else {}),
        },
        cards=cards,
        token=services.settings.admin.token,
    )


def _start_long_connection(services: Services) -> None:
    from feishu_progress.feishu.ws import WsCallbackBridge, start_ws_receiver

    bridge = WsCallbackBridge(
        _LateActions(services),
        _LateDeduper(services),
        asyncio.get_running_loop(),
        services.settings.card.locales,
    )
    services.ws_thread = start_ws_receiver(services.settings, bridge)
    log.info("long-connection (ws) receiver started in its own thread")


async def _stop(services: Services) -> None:
    started = time.monotonic()
    if services.service is not None:
        services.service.stop_loops()  # they end after their current pass; drained below
    if services.scheduler is not None:
        report = await services.scheduler.flush(SHUTDOWN_FLUSH_SECONDS)
        if not report.complete:
            log.error("shutdown: %s", report)
        await services.scheduler.stop()
    if services.service is not None:
        await services.service.flush_dirty()
    cancelled = await services.background.drain(BACKGROUND_DRAIN_SECONDS)
    if cancelled:
        log.warning("shutdown: %d background task(s) cancelled", cancelled)
    log.info("shutdown drained in %.2f s", time.monotonic() - started)
