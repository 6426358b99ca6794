"""What one doctor check found: ok / warn / fail, a sentence, and the exact fix."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from enum import StrEnum

from feishu_progress.config import DEFAULT_APP


class Status(StrEnum):
    OK = "ok"
    WARN = "warn"
    FAIL = "fail"


@dataclass(frozen=True, slots=True)
class Check:
    """One finding. ``name`` is dotted (``feishu.token``); ``fix`` says what to change, where."""

    name: str
    status: Status
    detail: str
    fix: str = ""


def app_label(group: str, app: str) -> str:
    """A check's prefix for ``app``: ``group`` for the default app (FP_FEISHU__*), ``group.<name>`` for each
    other app of FP_APPS_FILE (``feishu.research.token``, ``callbacks.research.webhook``)."""
    return group if app == DEFAULT_APP else f"{group}.{app}"


def ok(name: str, detail: str) -> Check:
    return Check(name, Status.OK, detail)


def warn(name: str, detail: str, fix: str = "") -> Check:
    return Check(name, Status.WARN, detail, fix)


def fail(name: str, detail: str, fix: str) -> Check:
    return Check(name, Status.FAIL, detail, fix)


def exit_code(checks: Sequence[Check]) -> int:
    """0 only when nothing failed (warnings do not fail the run)."""
    return 1 if any(check.status is Status.FAIL for check in checks) else 0


def render_text(checks: Sequence[Check]) -> str:
    """One line per check, its fix indented below; a summary line last."""
    width = max((len(check.name) for check in checks), default=0)
    lines: list[str] = []
    for check in checks:
        lines.append(f"{check.status.value:<4}  {check.name:<{width}}  {check.detail}")
        if check.fix:
            lines.append(f"{'':<4}  {'':<{width}}  fix: {check.fix}")
    counts = {status: sum(check.status is status for check in checks) for status in Status}
    lines.append(f"{counts[Status.OK]} ok, {counts[Status.WARN]} warn, {counts[Status.FAIL]} fail")
    return "\n".join(lines)


def render_json(checks: Sequence[Check]) -> str:
    return json.dumps(
        {"ok": exit_code(checks) == 0, "checks": [asdict(check) for check in checks]},
        ensure_ascii=False,
        indent=2,
    )
