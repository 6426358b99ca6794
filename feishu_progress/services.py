"""What a running app holds, in typed places that are complete when they exist (aiohttp's AppKey pattern).

``Setup`` is what ``app.create_app`` decides before anything opens. ``Services`` is everything the app's
cleanup context opened and built, made once when all of it has started and kept under ``app[SERVICES]``;
no field of it waits to be filled in. What is registered before the start (routes, middlewares, the
preview page) reads ``request.app[SERVICES]`` when a request comes: requests are served only once the
app has started. ``app[ADMIN_URL]`` is where the admin listener (which reports on ``Services``) listens.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from aiohttp import web

from feishu_progress.background import BackgroundTasks
from feishu_progress.config import Settings
from feishu_progress.metrics import Metrics
from feishu_progress.ports import Clock
from feishu_progress.waiting import Stopper

if TYPE_CHECKING:
    from feishu_progress.apps import AppRegistry, AppSpec
    from feishu_progress.db.engine import Database
    from feishu_progress.feishu.client import FeishuClient
    from feishu_progress.feishu.pipeline import CallbackPipeline
    from feishu_progress.feishu.ws import LongConnection
    from feishu_progress.progress.scheduler import DeliveryScheduler
    from feishu_progress.runtime.card_actions import CardActions
    from feishu_progress.runtime.service import TaskService
    from feishu_progress.sandbox.server import RunningSandbox
    from feishu_progress.topology import Topology
    from feishu_progress.tracing import Tracing


@dataclass(frozen=True, slots=True, kw_only=True)
class Setup:
    """Decided before anything opens; ``settings`` are the effective ones (sandbox keys filled in)."""

    settings: Settings
    clock: Clock
    metrics: Metrics
    background: BackgroundTasks
    app_specs: tuple[AppSpec, ...]  # the apps configured (apps_file.py)
    tracing: Tracing | None  # only with a tracer provider (tracing.py, the [otel] extra)


@dataclass(frozen=True, slots=True, kw_only=True)
class Services(Setup):
    """Everything the running app holds (app.py builds it once, when all of it has started)."""

    db: Database
    apps: AppRegistry  # the apps opened: client, scheduler, images... each (apps.py)
    topology: Topology  # single instance or cluster mode (topology.py)
    service: TaskService
    actions: CardActions  # clicks on the cards this instance writes
    pipeline: CallbackPipeline  # the one click pipeline, webhook and long connection
    stopper: Stopper  # ends the periodic loops at shutdown
    agent_db: Database | None  # only in attach mode (FP_SUBAGENTS__DATABASE_URL), read-only
    sandbox: RunningSandbox | None  # only in sandbox mode (no Feishu credentials)
    long_connections: dict[str, LongConnection]  # by app, the apps in ws mode only

    @property
    def client(self) -> FeishuClient:
        """The default app's client (the only one without FP_APPS_FILE)."""
        return self.apps.first.client

    @property
    def scheduler(self) -> DeliveryScheduler:
        """The default app's delivery scheduler (the only one without FP_APPS_FILE)."""
        return self.apps.first.scheduler


SERVICES = web.AppKey("services", Services)
ADMIN_URL = web.AppKey("admin_url", str)
