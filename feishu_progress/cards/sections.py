"""Body sections of the progress card, in seed 002 §10.2 order (content and form live elsewhere)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from feishu_progress.cards.escape import escape_inline, sanitize_inline_title
from feishu_progress.cards.size import Limits
from feishu_progress.cards.text import Langs, cap_params, counted, md_text, msg
from feishu_progress.cards.view_panels import block_render, collapsed_panel, raw_blocks, render_view
from feishu_progress.domain import CardModel, Notice, SubagentSummary, TaskStatus, ToolCall
from feishu_progress.i18n import Msg, Text
from feishu_progress.i18n.user_text import cut_text, one_line
from feishu_progress.tools.call_line import line_for_call
from feishu_progress.tools.line_model import ToolLine

MAX_CARD_SUBAGENTS = 5  # seed 002 D3
SUBAGENT_TITLE_CHARS = 40  # seed 002 cleanTitle: 40 characters + "..."
TITLE_ELLIPSIS = "..."
TOOL_PARAM_CHARS = 200
# An unknown subagent type is shown raw (§4.2.1): bounded only like any other user text on a line.
SUBAGENT_TYPE_CHARS = TOOL_PARAM_CHARS
# Seed 002 §4.2.2: the section's markdown element is left-aligned, in the normal_v2 size.
SUBAGENT_SECTION_STYLE = {"text_align": "left", "text_size": "normal_v2"}
BACKSLASH_ENTITY = "&#92;"

STATE_KEYS = {
    TaskStatus.RUNNING: "card.state.running",
    TaskStatus.WAITING: "card.state.waiting",
    TaskStatus.COMPLETED: "card.state.completed",
    TaskStatus.FAILED: "card.state.failed",
    TaskStatus.CANCELLED: "card.state.cancelled",
    TaskStatus.LOST: "card.state.lost",
}
NOTICE_KEYS = {
    Notice.CANCELLING: "card.notice.cancelling",
    Notice.RETRYING: "card.notice.retrying",
    Notice.ANSWERS_SUBMITTED: "card.notice.answers_submitted",
    Notice.APPROVED: "card.notice.approved",
    Notice.APPROVED_ALWAYS: "card.notice.approved_always",
    Notice.DENIED: "card.notice.denied",
}
SUBAGENT_TYPE_KEYS = {
    "explorer": "card.subagent.type.explorer",
    "worker": "card.subagent.type.worker",
    "reviewer": "card.subagent.type.reviewer",
    "default": "card.subagent.type.default",
}


def state_word(status: TaskStatus) -> Msg:
    """正在处理 / 等待回复 / 已完成 / 失败 / 已取消 / 失去联系."""
    return msg(STATE_KEYS[status])


def duration(elapsed_ms: int) -> Msg:
    """3 分 12 秒 style duration."""
    seconds = max(0, elapsed_ms) // 1000
    if seconds < 60:
        return msg("card.duration.seconds", s=seconds)
    if seconds < 3600:
        return msg("card.duration.minutes", m=seconds // 60, s=seconds % 60)
    return msg("card.duration.hours", h=seconds // 3600, m=seconds % 3600 // 60)


def status_parts(model: CardModel) -> list[Text]:
    """状态:正在处理 · 第 121 轮 · 已用时 3 分 12 秒, as separate messages."""
    panels = model.panels
    parts: list[Text] = [msg("card.status", state=state_word(panels.status))]
    if panels.round > 0:
        parts.append(msg("card.round", round=panels.round))
    if model.elapsed_ms > 0:
        parts.append(msg("card.elapsed", duration=duration(model.elapsed_ms)))
    return parts


def status_line(model: CardModel, langs: Langs) -> dict[str, Any]:
    """The first body line."""
    parts = status_parts(model)
    return langs.markdown(lambda locale: " · ".join(md_text(part, locale) for part in parts))


def notice_line(model: CardModel, langs: Langs) -> list[dict[str, Any]]:
    """正在取消… / 正在重试… / 已提交回答 ... right after a click."""
    notice = model.panels.notice
    return [] if notice is None else [langs.md_msg(msg(NOTICE_KEYS[notice]))]


def waiting_hint(model: CardModel, langs: Langs) -> list[dict[str, Any]]:
    """等待你的回复:N 个问题 (and pending approvals) while WAITING."""
    panels = model.panels
    if panels.status is not TaskStatus.WAITING:
        return []
    questions = sum(len(ask.questions) for ask in panels.pending_asks)
    hints: list[Text] = []
    if questions:
        hints.append(counted("card.waiting.questions", questions))
    if panels.pending_approvals:
        hints.append(counted("card.waiting.approvals", len(panels.pending_approvals)))
    if not hints:
        return []
    return [langs.markdown(lambda locale: "\n".join(md_text(hint, locale) for hint in hints))]


def error_section(model: CardModel, limits: Limits, langs: Langs) -> list[dict[str, Any]]:
    """The failure reason of a FAILED task."""
    panels = model.panels
    if panels.status is not TaskStatus.FAILED or not panels.error.strip():
        return []
    body = block_render(panels.error, limits.error_chars)
    return [langs.markdown(lambda locale: md_text(msg("card.error.heading"), locale) + "\n" + body(locale))]


# -- subagents (seed 002 §4.2) -----------------------------------------------------------------


def subagent_section(model: CardModel, langs: Langs) -> list[dict[str, Any]]:
    """**子代理 · N 个运行中** and at most 5 lines, only while RUNNING."""
    if model.panels.status is not TaskStatus.RUNNING or not model.subagents:
        return []
    visible: list[SubagentSummary] = []
    for subagent in model.subagents:
        if subagent.title.strip():
            visible.append(subagent)
            if len(visible) == MAX_CARD_SUBAGENTS:
                break
    if not visible:
        return []
    total = len(model.subagents)
    rest = total - len(visible)
    element = langs.markdown(lambda locale: _subagent_text(visible, total, rest, locale))
    return [{**element, **SUBAGENT_SECTION_STYLE}]


def _subagent_text(visible: list[SubagentSummary], total: int, rest: int, locale: str) -> str:
    lines = [md_text(counted("card.subagents.heading", total), locale)]
    lines.extend(_subagent_line(subagent, locale) for subagent in visible)
    if rest > 0:
        lines.append("- " + md_text(counted("card.subagents.more", rest), locale))
    return "\n".join(lines)


def _subagent_line(subagent: SubagentSummary, locale: str) -> str:
    meta = []
    if subagent.round > 0:
        meta.append(md_text(msg("card.round", round=subagent.round), locale))
    if subagent.status == "RECOVERING":
        meta.append(md_text(msg("card.subagent.recovering"), locale))
    title = _clean_subagent_title(subagent.title)
    suffix = " · " + " · ".join(meta) if meta else ""
    return f"- {_subagent_type(subagent.agent_type, locale)} · {title}{suffix}"


def _subagent_type(agent_type: str | None, locale: str) -> str:
    """A known type's label; an unknown one as its raw value (§4.2.1), on one line, only sanitised."""
    key = SUBAGENT_TYPE_KEYS.get(agent_type or "")
    if key is not None:
        return md_text(msg(key), locale)
    # Escaped, not stripped of specials: ``code_writer`` must read ``code_writer``, not ``code writer``.
    # Not cut like a title (the seed shows the value whole): only the card's own per-field bound applies.
    raw = cut_text(one_line(agent_type or ""), SUBAGENT_TYPE_CHARS)
    return escape_inline(raw) or md_text(msg("card.subagent.type.unnamed"), locale)


def _clean_subagent_title(title: str) -> str:
    cleaned = sanitize_inline_title(title)
    # The manager already cut to 40 + "..." (cleanTitle); the seed says the card does not cut again, so
    # only a title that skipped the manager (longer than that) is cut here, the same way.
    if len(cleaned) > SUBAGENT_TITLE_CHARS + len(TITLE_ELLIPSIS):
        cleaned = cut_text(cleaned, SUBAGENT_TITLE_CHARS, TITLE_ELLIPSIS)
    # The seed replaces only ``*_~`[]<>|``; a backslash stays, written as an entity so that it shows as
    # typed instead of escaping the character after it.
    return cleaned.replace("\\", BACKSLASH_ENTITY)


# -- 本轮工具 --------------------------------------------------------------------------------


def tools_section(
    tools: tuple[ToolCall, ...],
    limits: Limits,
    langs: Langs,
    image_keys: Mapping[str, str],
    *,
    earlier: int = 0,
) -> list[dict[str, Any]]:
    """**本轮工具**: one line per call (newest kept), a collapsed panel when a call has a view."""
    if not tools:
        return []
    shown = tools[-limits.tools :] if limits.tools else ()
    earlier += len(tools) - len(shown)  # ``earlier``: calls the task no longer even keeps
    head: list[Text] = [msg("card.tools.heading")]
    if earlier:
        head.append(counted("card.tools.earlier", earlier))
    elements: list[dict[str, Any]] = []
    pending_lines: list[Text] = list(head)
    bullets = [False] + [True] * (len(head) - 1)
    for call in shown:
        line = line_for_call(call)
        summary = cap_params(line.summary, TOOL_PARAM_CHARS)
        panel = _panel_elements(line, limits, langs, image_keys)
        if panel is None:
            pending_lines.append(summary)
            bullets.append(True)
            continue
        elements.extend(_lines_element(pending_lines, bullets, langs))
        pending_lines, bullets = [], []
        elements.append(collapsed_panel(langs.md_msg(summary), panel))
    elements.extend(_lines_element(pending_lines, bullets, langs))
    return elements


def _panel_elements(
    line: ToolLine, limits: Limits, langs: Langs, image_keys: Mapping[str, str]
) -> list[dict[str, Any]] | None:
    if not limits.views:
        return None
    if line.view is not None:
        return render_view(line.view, limits, langs, image_keys)
    if line.raw_result or line.raw_args:
        return raw_blocks(line.raw_result, line.raw_args, limits, langs)
    return None


def _lines_element(lines: list[Text], bullets: list[bool], langs: Langs) -> list[dict[str, Any]]:
    if not lines:
        return []

    def render(locale: str) -> str:
        return "\n".join(
            ("- " if bullet else "") + md_text(line, locale)
            for line, bullet in zip(lines, bullets, strict=True)
        )

    return [langs.markdown(render)]
