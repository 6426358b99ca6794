"""What a running app holds, in one typed place (filled in as the app starts, in app.py)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from aiohttp import web

from feishu_progress.background import BackgroundTasks
from feishu_progress.config import Settings
from feishu_progress.metrics import Metrics
from feishu_progress.ports import Clock, Deduper
from feishu_progress.waiting import Stopper

if TYPE_CHECKING:
    from feishu_progress.apps import AppRegistry, AppSpec
    from feishu_progress.cluster.mode import ClusterMode
    from feishu_progress.db.engine import Database
    from feishu_progress.feishu.client import FeishuClient
    from feishu_progress.feishu.pipeline import CallbackPipeline
    from feishu_progress.feishu.ws import LongConnection
    from feishu_progress.holder import DatabaseHolder
    from feishu_progress.progress.scheduler import DeliveryScheduler
    from feishu_progress.runtime.card_actions import CardActions
    from feishu_progress.runtime.service import TaskService
    from feishu_progress.sandbox.server import RunningSandbox


@dataclass
class Services:
    """Everything the running app holds; ``settings`` are the effective ones (sandbox keys filled in)."""

    settings: Settings
    clock: Clock
    metrics: Metrics
    background: BackgroundTasks = field(default_factory=BackgroundTasks)
    stopper: Stopper | None = None
    db: Database | None = None
    agent_db: Database | None = None  # only in attach mode (FP_SUBAGENTS__DATABASE_URL), read-only
    app_specs: list[AppSpec] = field(default_factory=list)  # the apps configured (apps_file.py)
    apps: AppRegistry | None = None  # the apps opened: client, scheduler, images... each (apps.py)
    service: TaskService | None = None
    actions: CardActions | None = None
    deduper: Deduper | None = None
    sandbox: RunningSandbox | None = None  # only in sandbox mode (no Feishu credentials)
    admin_url: str | None = None
    pipeline: CallbackPipeline | None = None  # the one click pipeline, webhook and long connection
    long_connections: dict[str, LongConnection] = field(default_factory=dict)  # by app, mode = "ws" only
    cluster: ClusterMode | None = None  # only in cluster mode (FP_REDIS_URL)
    holder: DatabaseHolder | None = None  # only in single mode: this process owns the database

    @property
    def client(self) -> FeishuClient | None:
        """The default app's client (the only one without FP_APPS_FILE)."""
        return None if self.apps is None else self.apps.first.client

    @property
    def scheduler(self) -> DeliveryScheduler | None:
        """The default app's delivery scheduler (the only one without FP_APPS_FILE)."""
        return None if self.apps is None else self.apps.first.scheduler

    def require_service(self) -> TaskService:
        if self.service is None:
            raise RuntimeError("the app has not started")
        return self.service


SERVICES = web.AppKey("services", Services)
