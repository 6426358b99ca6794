"""Rich views under a tool line, one renderer per kind of view (which tool gives which view: tools/specs.py).

Image grid, answers, subagent rows, raw result (asktool: asktool_panel).

Each renderer returns the elements that go inside the tool's collapsible panel. They never hold an
interactive element, never show raw JSON, and cut long text only with a visible marker.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from functools import partial
from typing import Any

from feishu_progress.cards.asktool_panel import asktool_panel
from feishu_progress.cards.escape import escape_block, escape_inline, escape_question
from feishu_progress.cards.size import Limits
from feishu_progress.cards.text import Langs, cap_params, counted, md_text, msg
from feishu_progress.domain import IMAGE_UPLOADING
from feishu_progress.i18n import Msg
from feishu_progress.i18n.user_text import cut_index, cut_text
from feishu_progress.tools.view_labels import (
    IMAGE_GRID_LIMIT,
    format_image_bytes,
    image_footer,
    image_hidden,
    mime_tag,
    subagent_stats,
    subagent_status_text,
    wait_summary_msg,
)
from feishu_progress.tools.view_models import (
    AskAnswersView,
    ImageGridView,
    ImageItem,
    StatusKind,
    SubagentRow,
    SubagentRowsView,
    ToolView,
)

PROMPT_CHARS = 300
LABEL_CHARS = 100  # a chosen label shown as a tag
ROW_FIELD_CHARS = 40  # a subagent row's task id and type

_STATUS_COLOURS = {
    StatusKind.RUNNING: "blue",
    StatusKind.OK: "green",
    StatusKind.FAIL: "red",
    StatusKind.MUTED: "neutral",
}


def render_view(
    view: ToolView, limits: Limits, langs: Langs, image_keys: Mapping[str, str]
) -> list[dict[str, Any]]:
    """The panel elements of one rich view."""
    if isinstance(view, ImageGridView):
        return image_grid(view, limits, langs, image_keys)
    if isinstance(view, AskAnswersView):
        return ask_answers(view, limits, langs)
    if isinstance(view, SubagentRowsView):
        return subagent_rows(view, limits, langs)
    return asktool_panel(view, limits, langs)


def raw_blocks(result: str | None, args: str | None, limits: Limits, langs: Langs) -> list[dict[str, Any]]:
    """What the tools room could not turn into a view, as literal text: the result, and the arguments
    when they matter (seed 001 A-5: 输出 and the questions), each under its label when both are there."""
    if args is None:
        return [langs.markdown(block_render(result or "", limits.view_chars))]
    blocks = [("view.raw.output", result), ("view.raw.input", args)]
    return [
        langs.markdown(partial(_labelled_block, msg(key), block_render(text, limits.view_chars)))
        for key, text in blocks
        if text
    ]


def _labelled_block(label: Msg, body: Callable[[str], str], locale: str) -> str:
    return f"**{md_text(label, locale)}**\n{body(locale)}"


def block_render(text: str, limit: int) -> Callable[[str], str]:
    """``block`` for every locale, escaping the text only once."""
    kept = cut_index(text, limit)
    escaped = escape_block(text[:kept])
    dropped = len(text) - kept
    if not dropped:
        return lambda _locale: escaped
    return lambda locale: escaped + "\n" + md_text(counted("card.truncated", dropped), locale)


def block(text: str, limit: int, locale: str) -> str:
    """Untrusted multi-line text, escaped, cut to ``limit`` characters with a visible marker."""
    return block_render(text, limit)(locale)


def inline(text: str, limit: int, locale: str) -> str:
    """Untrusted one-line text, escaped, cut to ``limit`` characters with a visible marker."""
    kept = cut_index(text, limit)
    if kept == len(text):
        return escape_inline(text)
    marker = md_text(counted("card.truncated", len(text) - kept), locale)
    return escape_inline(text[:kept]) + " " + marker


def question_markdown(text: str, limit: int, locale: str) -> str:
    """A question the agent wrote, as neutralised markdown (seed 001 R3), cut with a visible marker."""
    kept = cut_index(text, limit)
    rendered = escape_question(text[:kept])
    if kept == len(text):
        return rendered
    return rendered + "\n" + md_text(counted("card.truncated", len(text) - kept), locale)


def _more(count: int, locale: str) -> str:
    return md_text(counted("card.more_items", count), locale)


# -- image grid -------------------------------------------------------------------------------


def image_grid(
    view: ImageGridView, limits: Limits, langs: Langs, image_keys: Mapping[str, str]
) -> list[dict[str, Any]]:
    """Up to 9 images as an img / img_combination, then sizes, unreachable ones and a footer."""
    shown = view.items[: min(IMAGE_GRID_LIMIT, limits.images)]
    keys = [key for item in shown if (key := _image_key(item, image_keys))]
    elements: list[dict[str, Any]] = []
    if view.prompt:
        elements.append(langs.markdown(partial(_prompt_line, view.prompt)))
    if keys:
        elements.append(_image_element(keys))
    elements.append(langs.markdown(lambda locale: _image_notes(view, shown, image_keys, locale)))
    return elements


def _prompt_line(prompt: str, locale: str) -> str:
    return f"{md_text(msg('view.image.prompt'), locale)}: {inline(prompt, PROMPT_CHARS, locale)}"


def _image_key(item: ImageItem, image_keys: Mapping[str, str]) -> str | None:
    for ref in (item.path, item.url):
        if ref and image_keys.get(ref):  # IMAGE_UPLOADING is no key
            return image_keys[ref]
    return None


def _uploading(item: ImageItem, image_keys: Mapping[str, str]) -> bool:
    return any(ref and image_keys.get(ref) == IMAGE_UPLOADING for ref in (item.path, item.url))


def image_file_name(item: ImageItem) -> str:
    """The image's file name without its directory (a URL's without host, query or fragment)."""
    ref = item.path or item.url or ""
    if item.path is None:
        if ref[:5].lower() == "data:":
            return ""  # an inline image has no file to name
        ref = ref.split("#", 1)[0].split("?", 1)[0]
    return ref.replace("\\", "/").rstrip("/").rsplit("/", 1)[-1]


def _image_element(keys: list[str]) -> dict[str, Any]:
    if len(keys) == 1:
        return {"tag": "img", "img_key": keys[0]}
    mode = "double" if len(keys) == 2 else "triple" if len(keys) == 3 else "bisect"
    if len(keys) > 6:
        mode = "trisect"
    return {"tag": "img_combination", "combination_mode": mode, "img_list": [{"img_key": k} for k in keys]}


def _image_notes(
    view: ImageGridView, shown: tuple[ImageItem, ...], image_keys: Mapping[str, str], locale: str
) -> str:
    lines = [_image_note(number, item, image_keys, locale) for number, item in enumerate(shown, start=1)]
    hidden = image_hidden(view, limit=len(shown))
    if hidden is not None:
        lines.append(md_text(hidden, locale))
    lines.append(md_text(cap_params(image_footer(view), 80), locale))
    return "\n".join(lines)


def _image_note(number: int, item: ImageItem, image_keys: Mapping[str, str], locale: str) -> str:
    """``1. 2 KB · PNG`` (seed 000 step 3: size, then type); without a key, why there is no image.

    An upload still in flight is on its way, not unreachable. An unreachable image names its file
    (seed 000 D5 shows the path and a copy-path button, so the reader can find the file): the name
    only, never the directory or URL host, which would tell the chat which paths exist on the host.
    """
    badge = [
        escape_inline(fact) for fact in (format_image_bytes(item.size_bytes), mime_tag(item.mime)) if fact
    ]
    line = f"{number}. " + " · ".join(badge) if badge else f"{number}."
    if _image_key(item, image_keys) is not None:
        return line
    if _uploading(item, image_keys):
        return f"{line} {md_text(msg('view.image.uploading'), locale)}"
    line = f"{line} {md_text(msg('view.image.unreachable'), locale)}"
    name = cut_text(image_file_name(item), LABEL_CHARS)
    return f"{line} · {escape_inline(name)}" if name else line


# -- ask answers (ask_user_questions result) ---------------------------------------------------


def ask_answers(view: AskAnswersView, limits: Limits, langs: Langs) -> list[dict[str, Any]]:
    """Question, chosen labels as tags, typed answer as a quote."""
    return [langs.markdown(lambda locale: _answers_text(view, limits, locale))]


def _answers_text(view: AskAnswersView, limits: Limits, locale: str) -> str:
    parts = []
    for answer in view.answers[: limits.view_items]:
        lines = [f"**{inline(answer.question, limits.view_chars, locale)}**"]
        if answer.labels:
            lines.append(" ".join(_tag(cut_text(label, LABEL_CHARS), "blue") for label in answer.labels))
        if answer.custom_input:
            quoted = block(answer.custom_input, limits.view_chars, locale)
            lines.extend("> " + line for line in quoted.split("\n"))
        parts.append("\n".join(lines))
    hidden = len(view.answers) - min(len(view.answers), limits.view_items)
    if hidden > 0:
        parts.append(_more(hidden, locale))
    return "\n\n".join(parts)


def _tag(text: str, colour: str) -> str:
    return f"<text_tag color='{colour}'>{escape_inline(text)}</text_tag>"


# -- subagent rows (check_subagent / wait_subagents) -------------------------------------------


def subagent_rows(view: SubagentRowsView, limits: Limits, langs: Langs) -> list[dict[str, Any]]:
    """One line per subagent; its recent output in a nested collapsed panel."""
    elements: list[dict[str, Any]] = []
    rows = view.rows[: limits.view_items]
    for row in rows:
        elements.append(langs.markdown(partial(_row_line, row)))
        if row.recent_output.strip():
            title = langs.md_msg(msg("view.subagents.recentOutput"))
            body = [langs.markdown(block_render(row.recent_output, limits.view_chars))]
            elements.append(collapsed_panel(title, body))
    hidden = len(view.rows) - len(rows)
    if hidden > 0 or view.wait is not None:
        elements.append(langs.markdown(lambda locale: _rows_footer(view, hidden, locale)))
    return elements


def _row_line(row: SubagentRow, locale: str) -> str:
    head = [f"#{escape_inline(cut_text(row.task_id, ROW_FIELD_CHARS))}" if row.task_id else "#?"]
    if row.agent_type:
        head.append(escape_inline(cut_text(row.agent_type, ROW_FIELD_CHARS)))
    status = md_text(cap_params(subagent_status_text(row), 40), locale) or "?"
    head.append(f"<text_tag color='{_STATUS_COLOURS.get(row.status_kind, 'neutral')}'>{status}</text_tag>")
    stats = [md_text(part, locale) for part in subagent_stats(row)]
    if stats:
        head.append(" / ".join(stats))
    return " · ".join(head)


def _rows_footer(view: SubagentRowsView, hidden: int, locale: str) -> str:
    lines = [_more(hidden, locale)] if hidden > 0 else []
    if view.wait is not None:
        lines.append(md_text(wait_summary_msg(view.wait), locale))
    return "\n".join(lines)


def collapsed_panel(title: dict[str, Any], elements: list[dict[str, Any]]) -> dict[str, Any]:
    """A collapsed collapsible_panel whose header is the given markdown/plain_text title object."""
    header_title = {key: value for key, value in title.items() if key != "tag"}
    return {
        "tag": "collapsible_panel",
        "expanded": False,
        "header": {"title": {"tag": "markdown", **header_title}},
        "elements": elements,
    }
