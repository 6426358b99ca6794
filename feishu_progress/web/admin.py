"""The admin listener (FP_ADMIN__PORT): health, readiness, Prometheus metrics, live cards."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from pydantic import SecretStr

from feishu_progress.web.http import HttpError, json_errors, require_bearer

log = logging.getLogger(__name__)

# A readiness check returns None when fine, else a short reason.
ReadinessCheck = Callable[[], Awaitable[str | None]]


# A degradation says what works less well than it should without making the instance unready.
Degradation = Callable[[], str | None]


@dataclass
class AdminDeps:
    registry: CollectorRegistry
    checks: dict[str, ReadinessCheck]
    cards: Callable[[], list[dict[str, object]]]
    token: SecretStr | None
    degradations: dict[str, Degradation] = field(default_factory=dict)
    # Per Feishu/Lark app: its mode, host, token, CardKit scope and breaker (shown, not a gate itself).
    apps: Callable[[], Awaitable[dict[str, object]]] | None = None


class AdminApi:
    def __init__(self, deps: AdminDeps) -> None:
        self.deps = deps

    def app(self) -> web.Application:
        """The admin listener's application (JSON errors like every other endpoint)."""
        admin = web.Application(middlewares=[json_errors])
        admin.router.add_routes(self.routes())
        return admin

    def routes(self) -> list[web.RouteDef]:
        return [
            web.get("/healthz", self.healthz),
            web.get("/readyz", self.readyz),
            web.get("/metrics", self.metrics),
            web.get("/admin/cards", self.cards),
        ]

    async def healthz(self, request: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    async def readyz(self, request: web.Request) -> web.Response:
        reasons: dict[str, str] = {}
        for name, check in self.deps.checks.items():
            try:
                problem = await check()
            except Exception as exc:  # a failing check is a reason, not a crash
                problem = f"{type(exc).__name__}: {exc}"[:200]
            if problem:
                reasons[name] = problem
        degraded = {name: note for name, check in self.deps.degradations.items() if (note := check())}
        apps = await self._apps()
        if reasons:
            return web.json_response(
                {"status": "not ready", "reasons": reasons, "degraded": degraded, **apps}, status=503
            )
        body: dict[str, object] = {
            "status": "degraded" if degraded else "ready",
            "checks": sorted({*self.deps.checks, *self.deps.degradations}),  # everything watched
            **apps,
        }
        if degraded:
            body["degraded"] = degraded
        return web.json_response(body)

    async def _apps(self) -> dict[str, object]:
        if self.deps.apps is None:
            return {}
        try:
            return {"apps": await self.deps.apps()}
        except Exception as exc:  # the checks above already say what is wrong
            return {"apps": f"{type(exc).__name__}: {exc}"[:200]}

    async def metrics(self, request: web.Request) -> web.Response:
        body = generate_latest(self.deps.registry)
        response = web.Response(body=body)
        response.headers["Content-Type"] = CONTENT_TYPE_LATEST
        return response

    async def cards(self, request: web.Request) -> web.Response:
        token = self.deps.token
        if token is None:
            raise HttpError(403, "forbidden", "set FP_ADMIN__TOKEN to enable /admin/cards")
        require_bearer(request, token, "FP_ADMIN__TOKEN")
        return web.json_response({"cards": self.deps.cards()})
