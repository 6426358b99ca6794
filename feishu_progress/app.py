"""The app factory: wires the rooms together inside aiohttp cleanup contexts.

Nothing connects at import time. ``create_app(settings)`` returns the public application (callbacks +
runtime API); starting it opens the database, the topology (single instance, or cluster mode with
FP_REDIS_URL: ``topology.py``), the Feishu client (or an in-process sandbox when there are no
credentials), the delivery scheduler, the task service, and the admin listener on its own port — each
built with what it depends on — and keeps them as ``app[SERVICES]`` (``services.py``). Stopping it
flushes every pending final card state within a deadline (or hands the cards to live peers), then
closes everything.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import secrets
import time
from collections.abc import AsyncIterator, Callable, Iterable
from contextlib import AsyncExitStack
from typing import TYPE_CHECKING

from aiohttp import web
from aiohttp.typedefs import Middleware
from prometheus_client import CollectorRegistry
from pydantic import SecretStr

from feishu_progress.apps import AppContext, AppRegistry, AppSpec, CardKitScope, default_app_name
from feishu_progress.apps_file import app_specs
from feishu_progress.background import BackgroundTasks
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
from feishu_progress.feishu.client import FeishuClient
from feishu_progress.feishu.observe import write_observer
from feishu_progress.feishu.pipeline import CallbackPipeline
from feishu_progress.feishu.writers import CardWriters
from feishu_progress.feishu.ws import LongConnection
from feishu_progress.images import ImageFetcher
from feishu_progress.loop_lag import watch_loop_lag
from feishu_progress.metrics import Metrics
from feishu_progress.ports import Clock, SystemClock
from feishu_progress.progress.admission import Admission
from feishu_progress.progress.rate_budget import BudgetTable
from feishu_progress.progress.scheduler import DeliveryScheduler
from feishu_progress.readiness import admin_deps, watch_readiness
from feishu_progress.runtime.action_log import ActionLog
from feishu_progress.runtime.applier import EventApplier
from feishu_progress.runtime.card_actions import CardActions
from feishu_progress.runtime.creation import TaskCreator
from feishu_progress.runtime.housekeeping import Housekeeping
from feishu_progress.runtime.images import ImageKeys
from feishu_progress.runtime.registry import TaskRegistry
from feishu_progress.runtime.service import TaskService
from feishu_progress.runtime.snapshots import SnapshotStore
from feishu_progress.services import ADMIN_URL, SERVICES, Services, Setup
from feishu_progress.state_metrics import StateCollector
from feishu_progress.subagents.attach import agent_tables, open_agent_database
from feishu_progress.subagents.batcher import BatchedSubagentSource
from feishu_progress.subagents.manager import SubagentManager
from feishu_progress.topology import Topology, open_single_instance
from feishu_progress.waiting import Stopper
from feishu_progress.web.admin import AdminApi
from feishu_progress.web.api import RuntimeApi
from feishu_progress.web.callbacks import callback_routes
from feishu_progress.web.http import bearer_auth, json_errors, loopback_browser_guard, serving
from feishu_progress.web.load import HeavyGate
from feishu_progress.web.openapi import OPENAPI_PATH, openapi_routes

if TYPE_CHECKING:
    from opentelemetry.trace import TracerProvider

    from feishu_progress.sandbox.server import RunningSandbox
    from feishu_progress.sandbox.state import SandboxState
    from feishu_progress.tracing import Tracing

log = logging.getLogger(__name__)

SANDBOX_APP_ID = "cli_sandbox"
SHUTDOWN_FLUSH_SECONDS = 20.0
BACKGROUND_DRAIN_SECONDS = 5.0
LONG_CONNECTION_STOP_SECONDS = 5.0
# Cluster mode forwards an image upload (<= 10 MB plus its multipart framing) whole to the card's writer.
MAX_REQUEST_BYTES = MAX_IMAGE_BYTES + 1024 * 1024

__all__ = ["ADMIN_URL", "SERVICES", "Services", "create_app"]


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


def create_app(
    settings: Settings,
    *,
    clock: Clock | None = None,
    registry: CollectorRegistry | None = None,
    sandbox: RunningSandbox | None = None,
    tracer_provider: TracerProvider | None = None,
) -> web.Application:
    """The public application; its startup brings up everything else (see module docstring).

    ``sandbox``: a sandbox the caller runs itself (the demo) and whose cards the preview page shows.
    ``tracer_provider``: traces requests and Open API writes (tracing.py, the ``[otel]`` extra); the
    caller owns it (shuts it down). None: no tracing, and opentelemetry is never imported.
    """
    problems = settings.serving_problems()
    if problems:
        raise ConfigError("; ".join(problems))
    settings = _with_sandbox_callback_keys(settings)
    setup = Setup(
        settings=settings,
        clock=clock or SystemClock(),
        metrics=Metrics(registry),
        background=BackgroundTasks(),
        app_specs=tuple(app_specs(settings)),
        tracing=_tracing(tracer_provider),
    )
    app = web.Application(
        client_max_size=max(settings.callback.max_body_bytes, MAX_REQUEST_BYTES),
        middlewares=_middlewares(settings, setup.tracing),
    )

    def started() -> Services:
        return app[SERVICES]  # requests are served only once the app has started

    # One gate: large runtime bodies go one at a time, and wait while a click is answered.
    gate = HeavyGate(
        concurrency=settings.http.large_bodies,
        max_wait=settings.http.large_body_wait_seconds,
        batch_slice_seconds=settings.http.batch_slice_seconds,
        on_batch_wait=setup.metrics.batch_turn_waits.inc,
    )
    _add_callback_routes(app, setup, started, gate)
    app.router.add_routes(RuntimeApi(lambda: started().service, gate).routes())
    app.router.add_routes(openapi_routes())
    if _clustered(settings):
        from feishu_progress.cluster.http import internal_routes

        app.router.add_routes(internal_routes())
    if settings.sandbox_mode or sandbox is not None:
        _mount_preview(app, setup, sandbox, started)

    async def lifecycle(app: web.Application) -> AsyncIterator[None]:
        async with AsyncExitStack() as stack:
            services = await _start(app, setup, stack)
            yield
            await _stop(services)

    app.cleanup_ctx.append(lifecycle)
    app.on_shutdown.append(_end_long_polls)
    return app


def _add_callback_routes(
    app: web.Application, setup: Setup, started: Callable[[], Services], gate: HeavyGate
) -> None:
    # An app in ws mode has no route: its clicks arrive over the long connection only.
    webhook_apps = [(spec.name, spec.feishu) for spec in setup.app_specs if spec.feishu.mode == "webhook"]
    if not webhook_apps:
        return
    app.router.add_routes(
        callback_routes(
            lambda: started().pipeline,
            setup.settings,
            setup.clock,
            observe=setup.metrics.callback_latency.observe,
            apps=webhook_apps,
            default_app=default_app_name([spec.name for spec in setup.app_specs]),
            priority=gate,
        )
    )


async def _end_long_polls(app: web.Application) -> None:
    """Before aiohttp waits for the requests in flight: the actions long-polls answer at once."""
    services = app.get(SERVICES)  # None: the app never finished starting
    if services is not None:
        services.service.action_log.stop_waiting()


def _middlewares(settings: Settings, tracing: Tracing | None) -> list[Middleware]:
    middlewares: list[Middleware] = [
        json_errors,
        # The contract is not a secret: a client generator reads it before it has a token.
        bearer_auth(
            settings.api.token, prefix="/v1/", name="FP_API__TOKEN", open_paths=frozenset({OPENAPI_PATH})
        ),
    ]
    if settings.feishu.sandbox and settings.api.token is None:  # no token: the browser is the threat
        middlewares.insert(1, loopback_browser_guard("/v1/"))
    if _clustered(settings):  # after authentication: only an authorised request is forwarded
        from feishu_progress.cluster.http import writer_routing

        middlewares.append(writer_routing())
    if tracing is not None:  # outermost: a span sees the answer every other middleware made
        middlewares.insert(0, tracing.middleware())
    return middlewares


def _tracing(provider: TracerProvider | None) -> Tracing | None:
    if provider is None:
        return None
    from feishu_progress.tracing import Tracing

    return Tracing(provider)


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


def _mount_preview(
    app: web.Application, setup: Setup, handed: RunningSandbox | None, started: Callable[[], Services]
) -> None:
    """The sandbox preview page at /sandbox/ (sandbox/preview.py): only where a sandbox exists."""
    from feishu_progress.sandbox.preview import callback_keys, mount_preview

    def sandbox_state() -> SandboxState | None:
        running = handed or started().sandbox  # sandbox mode starts its own after the routes are frozen
        return running.state if running is not None else None

    def requester_of(message_id: str) -> str | None:
        task = started().service.registry.by_message(message_id)
        return None if task is None else task.state.requester_open_id

    feishu = setup.settings.feishu
    mount_preview(
        app,
        sandbox_state,
        requester_of,
        keys=callback_keys(feishu.encrypt_key, feishu.verification_token),
        api_token=setup.settings.api.token,
        wall=setup.clock.wall,
    )


async def _start(app: web.Application, setup: Setup, stack: AsyncExitStack) -> Services:
    """Open and build everything, in dependency order; ``app[SERVICES]`` once all of it runs."""
    specs, sandbox = await _sandboxed(setup, stack)
    db = await _open_database(setup.settings, stack)
    # Before anything is re-attached: in single mode a second process must not write these cards.
    topology = await _open_topology(app, setup, db, stack)
    agent_db = _open_agent_database(setup.settings, stack)
    fetcher = ImageFetcher(setup.settings.images)
    await fetcher.open()
    stack.push_async_callback(fetcher.close)
    apps = AppRegistry([await _open_app(setup, topology, spec, fetcher, stack) for spec in specs])
    service = _build_service(setup, db, agent_db, apps, topology)
    actions = CardActions(
        tasks=service.task,
        action_log=service.action_log,
        snapshots=service.snapshots,
        settings=setup.settings,
        clock=setup.clock,
    )
    clicks = topology.clicks(actions, service.snapshots.load)
    pipeline = CallbackPipeline(
        clicks, topology.deduper, setup.settings.card.locales, setup.background, clock=setup.clock
    )
    restored = await topology.start(service)
    if restored:
        log.info("re-attached %d unfinished task card(s)", restored)
    services = Services(
        **{field.name: getattr(setup, field.name) for field in dataclasses.fields(Setup)},
        db=db,
        apps=apps,
        topology=topology,
        service=service,
        actions=actions,
        pipeline=pipeline,
        stopper=Stopper(setup.clock),
        agent_db=agent_db,
        sandbox=sandbox,
        long_connections=_long_connections(setup, apps, pipeline),
    )
    _start_loops(services)
    collector = StateCollector(services)  # read at each scrape while the app runs
    setup.metrics.registry.register(collector)
    stack.callback(setup.metrics.registry.unregister, collector)
    app[SERVICES] = services
    await _start_admin(app, services, stack)
    _start_long_connections(services)
    return services


async def _open_database(settings: Settings, stack: AsyncExitStack) -> Database:
    url = settings.database_url
    if url.startswith("sqlite"):
        # The embedded default migrates itself: a newcomer's first run needs no extra command.
        await upgrade(url)
    db = Database.open(url)
    stack.push_async_callback(db.close)
    return db


def _clustered(settings: Settings) -> bool:
    return settings.redis_url is not None


async def _open_topology(app: web.Application, setup: Setup, db: Database, stack: AsyncExitStack) -> Topology:
    """Single mode claims the database for this process (or refuses naming who holds it, holder.py);
    cluster mode builds its lease, ownership and shared budget (taken at ``Topology.start``)."""
    settings, clock, background = setup.settings, setup.clock, setup.background
    if not _clustered(settings):
        return await open_single_instance(settings, db, clock=clock, background=background, stack=stack)
    from feishu_progress.cluster.http import CLUSTER
    from feishu_progress.cluster.topology import open_cluster

    cluster = open_cluster(
        settings, db, clock=clock, metrics=setup.metrics, background=background, stack=stack
    )
    app[CLUSTER] = cluster.cluster  # for its HTTP pieces: forwarding, the event log, internal clicks
    return cluster


def _open_agent_database(settings: Settings, stack: AsyncExitStack) -> Database | None:
    """Attach mode: the agent's own database, read-only, for the running-subagent query."""
    url = settings.subagents.database_url
    if url is None:
        return None
    agent_db = open_agent_database(url)
    stack.push_async_callback(agent_db.close)
    log.info(
        "attach mode: running subagents are read (read-only) from %s",
        agent_db.url.render_as_string(hide_password=True),
    )
    return agent_db


def _subagent_manager(settings: Settings, db: Database, agent_db: Database | None) -> SubagentManager:
    if agent_db is None:
        return SubagentManager(db)
    names = settings.subagents
    tables = agent_tables(names.execution_table, names.session_table)
    return SubagentManager(agent_db, tables, forget_unlisted=True)


async def _open_app(
    setup: Setup, topology: Topology, spec: AppSpec, fetcher: ImageFetcher, stack: AsyncExitStack
) -> AppContext:
    """One app's client, scheduler, image uploads and CardKit fallback (apps.py)."""
    settings, clock = setup.settings, setup.clock
    client = await FeishuClient.open(
        spec.feishu,
        clock=clock,
        instance_id=settings.instance_id,
        write_timeout=topology.write_timeout,
        observer=write_observer(spec.name, spec.feishu.base_url, setup.metrics, setup.tracing),
    )
    stack.push_async_callback(client.close)
    # Every Open API's own budget (FP_RATE__*), spent by card writes and by the calls that are not
    # (sends, creates, uploads) alike; cluster mode: each app's calls also pass the lease and its own
    # shared budget (Redis keys per app_id).
    budgets = BudgetTable(spec.rate)
    gate = topology.gate_for(spec.feishu.app_id, spec.rate)
    admission = Admission(budgets, clock=clock, gate=gate)
    return AppContext(
        spec=spec,
        client=client,
        scheduler=DeliveryScheduler(
            budgets, clock=clock, metrics=setup.metrics.for_app(spec.name), gate=gate
        ),
        admission=admission,
        writers=CardWriters(
            client, spec.cardkit, clock=clock, message_interval=spec.rate.message_interval_ms / 1000
        ),
        images=ImageKeys.from_settings(settings.images, client, setup.background, fetcher, admission),
        cardkit_scope=CardKitScope(clock, spec.cardkit.scope_recheck_seconds),
    )


def _build_service(
    setup: Setup, db: Database, agent_db: Database | None, apps: AppRegistry, topology: Topology
) -> TaskService:
    """The runtime rooms, each built with its part of the topology (docs/architecture.md)."""
    settings, clock, metrics, background = setup.settings, setup.clock, setup.metrics, setup.background
    tasks = TaskRepository(db)
    manager = _subagent_manager(settings, db, agent_db)
    registry = TaskRegistry(
        settings=settings,
        clock=clock,
        apps=apps,
        # Every live card's subagent load goes through one batcher: <= 2 queries/s per process.
        subagents=BatchedSubagentSource(TimedSubagents(manager, metrics), clock, background),
        metrics=metrics,
    )
    # Cluster mode: a card another instance took meanwhile is dropped here when its save is refused.
    snapshots = SnapshotStore(tasks, clock, background, owner=topology.owner_id, on_lost=registry.drop)
    applier = EventApplier(
        # Attach mode stores nothing: the agent's database has the rows (runtime/applier.py).
        subagent_rows=None if agent_db is not None else SubagentRepository(db, background),
        manager=manager,
        images=lambda task: apps.get(task.state.app).images,  # an image key belongs to an app
        snapshots=snapshots,
        clock=clock,
        metrics=metrics,
        event_log=topology.event_log,
        durable=topology.durable,
    )
    action_log = ActionLog(
        ActionRepository(db), clock, background, nudge=topology.nudge, poll_interval=topology.poll_interval
    )
    return TaskService(
        registry=registry,
        creator=TaskCreator(
            settings=settings, repo=tasks, apps=apps, registry=registry, clock=clock, owner=topology.owner_id
        ),
        applier=applier,
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
        ownership=topology.ownership,
        background=background,
        max_live=settings.task.max_live,
    )


def _start_loops(services: Services) -> None:
    stopper, background = services.stopper, services.background
    for app in services.apps:
        app.scheduler.start()
        # Until the scheduler stops (the finals it flushes at shutdown still count).
        background.spawn(services.service.follow_card_ends(app.scheduler.ends), name=f"card-ends-{app.name}")
    background.spawn(services.service.housekeeping.run(stopper), name="housekeeping")
    background.spawn(services.service.snapshots.run(stopper), name="persist-snapshots")
    background.spawn(watch_loop_lag(services.metrics.event_loop_lag, stopper), name="event-loop-lag")
    services.topology.start_loops(stopper, services.service)


async def _sandboxed(setup: Setup, stack: AsyncExitStack) -> tuple[list[AppSpec], RunningSandbox | None]:
    """The apps to open; in sandbox mode (no credentials, no apps file) the default app is the sandbox's."""
    if not setup.settings.sandbox_mode:
        return list(setup.app_specs), None
    sandbox, feishu = await _sandbox_feishu(setup.settings, stack)
    return [dataclasses.replace(spec, feishu=feishu) for spec in setup.app_specs], sandbox


async def _sandbox_feishu(settings: Settings, stack: AsyncExitStack) -> tuple[RunningSandbox, FeishuSettings]:
    from feishu_progress.sandbox.server import run_sandbox
    from feishu_progress.sandbox.state import SandboxConfig

    # A secret made up per start (nothing else on the host can take the sandbox's token) and no test
    # endpoints: the in-process sandbox listens on a loopback port anyone on the host reaches.
    app_secret = secrets.token_urlsafe(24)
    sandbox = await stack.enter_async_context(
        run_sandbox(SandboxConfig(app_id=SANDBOX_APP_ID, app_secret=app_secret, test_endpoints=False))
    )
    log.warning(
        "NO FEISHU CREDENTIALS (FP_FEISHU__APP_ID / FP_FEISHU__APP_SECRET): cards go to the in-process "
        "SANDBOX at %s, not to Feishu. Nobody will see them.",
        sandbox.base_url,
    )
    feishu = settings.feishu.model_copy(
        update={
            "base_url": sandbox.base_url,
            "app_id": SANDBOX_APP_ID,
            "app_secret": SecretStr(app_secret),
        }
    )
    return sandbox, feishu


async def _start_admin(app: web.Application, services: Services, stack: AsyncExitStack) -> None:
    settings = services.settings
    deps = admin_deps(services)
    admin = AdminApi(deps).app()
    try:
        admin_url = await stack.enter_async_context(serving(admin, settings.admin.host, settings.admin.port))
    except OSError as exc:  # busy or not this host's address: the operator's setting, not a bug
        raise StartupRefused(
            f"cannot listen on {settings.admin.host}:{settings.admin.port} for the admin listener "
            f"({exc.strerror or exc}): set FP_ADMIN__PORT to a free port (or FP_ADMIN__HOST)"
        ) from None
    app[ADMIN_URL] = admin_url
    log.info("admin listener on %s", admin_url)
    services.background.spawn(watch_readiness(deps.checks, services.stopper), name="readiness-gauges")


def _long_connections(
    setup: Setup, apps: AppRegistry, pipeline: CallbackPipeline
) -> dict[str, LongConnection]:
    """One long connection per app in ws mode, all built (credentials checked) before any starts."""
    return {
        app.name: LongConnection(
            app.name,
            app.feishu,
            pipeline,
            max_payload_bytes=setup.settings.callback.max_body_bytes,
            observe=setup.metrics.callback_latency.observe,
            clock=setup.clock,
        )
        for app in apps
        if app.feishu.mode == "ws"
    }


def _start_long_connections(services: Services) -> None:
    """Each on this loop, each reconnecting on its own."""
    for connection in services.long_connections.values():
        connection.start()
        log.info("long connection (ws) of app %s started", connection.app)


async def _stop_long_connections(services: Services) -> None:
    connections = list(services.long_connections.values())
    stopped = await asyncio.gather(*(c.stop(LONG_CONNECTION_STOP_SECONDS) for c in connections))
    for connection, done in zip(connections, stopped, strict=True):
        if not done:
            log.error(
                "shutdown: the long connection of app %s did not stop within %.0f s",
                connection.app,
                LONG_CONNECTION_STOP_SECONDS,
            )


async def _flush_cards(apps: AppRegistry) -> None:
    reports = await asyncio.gather(*(app.scheduler.flush(SHUTDOWN_FLUSH_SECONDS) for app in apps))
    for app, report in zip(apps, reports, strict=True):
        if not report.complete:
            log.error("shutdown: app %s: %s", app.name, report)
        await app.scheduler.stop()


async def _stop(services: Services) -> None:
    started = time.monotonic()
    await _stop_long_connections(services)  # first: no clicks arrive while the rest winds down
    services.stopper.stop()  # the loops end after their current pass; drained below
    # Handed over (cluster mode, live peers): they write this instance's cards; else flushed here.
    if not await services.topology.hand_over(services.apps, services.service):
        await _flush_cards(services.apps)
    await services.service.snapshots.flush()
    cancelled = await services.background.drain(BACKGROUND_DRAIN_SECONDS)
    if cancelled:
        log.warning("shutdown: %d background task(s) cancelled", cancelled)
    log.info("shutdown drained in %.2f s", time.monotonic() - started)
