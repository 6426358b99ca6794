"""``feishu-progress doctor``: every check an operator's first hour needs, each ok / warn / fail with its fix.

Doctor reads the same settings as ``serve`` and may run beside it: it takes no lease and no card, sends no
message, and writes nothing to the database or Redis. Rooms: ``local`` (configuration, database, Redis,
leases), ``feishu_app`` (one app's token, scopes, clock, rate-limit headroom), ``callbacks`` (can Feishu
reach each app's callback route), ``checks`` (the result and its rendering), ``meanings`` (codes →
sentences and fixes).
"""

from __future__ import annotations

from collections.abc import Mapping

from feishu_progress.apps_file import app_specs
from feishu_progress.config import Settings
from feishu_progress.doctor.callbacks import callback_checks
from feishu_progress.doctor.checks import (
    Check,
    Status,
    app_label,
    exit_code,
    fail,
    render_json,
    render_text,
    warn,
)
from feishu_progress.doctor.feishu_app import check_app
from feishu_progress.doctor.local import config_checks, database_checks, lease_checks, redis_checks
from feishu_progress.errors import ConfigError


async def run_doctor(settings: Settings, environ: Mapping[str, str]) -> list[Check]:
    """Every check, in the order an operator fixes things."""
    checks = config_checks(settings, environ)
    checks += await database_checks(settings)
    checks += await redis_checks(settings)
    if not any(check.name == "database.reachable" and check.status is Status.FAIL for check in checks):
        checks += await lease_checks(settings)
    if settings.sandbox_mode:
        checks.append(
            warn(
                "feishu",
                "no FP_FEISHU__APP_ID / FP_FEISHU__APP_SECRET: serve runs against its embedded sandbox, "
                "Feishu and callback checks skipped",
                "set FP_FEISHU__APP_ID and FP_FEISHU__APP_SECRET to talk to Feishu",
            )
        )
        return checks
    try:
        apps = app_specs(settings, environ)
    except ConfigError as exc:
        return [*checks, fail("config.apps_file", str(exc), "fix FP_APPS_FILE as the message says")]
    for app in apps:
        checks += await check_app(
            app.feishu,
            label=app_label("feishu", app.name),
            needs_cardkit=settings.card.transport == "cardkit",
            skew_fail_seconds=float(settings.callback.timestamp_window_seconds),
        )
    for app in apps:  # after every app's credentials: a callback failure is rarely about them
        checks += await callback_checks(settings, app.name, app.feishu)
    return checks


__all__ = ["Check", "Status", "exit_code", "render_json", "render_text", "run_doctor"]
