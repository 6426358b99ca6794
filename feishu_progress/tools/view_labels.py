"""Catalog texts for the rich views, so cards/ never assembles keys or plural forms itself."""

from __future__ import annotations

from feishu_progress.i18n import Msg, Text, plural
from feishu_progress.i18n.user_text import cut_text
from feishu_progress.tools.view_models import ImageGridView, SubagentRow, WaitSummary

# D1: the grid shows at most 9 images (3×3).
IMAGE_GRID_LIMIT = 9
_KIB = 1024
MIME_TAG_CHARS = 8  # PNG, JPEG, WEBP, SVG+XML: a badge, not a sentence
_STATUS_WORDS = ("RUNNING", "RECOVERING", "COMPLETED", "FAILED", "CANCELLED")

__all__ = [
    "IMAGE_GRID_LIMIT",
    "format_image_bytes",
    "image_footer",
    "image_hidden",
    "mime_tag",
    "subagent_stats",
    "subagent_status_text",
    "subagent_status_word",
    "wait_summary_msg",
]


def image_hidden(view: ImageGridView, limit: int = IMAGE_GRID_LIMIT) -> Msg | None:
    """``共 N 张,其余 N-9 张略`` when the grid cannot show every image."""
    total = len(view.items)
    if total <= limit:
        return None
    return plural("view.image.more", "hidden", {"total": total, "hidden": total - limit})


def image_footer(view: ImageGridView) -> Msg:
    """``N 张图 · model · size`` (model and size only when the result names them)."""
    details = " · ".join(part for part in (view.model, view.size) if part)
    if not details:
        return plural("view.image.count", "count", {"count": len(view.items)})
    return plural("view.image.footer", "count", {"count": len(view.items), "details": details})


def format_image_bytes(size: int | None) -> str:
    """B / KB / MB, rounded down like the backend's formatFileSize; "" when unknown."""
    if size is None or size < 0:
        return ""
    if size < _KIB:
        return f"{size} B"
    if size < _KIB * _KIB:
        return f"{size // _KIB} KB"
    return f"{size // (_KIB * _KIB)} MB"


def mime_tag(mime: str | None) -> str:
    """``image/png`` → ``PNG``; "" when there is no usable subtype."""
    if not mime or "/" not in mime:
        return ""
    return cut_text(mime.rsplit("/", 1)[-1].split(";", 1)[0].strip().upper(), MIME_TAG_CHARS, ellipsis="")


def subagent_stats(row: SubagentRow) -> tuple[Msg, ...]:
    """The parts of ``N 轮 / M 次工具 / X+Y tok`` that the row reports (cards/ joins them with " / ")."""
    parts: list[Msg] = []
    if row.rounds is not None:
        parts.append(plural("view.subagents.rounds", "n", {"n": row.rounds}))
    if row.tool_calls is not None:
        parts.append(plural("view.subagents.tools", "n", {"n": row.tool_calls}))
    if row.prompt_tokens is not None or row.completion_tokens is not None:
        tokens = {"prompt": row.prompt_tokens or 0, "completion": row.completion_tokens or 0}
        parts.append(Msg("view.subagents.tokens", tokens))
    return tuple(parts)


def subagent_status_word(status: str) -> Msg | None:
    """运行中 / 恢复中 / 已完成 / 失败 / 已取消 for a known status (any case), else None."""
    upper = status.upper()
    return Msg(f"view.subagents.status.{upper}") if upper in _STATUS_WORDS else None


def subagent_status_text(row: SubagentRow) -> Text:
    """The localized status word for known statuses, else the status as the tool reported it."""
    return subagent_status_word(row.status) or row.status


def wait_summary_msg(summary: WaitSummary) -> Msg:
    """``完成 N 个 · 全部完成`` / ``完成 N 个 · 已超时`` / ``完成 N 个``."""
    if summary.all_completed:
        key = "view.subagents.waitAll"
    elif summary.timed_out:
        key = "view.subagents.waitTimeout"
    else:
        key = "view.subagents.waitDone"
    return plural(key, "n", {"n": summary.completed})
