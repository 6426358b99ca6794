"""What /readyz checks and what /admin/cards lists, read off the running app's Services."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from feishu_progress.apps import AppContext
from feishu_progress.db.engine import Database
from feishu_progress.db.migrate import migration_state
from feishu_progress.services import Services
from feishu_progress.waiting import Stopper
from feishu_progress.web.admin import AdminDeps, ReadinessCheck

if TYPE_CHECKING:
    pass

log = logging.getLogger(__name__)

DATABASE_PING_SECONDS = 2.0
MIGRATION_CHECK_SECONDS = 5.0
TOKEN_CHECK_SECONDS = 5.0
WATCH_SECONDS = 15.0  # a Prometheus scrape interval: the readiness gauges are never much older


def admin_deps(services: Services) -> AdminDeps:
    checks: dict[str, ReadinessCheck] = {
        "database": lambda: _database(services),
        "feishu_token": lambda: _feishu_token(services),
        "scheduler": lambda: _scheduler(services),
    }
    agent_db = services.agent_db
    if agent_db is not None:  # attach mode
        checks["subagents_database"] = lambda: _agent_database(agent_db)
    if services.long_connections:  # apps in ws mode
        checks["long_connection"] = lambda: _long_connection(services)
    checks |= services.topology.readiness()  # single: the database holder; cluster: the lease
    degradations = {"feishu": lambda: _feishu_outage(services), "cardkit": lambda: _cardkit(services)}
    degradations |= services.topology.degradations()  # cluster: Redis
    return AdminDeps(
        registry=services.metrics.registry,
        checks={name: _recorded(services, name, check) for name, check in checks.items()},
        cards=lambda: live_cards(services),
        token=services.settings.admin.token,
        degradations=degradations,
        apps=lambda: app_entries(services),
    )


def _recorded(services: Services, name: str, check: ReadinessCheck) -> ReadinessCheck:
    """The check, its outcome also kept as ``fp_readiness_ok{check=name}`` (what alerts watch)."""
    gauge = services.metrics.readiness_ok.labels(check=name)

    async def run() -> str | None:
        try:
            problem = await check()
        except BaseException:
            gauge.set(0)
            raise
        gauge.set(0 if problem else 1)
        return problem

    return run


async def watch_readiness(checks: Mapping[str, ReadinessCheck], stopper: Stopper) -> None:
    """Run the checks every WATCH_SECONDS, so the gauges are fresh when nobody asks /readyz."""
    while True:
        for check in checks.values():
            try:
                await check()
            except Exception:  # recorded as not ok; /readyz reports the reason
                log.debug("readiness check failed", exc_info=True)
        if not await stopper.pause(WATCH_SECONDS):
            return


def _per_app(problems: dict[str, str | None]) -> str | None:
    """One app: its problem as it was; several: each app's named (``research: ...; sales: ...``)."""
    found = {name: problem for name, problem in problems.items() if problem}
    if not found:
        return None
    if len(problems) == 1:
        return next(iter(found.values()))
    return "; ".join(f"app {name}: {problem}" for name, problem in found.items())


def _cardkit(services: Services) -> str | None:
    """Streaming is degraded to whole-card PATCHes while an app lacks the CardKit scope (per app)."""
    creator = services.service.creator
    return _per_app({app.name: creator.cardkit_problem(app) for app in services.apps})


def _feishu_outage(services: Services) -> str | None:
    return _per_app({app.name: _outage(services, app) for app in services.apps})


def _outage(services: Services, app: AppContext) -> str | None:
    breaker = app.scheduler.breaker
    if breaker.opened_at is None:
        return None
    down = services.clock.monotonic() - breaker.opened_at
    return (
        f"outage breaker open for {down:.0f} s: Feishu fails for every card, "
        f"probing every {breaker.probe_interval:g} s"
    )


async def app_entries(services: Services) -> dict[str, object]:
    """``/readyz``'s ``apps``: per app its mode, platform, token, CardKit scope, breaker, long connection."""
    apps = list(services.apps)
    tokens = await asyncio.gather(*(_token_problem(app) for app in apps), return_exceptions=True)
    creator = services.service.creator
    return {
        app.name: {
            "mode": app.feishu.mode,
            # Which platform, never the address: a proxy's URL is where an attacker would aim.
            "platform": _platform(app.feishu.base_url),
            "token": "ok" if token is None else (token if isinstance(token, str) else type(token).__name__),
            "cardkit": creator.cardkit_problem(app),
            "outage": _outage(services, app),
            "connection": _connection(services, app.name),
        }
        for app, token in zip(apps, tokens, strict=True)
    }


def _connection(services: Services, app: str) -> str | None:
    """A ws app's long connection: "ok" or why not; None for a webhook app."""
    connection = services.long_connections.get(app)
    if connection is None:
        return None
    return connection.problem() or "ok"


async def _token_problem(app: AppContext) -> str | None:
    ok = await asyncio.wait_for(app.client.token_ok(), TOKEN_CHECK_SECONDS)
    return None if ok else "tenant token not obtainable"


async def _database(services: Services) -> str | None:
    await asyncio.wait_for(services.db.ping(), DATABASE_PING_SECONDS)
    current, head = await asyncio.wait_for(
        migration_state(services.settings.database_url), MIGRATION_CHECK_SECONDS
    )
    return (
        None if current == head else f"migrations at {current}, head is {head}: run feishu-progress migrate"
    )


async def _agent_database(agent_db: Database) -> str | None:
    """Attach mode: the agent's database answers (a failure only hides the subagent section)."""
    await asyncio.wait_for(agent_db.ping(), DATABASE_PING_SECONDS)
    return None


async def _feishu_token(services: Services) -> str | None:
    apps = list(services.apps)
    problems = await asyncio.gather(*(_token_problem(app) for app in apps))
    return _per_app(dict(zip([app.name for app in apps], problems, strict=True)))


async def _scheduler(services: Services) -> str | None:
    stopped = [app.name for app in services.apps if not app.scheduler.running]
    if not stopped:
        return None
    return "delivery scheduler not running" + (
        "" if len(services.apps) == 1 else f" (apps {', '.join(stopped)})"
    )


async def _long_connection(services: Services) -> str | None:
    """Every ws app's connection must be up; the problem names the app when there are several."""
    if not services.long_connections:
        return "long-connection receiver not started"
    problems = {name: connection.problem() for name, connection in services.long_connections.items()}
    if len(problems) == 1:
        return next(iter(problems.values()))
    down = [f"app {name}: {problem}" for name, problem in problems.items() if problem is not None]
    return "; ".join(down) or None


def live_cards(services: Services) -> list[dict[str, object]]:
    """``/admin/cards``: every task held in memory."""
    service = services.service
    now = services.clock.wall()
    return [
        {
            "session_id": task.state.session_id,
            "status": task.state.status.value,
            "round": task.state.round,
            "message_id": task.state.message_id,
            # cardkit: a card entity whose text streams (its id); patch: the message is PATCHed whole.
            "transport": "patch" if task.state.card_id is None else "cardkit",
            "app": task.state.app,
            "card_id": task.state.card_id,
            "stopped_reason": task.card.stopped_reason,
            "seconds_since_event": round(now - task.state.last_event_at, 1),
            "owner": services.settings.instance_id,  # an instance lists only the cards it writes
        }
        for task in service.registry
    ]


def _platform(base_url: str) -> str:
    """feishu, lark, or other (the sandbox, a proxy): never the host itself."""
    host = (urlsplit(base_url).hostname or "").lower()
    if host == "feishu.cn" or host.endswith(".feishu.cn"):
        return "feishu"
    if host == "larksuite.com" or host.endswith(".larksuite.com"):
        return "lark"
    return "other"
