"""What /readyz checks and what /admin/cards lists, read off the running app's Services."""

from __future__ import annotations

import asyncio

from feishu_progress.db.migrate import migration_state
from feishu_progress.services import Services
from feishu_progress.web.admin import AdminDeps, ReadinessCheck

DATABASE_PING_SECONDS = 2.0
MIGRATION_CHECK_SECONDS = 5.0
TOKEN_CHECK_SECONDS = 5.0


def admin_deps(services: Services) -> AdminDeps:
    checks: dict[str, ReadinessCheck] = {
        "database": lambda: _database(services),
        "feishu_token": lambda: _feishu_token(services),
        "scheduler": lambda: _scheduler(services),
    }
    if services.settings.subagents.attached:
        checks["subagents_database"] = lambda: _agent_database(services)
    if services.settings.feishu.mode == "ws":
        checks["long_connection"] = lambda: _long_connection(services)
    degradations = {"feishu": lambda: _feishu_outage(services), "cardkit": lambda: _cardkit(services)}
    if services.settings.redis_url is not None:
        checks["lease"] = lambda: _lease(services)
        degradations["redis"] = lambda: _redis(services)
    return AdminDeps(
        registry=services.metrics.registry,
        checks=checks,
        cards=lambda: live_cards(services),
        token=services.settings.admin.token,
        degradations=degradations,
    )


async def _lease(services: Services) -> str | None:
    """Cluster mode: an instance without a live lease writes no card (its peers take them over)."""
    cluster = services.cluster
    if cluster is None:
        return "cluster mode not started"
    return None if cluster.lease.can_write() else "instance lease lapsed: not writing cards until renewed"


def _redis(services: Services) -> str | None:
    # "unreachable" and no more: /readyz is open to whoever reaches the admin port, and the driver's
    # error names Redis's host and port (the log keeps the details for the operator).
    problem = None if services.cluster is None else services.cluster.redis_problem()
    return None if problem is None else "unreachable"


def _cardkit(services: Services) -> str | None:
    """Streaming is degraded to whole-card PATCHes while the app lacks the CardKit scope."""
    return None if services.service is None else services.service.creator.cardkit_problem()


def _feishu_outage(services: Services) -> str | None:
    scheduler = services.scheduler
    if scheduler is None or scheduler.breaker.opened_at is None:
        return None
    down = services.clock.monotonic() - scheduler.breaker.opened_at
    return f"outage breaker open for {down:.0f} s: Feishu fails for every card, probing every 2 s"


async def _database(services: Services) -> str | None:
    assert services.db is not None
    await asyncio.wait_for(services.db.ping(), DATABASE_PING_SECONDS)
    current, head = await asyncio.wait_for(
        migration_state(services.settings.database_url), MIGRATION_CHECK_SECONDS
    )
    return (
        None if current == head else f"migrations at {current}, head is {head}: run feishu-progress migrate"
    )


async def _agent_database(services: Services) -> str | None:
    """Attach mode: the agent's database answers (a failure only hides the subagent section)."""
    if services.agent_db is None:
        return "agent database not opened"
    await asyncio.wait_for(services.agent_db.ping(), DATABASE_PING_SECONDS)
    return None


async def _feishu_token(services: Services) -> str | None:
    assert services.client is not None
    ok = await asyncio.wait_for(services.client.token_ok(), TOKEN_CHECK_SECONDS)
    return None if ok else "tenant token not obtainable"


async def _scheduler(services: Services) -> str | None:
    running = services.scheduler is not None and services.scheduler.running
    return None if running else "delivery scheduler not running"


async def _long_connection(services: Services) -> str | None:
    if services.long_connection is None:
        return "long-connection receiver not started"
    return services.long_connection.problem()


def live_cards(services: Services) -> list[dict[str, object]]:
    """``/admin/cards``: every task held in memory."""
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
            # cardkit: a card entity whose text streams (its id); patch: the message is PATCHed whole.
            "transport": "patch" if task.state.card_id is None else "cardkit",
            "card_id": task.state.card_id,
            "stopped_reason": task.card.stopped_reason,
            "seconds_since_event": round(now - task.state.last_event_at, 1),
            "owner": services.settings.instance_id,  # an instance lists only the cards it writes
        }
        for task in service.registry
    ]
