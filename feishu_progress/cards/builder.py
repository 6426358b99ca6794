"""build_progress_card / build_degraded_card: a CardModel in, Feishu card JSON 2.0 out. Pure.

Order of the body (seed 002 §10.2): status line · notice · waiting hint · content · error ·
subagents (RUNNING only) · 本轮工具 · hr + forms + approvals · button row.

Size budget (see size.py): the card is assembled without the streamed content at the most generous
``Limits`` level that leaves room under the target, then the content takes the bytes left over,
cut with a visible marker. If even the smallest level does not fit, the degraded card is returned.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from feishu_progress.cards.escape import close_open_fence, escape_markdown, plain_text
from feishu_progress.cards.form import action_buttons, interactive_sections
from feishu_progress.cards.sections import (
    error_section,
    notice_line,
    state_word,
    status_line,
    status_parts,
    subagent_section,
    tools_section,
    waiting_hint,
)
from feishu_progress.cards.size import (
    LEVELS,
    MAX_CONTENT_SCAN,
    MIN_CONTENT_BYTES,
    TARGET_BYTES,
    Limits,
    fits,
    json_bytes,
    longest_prefix,
)
from feishu_progress.cards.text import Langs, counted, msg, plain
from feishu_progress.domain import CardModel, TaskStatus
from feishu_progress.i18n import DEFAULT_LOCALE, Text
from feishu_progress.i18n.user_text import cut_index, cut_text

HEADER_TEMPLATES = {
    TaskStatus.RUNNING: "blue",
    TaskStatus.WAITING: "orange",
    TaskStatus.COMPLETED: "green",
    TaskStatus.FAILED: "red",
    TaskStatus.CANCELLED: "grey",
    TaskStatus.LOST: "grey",
}
TAG_COLOURS = {**HEADER_TEMPLATES, TaskStatus.CANCELLED: "neutral", TaskStatus.LOST: "neutral"}
DEGRADED_TITLE_CHARS = 100
# A content element plus its (localised) truncation marker, beyond the content text itself.
CONTENT_OVERHEAD_BYTES = 64
MARKER_RESERVE_BYTES = 1024
# The answer text's element: a CardKit card streams its text into it (it is harmless in a PATCHed card).
ANSWER_ELEMENT_ID = "fp_answer"
# What the answer element shows before the first text: no words, so no locale (a streamed element has
# one ``content``, never an ``i18n_content`` to keep in step).
ANSWER_PLACEHOLDER = "…"
ANSWER_CUT_ELEMENT_ID = "fp_answer_cut"  # the …(已截断 N 字…) marker after a cut answer


@dataclass(frozen=True, slots=True)
class BuiltCard:
    """A card as the builder made it: the whole JSON, and its answer text apart (a CardKit writer streams
    that element alone), with how many characters the cut left out (None: not cut)."""

    card: dict[str, Any]  # never changed once built (the card JSON the writers send)
    answer: str | None = None  # the answer element's markdown (None: the card has no answer element)
    cut_chars: int | None = None


def build_progress_card(model: CardModel) -> dict[str, Any]:
    """The full progress card, always within Feishu's size, element and nesting limits."""
    return build_card(model).card


def build_card(model: CardModel) -> BuiltCard:
    """``build_progress_card``, with the answer text and its cut apart."""
    langs = _langs(model)
    content = _content_source(model)
    reserve = (
        min(json_bytes(escape_markdown(content[:MIN_CONTENT_BYTES])), MIN_CONTENT_BYTES) if content else 0
    )
    reserve += MARKER_RESERVE_BYTES if content else 0
    fitting = _most_generous_fit(model, langs, reserve)
    if fitting is None:
        return BuiltCard(build_degraded_card(model))
    card, slot = fitting
    if not content:
        return _without_content(card, slot, model, langs)
    available = TARGET_BYTES - json_bytes(card) - CONTENT_OVERHEAD_BYTES
    whole = max(model.content_chars, len(model.content))
    answer, dropped = _answer(content, whole, available)
    elements = [_answer_element(answer)]
    if dropped is not None:
        # Its own id: a CardKit writer streaming only the answer text can tell the cut moved (its count).
        marker = langs.md_msg(counted("card.truncated", dropped))
        elements.append({**marker, "element_id": ANSWER_CUT_ELEMENT_ID})
    card["body"]["elements"][slot:slot] = elements
    return BuiltCard(card, answer, dropped)


def build_degraded(model: CardModel) -> BuiltCard:
    """``build_degraded_card`` as a built card (no answer element)."""
    return BuiltCard(build_degraded_card(model))


def _most_generous_fit(model: CardModel, langs: Langs, reserve: int) -> tuple[dict[str, Any], int] | None:
    """The first level whose card fits: level 0 (the usual case), else a binary search of the rest."""
    card, slot = _assemble(model, langs, LEVELS[0])
    if fits(card, reserve):
        return card, slot
    low, high = 1, len(LEVELS)  # levels only ever shrink: the answer is in [low, high], high = none
    best: tuple[dict[str, Any], int] | None = None
    while low < high:
        middle = (low + high) // 2
        card, slot = _assemble(model, langs, LEVELS[middle])
        if fits(card, reserve):
            best, high = (card, slot), middle
        else:
            low = middle + 1
    return best


def build_degraded_card(model: CardModel) -> dict[str, Any]:
    """A minimal card for when Feishu refuses the full one: title, state, round, elapsed time."""
    langs = _langs(model)
    elements = [
        status_line(model, langs),
        langs.md_msg(msg("card.degraded.details")),
        action_buttons(model, langs),
    ]
    return _card(model, langs, DEGRADED_TITLE_CHARS, elements)


def _assemble(model: CardModel, langs: Langs, limits: Limits) -> tuple[dict[str, Any], int]:
    """The card without its streamed content, and the body index where the content goes."""
    panels = model.panels
    before = [status_line(model, langs), *notice_line(model, langs), *waiting_hint(model, langs)]
    after = [
        *error_section(model, limits, langs),
        *subagent_section(model, langs),
        *tools_section(panels.tools, limits, langs, panels.image_keys, earlier=panels.earlier_tools),
        *interactive_sections(model, limits, langs),
        action_buttons(model, langs),
    ]
    return _card(model, langs, limits.title_chars, before + after), len(before)


def _card(model: CardModel, langs: Langs, title_chars: int, elements: list[dict[str, Any]]) -> dict[str, Any]:
    config: dict[str, Any] = {"update_multi": True, "summary": _summary(model, langs)}
    if langs.config_locales:
        config["locales"] = langs.config_locales
    return {
        "schema": "2.0",
        "config": config,
        "header": _header(model, langs, title_chars),
        "body": {"elements": elements},
    }


def _langs(model: CardModel) -> Langs:
    return Langs(tuple(model.locales) or (DEFAULT_LOCALE,))


def _header(model: CardModel, langs: Langs, title_chars: int) -> dict[str, Any]:
    # Only the head of a huge title is ever shown: never clean a megabyte for it.
    head = plain_text(model.title[: title_chars * 2]).strip()
    title: Text = cut_text(head, title_chars) or msg("card.title.default")
    status = model.panels.status
    state_tag = {"tag": "text_tag", "text": langs.plain_msg(state_word(status)), "color": TAG_COLOURS[status]}
    return {
        "title": langs.plain_msg(title),
        "template": HEADER_TEMPLATES[status],
        "text_tag_list": [state_tag],
    }


def _summary(model: CardModel, langs: Langs) -> dict[str, Any]:
    panels = model.panels
    parts: list[Text] = [state_word(panels.status)]
    if panels.round > 0:
        parts.append(msg("card.round", round=panels.round))
    return langs.fields(lambda locale: " · ".join(plain(part, locale) for part in parts))


def _without_content(card: dict[str, Any], slot: int, model: CardModel, langs: Langs) -> BuiltCard:
    """A card with no answer text yet: the first one says the task was received; while the task runs an
    answer element holds a placeholder, so that a CardKit card streams its first text into it instead of
    rewriting the whole card to add the element (the received line goes with the next whole write)."""
    panels = model.panels
    if panels.status is not TaskStatus.RUNNING:
        return BuiltCard(card)
    elements = card["body"]["elements"]
    first = panels.round == 0 and not panels.tools
    received = [langs.md_msg(msg("card.accepted"))] if first else []
    elements[slot:slot] = [*received, _answer_element(ANSWER_PLACEHOLDER)]
    return BuiltCard(card, ANSWER_PLACEHOLDER)


def _content_source(model: CardModel) -> str:
    if not model.content.strip():
        return ""
    # More than this can never fit in 30 KB: never escape or measure a megabyte per build.
    return model.content[:MAX_CONTENT_SCAN]


def _render_content(text: str) -> str:
    return close_open_fence(escape_markdown(text))


def _answer(content: str, original_chars: int, available: int) -> tuple[str, int | None]:
    """The content markdown cut to ``available`` bytes, and how many characters the cut dropped (None:
    none; then a marker element follows the answer)."""
    if len(content) == original_chars and json_bytes(_render_content(content)) <= available:
        return _render_content(content), None
    budget = max(0, available - MARKER_RESERVE_BYTES)
    # Every character costs at least one byte: no prefix longer than the budget can fit.
    fitting = longest_prefix(content[:budget], budget, lambda prefix: json_bytes(_render_content(prefix)))
    shown = cut_index(content, fitting)
    return _render_content(content[:shown]).rstrip() or "…", original_chars - shown


def _answer_element(markdown: str) -> dict[str, Any]:
    return {"tag": "markdown", "element_id": ANSWER_ELEMENT_ID, "content": markdown}


__all__ = [
    "ANSWER_CUT_ELEMENT_ID",
    "ANSWER_ELEMENT_ID",
    "ANSWER_PLACEHOLDER",
    "BuiltCard",
    "build_card",
    "build_degraded",
    "build_degraded_card",
    "build_progress_card",
    "status_parts",
]
