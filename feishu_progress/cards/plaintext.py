"""A card as a person reads it, in plain text: for the demo, logs and the admin view.

Pure. Knows only the components the progress card uses; anything else shows as ``[tag]``.
"""

from __future__ import annotations

import html
import re
from collections.abc import Mapping
from typing import Any

_TAG = re.compile(r"<text_tag[^>]*>(.*?)</text_tag>|<font[^>]*>(.*?)</font>", re.S)
_INDENT = "  "


def _text(node: Any) -> str:
    if isinstance(node, Mapping):
        content = node.get("content", "")
        return _clean(str(content))
    return ""


def _clean(markdown: str) -> str:
    markdown = _TAG.sub(lambda m: f"[{m.group(1) or m.group(2) or ''}]", markdown)
    return html.unescape(markdown)


def card_as_text(card: Mapping[str, Any]) -> str:
    """Render ``card`` (JSON 2.0) as indented lines of text."""
    lines: list[str] = []
    header = card.get("header")
    if isinstance(header, Mapping):
        tags = " ".join(f"[{_text(tag.get('text'))}]" for tag in header.get("text_tag_list", []) or [])
        lines.append(f"┃ {_text(header.get('title'))} {tags}".rstrip())
    body = card.get("body")
    if isinstance(body, Mapping):
        _elements(body.get("elements", []), 0, lines)
    return "\n".join(lines)


def _elements(elements: Any, depth: int, lines: list[str]) -> None:
    for element in elements if isinstance(elements, list) else []:
        if isinstance(element, Mapping):
            _element(element, depth, lines)


def _element(element: Mapping[str, Any], depth: int, lines: list[str]) -> None:
    pad = _INDENT * depth
    tag = element.get("tag")
    if tag == "markdown":
        lines.extend(pad + line for line in _clean(str(element.get("content", ""))).splitlines())
    elif tag == "div":
        lines.append(pad + _text(element.get("text")))
    elif tag == "hr":
        lines.append(pad + "───")
    elif tag == "collapsible_panel":
        title = (
            element.get("header", {}).get("title", {}) if isinstance(element.get("header"), Mapping) else {}
        )
        lines.append(pad + "▸ " + _text(title))
        _elements(element.get("elements"), depth + 1, lines)
    elif tag == "column_set":
        columns = [c for c in element.get("columns", []) or [] if isinstance(c, Mapping)]
        children = [
            child for c in columns for child in c.get("elements", []) or [] if isinstance(child, Mapping)
        ]
        if children and all(child.get("tag") == "button" for child in children):
            lines.append(
                pad + " ".join(f"[{_text(child.get('text'))}]" for child in children)
            )  # a button row
        else:
            for column in columns:
                _elements(column.get("elements"), depth, lines)
    elif tag in ("form", "interactive_container"):
        _elements(element.get("elements"), depth, lines)
    elif tag == "button":
        lines.append(pad + f"[{_text(element.get('text'))}]")
    elif tag in ("select_static", "multi_select_static"):
        options = [_text(option.get("text")) for option in element.get("options", []) or []]
        kind = "multi-select" if tag == "multi_select_static" else "select"
        lines.append(pad + f"<{kind}: {' / '.join(options)}>")
    elif tag == "input":
        lines.append(pad + f"<input: {_text(element.get('placeholder'))}>")
    elif tag == "img":
        lines.append(pad + "[image]")
    elif tag == "img_combination":
        lines.append(pad + f"[{len(element.get('img_list', []) or [])} images]")
    else:
        lines.append(pad + f"[{tag}]")
