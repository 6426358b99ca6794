"""``feishu-progress doctor``: every check an operator's first hour needs, each ok / warn / fail with its fix.

Doctor reads the same settings as ``serve`` and may run beside it: it takes no lease and no card, sends no
message, and writes nothing to the database or Redis. Rooms: ``local`` (configuration, database, Redis,
leases), ``feishu_app`` (one app's token, scopes, clock, rate-limit headroom), ``callbacks`` (can Feishu
reach us), ``checks`` (the result and its rendering), ``meanings`` (codes → sentences and fixes).
"""

from __future__ import annotations

from collections.abc import Mapping

from feishu_progress.config import FeishuSettings, Settings
from feishu_progress.doctor.callbacks import callback_checks
from feishu_progress.doctor.checks import Check, Status, exit_code, render_json, render_text, warn
from feishu_progress.doctor.feishu_app import check_app
from feishu_progress.doctor.local import config_checks, database_checks, lease_checks, redis_checks


def feishu_apps(settings: Settings) -> list[tuple[str, FeishuSettings]]:
    """The apps to check, each with the label its checks carry (one app today; an apps file may add more)."""
    return [("feishu", settings.feishu)]


async def run_doctor(settings: Settings, environ: Mapping[str, str]) -> list[Check]:
    """Every check, in the order an operator fixes things."""
    checks = config_checks(settings, environ)
    checks += await database_checks(settings)
    checks += await redis_checks(settings)
    if not any(check.name == "database.reachable" and check.status is Status.FAIL for check in checks):
        checks += await lease_checks(settings)
    if settings.feishu.sandbox:
        checks.append(
            warn(
                "feishu",
                "no FP_FEISHU__APP_ID / FP_FEISHU__APP_SECRET: serve runs against its embedded sandbox, "
                "Feishu and callback checks skipped",
                "set FP_FEISHU__APP_ID and FP_FEISHU__APP_SECRET to talk to Feishu",
            )
        )
        return checks
    for label, app in feishu_apps(settings):
        checks += await check_app(
            app,
            label=label,
            needs_cardkit=settings.card.transport == "cardkit",
            skew_fail_seconds=float(settings.callback.timestamp_window_seconds),
        )
    checks += await callback_checks(settings)
    return checks


__all__ = ["Check", "Status", "exit_code", "feishu_apps", "render_json", "render_text", "run_doctor"]
