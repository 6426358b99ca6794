"""The app factory: wires the rooms together inside aiohttp cleanup contexts.

Nothing connects at import time. ``create_app(settings)`` returns the public application (callbacks +
runtime API); starting it opens the database, the Feishu client (or an in-process sandbox when there
are no credentials), the delivery scheduler, the task service, and the admin listener on its own port.
Stopping it flushes every pending final card state within a deadline, then closes everything.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import secrets
import time
from collections.abc import AsyncIterator, Iterable
from contextlib import AsyncExitStack
from typing import TYPE_CHECKING

from aiohttp import web
from aiohttp.typedefs import Middleware
from prometheus_client import CollectorRegistry
from pydantic import SecretStr

from feishu_progress.apps import AppContext, AppRegistry, AppSpec, CardKitScope, default_app_name
from feishu_progress.apps_file import app_specs
from feishu_progress.config import MAX_IMAGE_BYTES, FeishuSettings, Settings
from feishu_progress.db.engine import Database
from feishu_progress.db.migrate import upgrade
from feishu_progress.db.repo import (
    ActionRepository,
    CallbackDedupeRepository,
    SubagentRepository,
    TaskRepository,
)
from feishu_progress.domain import SubagentSummary
from feishu_progress.errors import ConfigError, StartupRefused
from feishu_progress.feishu.callback import CallbackReply, CardActionEvent
from feishu_progress.feishu.cardkit_sink import CardKitWriter
from feishu_progress.feishu.client import FeishuClient
from feishu_progress.feishu.pipeline import CallbackPipeline
from feishu_progress.feishu.sink import FeishuCardSink
from feishu_progress.holder import DatabaseHolder
from feishu_progress.images import ImageFetcher
from feishu_progress.metrics import Metrics
from feishu_progress.ports import Clock, SystemClock
from feishu_progress.progress.scheduler import DeliveryScheduler
from feishu_progress.readiness import admin_deps, watch_readiness
from feishu_progress.runtime.action_log import ActionLog
from feishu_progress.runtime.applier import EventApplier
from feishu_progress.runtime.card_actions import CardActions
from feishu_progress.runtime.creation import TaskCreator
from feishu_progress.runtime.dedupe import PersistentDeduper
from feishu_progress.runtime.housekeeping import Housekeeping
from feishu_progress.runtime.images import ImageKeys
from feishu_progress.runtime.registry import TaskRegistry
from feishu_progress.runtime.service import TaskService
from feishu_progress.runtime.snapshots import SnapshotStore
from feishu_progress.services import SERVICES, Services
from feishu_progress.state_metrics import StateCollector
from feishu_progress.subagents.attach import agent_tables, open_agent_database
from feishu_progress.subagents.batcher import BatchedSubagentSource
from feishu_progress.subagents.manager import SubagentManager
from feishu_progress.waiting import Stopper
from feishu_progress.web.admin import AdminApi
from feishu_progress.web.api import RuntimeApi
from feishu_progress.web.callbacks import callback_routes
from feishu_progress.web.http import bearer_auth, json_errors, loopback_browser_guard, serving
from feishu_progress.web.load import HeavyGate
from feishu_progress.web.openapi import OPENAPI_PATH, openapi_routes

if TYPE_CHECKING:
    from feishu_progress.sandbox.server import RunningSandbox
    from feishu_progress.sandbox.state import SandboxState

log = logging.getLogger(__name__)

SANDBOX_APP_ID = "cli_sandbox"
SHUTDOWN_FLUSH_SECONDS = 20.0
BACKGROUND_DRAIN_SECONDS = 5.0
LONG_CONNECTION_STOP_SECONDS = 5.0
# Cluster mode forwards an image upload (<= 10 MB plus its multipart framing) whole to the card's writer.
MAX_REQUEST_BYTES = MAX_IMAGE_BYTES + 1024 * 1024

__all__ = ["SERVICES", "Services", "create_app"]


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

    async def warm(self) -> int:
        return 0 if self.services.deduper is None else await self.services.deduper.warm()


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
    services = Services(
        settings=settings,
        clock=clock or SystemClock(),
        metrics=Metrics(registry),
        app_specs=app_specs(settings),
    )
    app = web.Application(
        client_max_size=max(settings.callback.max_body_bytes, MAX_REQUEST_BYTES),
        middlewares=_middlewares(services),
    )
    app[SERVICES] = services
    services.metrics.registry.register(StateCollector(services))
    services.pipeline = CallbackPipeline(
        _LateActions(services),
        _LateDeduper(services),
        settings.card.locales,
        services.background,
        clock=services.clock,
    )
    # An app in ws mode has no route: its clicks arrive over the long connection only.
    webhook_apps = [(spec.name, spec.feishu) for spec in services.app_specs if spec.feishu.mode == "webhook"]
    gate = HeavyGate(concurrency=settings.http.large_bodies, max_wait=settings.http.large_body_wait_seconds)
    if webhook_apps:
        app.router.add_routes(
            callback_routes(
                services.pipeline,
                settings,
                services.clock,
                observe=services.metrics.callback_latency.observe,
                apps=webhook_apps,
                default_app=default_app_name([spec.name for spec in services.app_specs]),
                priority=gate,
            )
        )
    app.router.add_routes(RuntimeApi(services.require_service, gate).routes())
    app.router.add_routes(openapi_routes())
    if _clustered(services):
        from feishu_progress.cluster.wiring import internal_routes

        app.router.add_routes(internal_routes(services))
    if settings.sandbox_mode or sandbox is not None:
        _mount_preview(app, services, sandbox)
    app.cleanup_ctx.append(_lifecycle)
    app.on_shutdown.append(_end_long_polls)
    return app


async def _end_long_polls(app: web.Application) -> None:
    """Before aiohttp waits for the requests in flight: the actions long-polls answer at once."""
    service = app[SERVICES].service
    if service is not None:
        service.action_log.stop_waiting()


def _middlewares(services: Services) -> list[Middleware]:
    settings = services.settings
    middlewares: list[Middleware] = [
        json_errors,
        # The contract is not a secret: a client generator reads it before it has a token.
        bearer_auth(
            settings.api.token, prefix="/v1/", name="FP_API__TOKEN", open_paths=frozenset({OPENAPI_PATH})
        ),
    ]
    if settings.feishu.sandbox and settings.api.token is None:  # no token: the browser is the threat
        middlewares.insert(1, loopback_browser_guard("/v1/"))
    if _clustered(services):  # after authentication: only an authorised request is forwarded
        from feishu_progress.cluster.wiring import writer_routing

        middlewares.append(writer_routing(services))
    return middlewares


def _with_sandbox_callback_keys(settings: Settings) -> Settings:
    """In sandbox mode, callbacks are still signed: with keys made up for this process.

    Only what holds the keys (the sandbox's preview page, a test) can click then; nobody who merely
    reaches the port can forge a click, even when sandbox mode was bound off loopback.
    """
    feishu = settings.feishu
    if not settings.sandbox_mode or feishu.encrypt_key is not None or feishu.verification_token is not None:
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
        task = None if service is None else service.registry.by_message(message_id)
        return None if task is None else task.state.requester_open_id

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
    specs = await _sandboxed(services, stack)
    db = await _open_database(services, stack)
    if not _clustered(services):  # before anything is re-attached: a second process must not write
        await _hold_database(services, db, stack)
    _open_agent_database(services, stack)
    fetcher = ImageFetcher(services.settings.images)
    await fetcher.open()
    stack.push_async_callback(fetcher.close)
    apps = AppRegistry([await _open_app(services, spec, fetcher, stack) for spec in specs])
    services.apps = apps
    service = _build_service(services, db, apps)
    if _clustered(services):
        from feishu_progress.cluster.wiring import open_cluster

        restored = await open_cluster(services, db, service, stack)
    else:
        await _warm_dedupe(services)
        restored = await service.restore()
    if restored:
        log.info("re-attached %d unfinished task card(s)", restored)
    _start_loops(services, service)
    await _start_admin(services, stack)
    for app in apps:
        if app.feishu.mode == "ws":  # at most one (apps_file.py): lark-oapi allows one per process
            _start_long_connection(services, app)


async def _open_database(services: Services, stack: AsyncExitStack) -> Database:
    url = services.settings.database_url
    if url.startswith("sqlite"):
        # The embedded default migrates itself: a newcomer's first run needs no extra command.
        await upgrade(url)
    db = Database.open(url)
    stack.push_async_callback(db.close)
    services.db = db
    return db


async def _hold_database(services: Services, db: Database, stack: AsyncExitStack) -> None:
    """Single mode: claim the database for this process, or refuse naming who holds it (holder.py)."""
    holder = DatabaseHolder(db, services.settings.instance_id)
    await holder.claim()
    stack.push_async_callback(holder.release)  # before the database closes
    services.holder = holder


def _open_agent_database(services: Services, stack: AsyncExitStack) -> None:
    """Attach mode: the agent's own database, read-only, for the running-subagent query."""
    url = services.settings.subagents.database_url
    if url is None:
        return
    agent_db = open_agent_database(url)
    stack.push_async_callback(agent_db.close)
    services.agent_db = agent_db
    log.info(
        "attach mode: running subagents are read (read-only) from %s",
        agent_db.url.render_as_string(hide_password=True),
    )


def _subagent_manager(services: Services, db: Database) -> SubagentManager:
    if services.agent_db is None:
        return SubagentManager(db)
    names = services.settings.subagents
    tables = agent_tables(names.execution_table, names.session_table)
    return SubagentManager(services.agent_db, tables, forget_unlisted=True)


async def _open_app(
    services: Services, spec: AppSpec, fetcher: ImageFetcher, stack: AsyncExitStack
) -> AppContext:
    """One app's client, scheduler, image uploads and CardKit fallback (apps.py)."""
    settings, clock = services.settings, services.clock
    client = await FeishuClient.open(
        spec.feishu,
        clock=clock,
        instance_id=settings.instance_id,
        write_timeout=settings.cluster.write_timeout_seconds if _clustered(services) else None,
    )
    stack.push_async_callback(client.close)
    scheduler = _scheduler(spec, client, clock, services.metrics.for_app(spec.name))
    return AppContext(
        spec=spec,
        client=client,
        scheduler=scheduler,
        # Uploads spend the app's image API budget (shared by the instances in cluster mode).
        images=ImageKeys.from_settings(settings.images, client, services.background, fetcher, scheduler),
        cardkit_scope=CardKitScope(clock, spec.cardkit.scope_recheck_seconds),
    )


def _scheduler(spec: AppSpec, client: FeishuClient, clock: Clock, metrics: Metrics) -> DeliveryScheduler:
    """The app's delivery scheduler: PATCHed messages and CardKit card entities, each on its own budget."""
    message_interval = spec.rate.message_interval_ms / 1000
    return DeliveryScheduler(
        FeishuCardSink(client, message_interval=message_interval),
        clock=clock,
        rate=spec.rate,
        metrics=metrics,
        streams=CardKitWriter(client, spec.cardkit, clock=clock, message_interval=message_interval),
        cardkit=spec.cardkit,
    )


def _applier(
    services: Services, db: Database, manager: SubagentManager, apps: AppRegistry, snapshots: SnapshotStore
) -> EventApplier:
    return EventApplier(
        # Attach mode stores nothing: the agent's database has the rows (runtime/applier.py).
        subagent_rows=None if services.agent_db is not None else SubagentRepository(db, services.background),
        manager=manager,
        images=lambda task: apps.get(task.state.app).images,  # an image key belongs to an app
        snapshots=snapshots,
        clock=services.clock,
        metrics=services.metrics,
    )


def _build_service(services: Services, db: Database, apps: AppRegistry) -> TaskService:
    """The runtime rooms, wired (docs/architecture.md shows the picture)."""
    settings, clock, metrics = services.settings, services.clock, services.metrics
    tasks = TaskRepository(db)
    manager = _subagent_manager(services, db)
    snapshots = SnapshotStore(tasks, clock, services.background)
    registry = TaskRegistry(
        settings=settings,
        clock=clock,
        apps=apps,
        # Every live card's subagent load goes through one batcher: <= 2 queries/s per process.
        subagents=BatchedSubagentSource(TimedSubagents(manager, metrics), clock, services.background),
        metrics=metrics,
    )
    action_log = ActionLog(ActionRepository(db), clock, services.background)
    service = TaskService(
        registry=registry,
        creator=TaskCreator(settings=settings, repo=tasks, apps=apps, registry=registry, clock=clock),
        applier=_applier(services, db, manager, apps, snapshots),
        snapshots=snapshots,
        action_log=action_log,
        housekeeping=Housekeeping(
            registry=registry,
            snapshots=snapshots,
            dedupe=CallbackDedupeRepository(db),
            stale_after=settings.task.stale_after,
            clock=clock,
        ),
        apps=apps,
        background=services.background,
        max_live=settings.task.max_live,
    )
    for app in apps:
        app.scheduler.listener = service
    services.service = service
    services.actions = CardActions(
        tasks=service.task,
        action_log=action_log,
        snapshots=snapshots,
        saved_state=snapshots.load,
        settings=settings,
        clock=clock,
    )
    services.deduper = PersistentDeduper(
        CallbackDedupeRepository(db), settings.callback.dedupe_ttl_seconds, clock, services.background
    )
    return service


async def _warm_dedupe(services: Services) -> None:
    assert services.deduper is not None
    try:
        await services.deduper.warm()
    except Exception as exc:  # clicks are still deduped in memory; redeliveries across the restart may pass
        log.warning("callback dedupe keys could not be loaded: %s", type(exc).__name__)


def _start_loops(services: Services, service: TaskService) -> None:
    assert services.apps is not None
    for app in services.apps:
        app.scheduler.start()
    services.stopper = stopper = Stopper(services.clock)
    services.background.spawn(service.housekeeping.run(stopper), name="housekeeping")
    services.background.spawn(service.snapshots.run(stopper), name="persist-snapshots")
    if services.cluster is not None:
        services.cluster.start_loops(stopper)
    if services.holder is not None:
        services.background.spawn(services.holder.run(stopper), name="database-holder")


def _clustered(services: Services) -> bool:
    return services.settings.redis_url is not None


async def _sandboxed(services: Services, stack: AsyncExitStack) -> list[AppSpec]:
    """The apps to open; in sandbox mode (no credentials, no apps file) the default app is the sandbox's."""
    settings = services.settings
    if not settings.sandbox_mode:
        return services.app_specs
    feishu = await _sandbox_feishu(services, stack)
    return [dataclasses.replace(spec, feishu=feishu) for spec in services.app_specs]


async def _sandbox_feishu(services: Services, stack: AsyncExitStack) -> FeishuSettings:
    settings = services.settings
    from feishu_progress.sandbox.server import run_sandbox
    from feishu_progress.sandbox.state import SandboxConfig

    # A secret made up per start (nothing else on the host can take the sandbox's token) and no test
    # endpoints: the in-process sandbox listens on a loopback port anyone on the host reaches.
    app_secret = secrets.token_urlsafe(24)
    sandbox = await stack.enter_async_context(
        run_sandbox(SandboxConfig(app_id=SANDBOX_APP_ID, app_secret=app_secret, test_endpoints=False))
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
            "app_secret": SecretStr(app_secret),
        }
    )


async def _start_admin(services: Services, stack: AsyncExitStack) -> None:
    settings = services.settings
    deps = admin_deps(services)
    admin = AdminApi(deps).app()
    try:
        services.admin_url = await stack.enter_async_context(
            serving(admin, settings.admin.host, settings.admin.port)
        )
    except OSError as exc:  # busy or not this host's address: the operator's setting, not a bug
        raise StartupRefused(
            f"cannot listen on {settings.admin.host}:{settings.admin.port} for the admin listener "
            f"({exc.strerror or exc}): set FP_ADMIN__PORT to a free port (or FP_ADMIN__HOST)"
        ) from None
    log.info("admin listener on %s", services.admin_url)
    assert services.stopper is not None
    services.background.spawn(watch_readiness(deps.checks, services.stopper), name="readiness-gauges")


def _start_long_connection(services: Services, app: AppContext) -> None:
    from feishu_progress.feishu.ws import WsCallbackBridge, start_long_connection

    assert services.pipeline is not None
    bridge = WsCallbackBridge(
        services.pipeline,
        asyncio.get_running_loop(),
        observe=services.metrics.callback_latency.observe,
        app=app.name,
    )
    feishu = app.feishu
    secret = feishu.app_secret.get_secret_value() if feishu.app_secret is not None else None
    services.long_connection = start_long_connection(feishu.app_id, secret, feishu.base_url, bridge)
    log.info("long-connection (ws) receiver of app %s started in its own thread", app.name)


async def _stop_long_connection(services: Services) -> None:
    connection = services.long_connection
    if connection is None:
        return
    # In a worker thread: joining on the loop would block the clicks the ws thread is handing over.
    if not await asyncio.to_thread(connection.stop, LONG_CONNECTION_STOP_SECONDS):
        log.error(
            "shutdown: the long-connection thread did not stop within %.0f s", LONG_CONNECTION_STOP_SECONDS
        )


async def _flush_cards(services: Services) -> None:
    if services.apps is None:
        return
    reports = await asyncio.gather(*(app.scheduler.flush(SHUTDOWN_FLUSH_SECONDS) for app in services.apps))
    for app, report in zip(services.apps, reports, strict=True):
        if not report.complete:
            log.error("shutdown: app %s: %s", app.name, report)
        await app.scheduler.stop()


async def _handed_over(services: Services) -> bool:
    if services.cluster is None:
        return False
    from feishu_progress.cluster.wiring import stop_cluster

    return await stop_cluster(services)


async def _stop(services: Services) -> None:
    started = time.monotonic()
    await _stop_long_connection(services)  # first: no clicks arrive while the rest winds down
    if services.stopper is not None:
        services.stopper.stop()  # the loops end after their current pass; drained below
    if not await _handed_over(services):  # handed over: the live peers write this instance's cards
        await _flush_cards(services)
    if services.service is not None:
        await services.service.snapshots.flush()
    cancelled = await services.background.drain(BACKGROUND_DRAIN_SECONDS)
    if cancelled:
        log.warning("shutdown: %d background task(s) cancelled", cancelled)
    log.info("shutdown drained in %.2f s", time.monotonic() - started)
