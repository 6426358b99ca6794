"""Make untrusted text safe for Feishu card markdown.

Two strengths, chosen by where the text lands:

* ``escape_inline`` — for one-line text inside our own markdown (tool lines, titles, labels,
  paths, prompts). Every markdown special and every ``<`` / ``&`` becomes a numeric HTML entity
  (``&#42;`` style, docs/feishu-platform.md §1), newlines become spaces: the text renders
  exactly as typed and can never open a tag (``<at>``, ``<font>``, ``<a>`` ...), a link, an image,
  emphasis, a list or a heading.
* ``escape_markdown`` — for the agent's streamed content, which is markdown we *want* rendered
  (bold, lists, code, quotes, links). Only the dangerous parts are neutralised: every ``<`` becomes
  ``&#60;`` (so no HTML-like tag, ``<at id=all>`` in any casing/spacing included, can ever be
  live, nor any ``<...>`` autolink), an ``&`` that starts an entity becomes ``&#38;`` (so ``&#60;at``
  cannot be smuggled in), images (``![x](key)`` — a bad key makes Feishu refuse the whole card)
  are defused, and so is every link whose destination is not http(s) (Feishu supports only those):
  the ``]`` of every ``](`` that does not lead to ``http(s)://`` becomes ``&#93;``, whatever the
  link text holds (brackets, line breaks), and every ``]:`` too, so no reference definition
  (``[r]: lark://x``, in a quote or a list as well) can exist. h1–h3 are demoted to h4 and only the
  first four tables stay tables (Feishu refuses a markdown element with more). Control characters
  are dropped.

Plain-text fields (``plain_text`` titles, buttons, options) are not markdown: Feishu shows them
literally, so ``plain_text`` never entity-escapes. It still turns a tag-like ``<`` into the
full-width ``＜`` so that no client, whatever it does with plain text, can ever see ``<at ...>``.
"""

from __future__ import annotations

import re

from feishu_progress.i18n.user_text import one_line

MAX_MARKDOWN_TABLES = 4

_INLINE_ENTITIES = {
    "&": "&#38;",
    "<": "&#60;",
    ">": "&#62;",
    "*": "&#42;",
    "_": "&#95;",
    "~": "&#126;",
    "`": "&#96;",
    "[": "&#91;",
    "]": "&#93;",
    "#": "&#35;",
    "\\": "&#92;",
    "-": "&#45;",
    "|": "&#124;",
    "!": "&#33;",
    "$": "&#36;",
}
# "&" and "#" appear inside the entities themselves: they go through a placeholder (a NUL, which
# callers have already stripped as a control character) so no entity is ever escaped twice.
_PLACEHOLDERS = (("&", "\x00A"), ("#", "\x00H"))
_DIRECT = tuple((char, entity) for char, entity in _INLINE_ENTITIES.items() if char not in "&#")
_RESTORE = (("\x00A", "&#38;"), ("\x00H", "&#35;"))
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f\u2028\u2029\ufeff]")
_CONTROL_AND_NEWLINES = re.compile(r"[\x00-\x1f\x7f\u2028\u2029\ufeff]+")
_ENTITY_START = re.compile(r"&(?=#|[A-Za-z][A-Za-z0-9]*;)")
_IMAGE = re.compile(r"!\[")
# A link needs a literal "](" (inline) or "]:" (reference definition): the "]" is what we defuse.
# An escaped "\]" is taken too, so a renderer that ignores backslash escapes cannot be fooled either.
_LINK_TARGET = re.compile(r"\\?\](?:\s*\(\s*|:)")
_WEB_DESTINATION = re.compile(r"https?://", re.IGNORECASE)
_HEADING = re.compile(r"^( {0,3})#{1,3}(?=\s)", re.MULTILINE)
_TABLE_DELIMITER = re.compile(
    r"^[ \t]*\|?[ \t]*:?-+:?[ \t]*(\|[ \t]*:?-+:?[ \t]*)+\|?[ \t]*$|^[ \t]*\|[ \t]*:?-+:?[ \t]*\|?[ \t]*$"
)
_TAG_OPEN = re.compile(r"<(?=\s*/?\s*[A-Za-z!?])")
_TITLE_SPECIALS = re.compile(r"[*_~`\[\]<>|]")


def plain_text(text: str) -> str:
    """Text for a plain_text field: control characters become spaces, a tag-like ``<`` becomes ``＜``."""
    return _TAG_OPEN.sub("＜", _CONTROL_AND_NEWLINES.sub(" ", text))


def escape_inline(text: str) -> str:
    """One line of untrusted text, rendered literally inside markdown."""
    return _entities(one_line(text))


def _entities(text: str) -> str:
    # A chain of str.replace runs in C and beats str.translate's per-character dict lookups.
    for char, entity in (*_PLACEHOLDERS, *_DIRECT, *_RESTORE):
        if char in text:
            text = text.replace(char, entity)
    return text


def escape_block(text: str) -> str:
    """Multi-line untrusted text rendered literally, line breaks kept (results, outputs, answers)."""
    return _entities(_CONTROL.sub(" ", text.replace("\r\n", "\n").replace("\r", "\n")))


def sanitize_inline_title(text: str) -> str:
    """Seed 002 sanitizeInlineTitle: control chars and exactly ``* _ ~ ` [ ] < > |`` become spaces."""
    return one_line(_TITLE_SPECIALS.sub(" ", text))


def escape_markdown(text: str, *, max_tables: int = MAX_MARKDOWN_TABLES, web_links: bool = True) -> str:
    """Streamed agent markdown: rendered, but with no live tag, image, odd link or oversized part.

    ``web_links=False`` defuses http(s) links too (a question's text: seed 001 §6, no links at all).
    """
    text = _CONTROL.sub("", text.replace("\r\n", "\n").replace("\r", "\n"))
    text = _ENTITY_START.sub("&#38;", text)
    text = text.replace("<", "&#60;")
    text = _IMAGE.sub("!&#91;", text)
    text = _defuse_links(text, web_links=web_links)
    text = _HEADING.sub(r"\1####", text)
    return _limit_tables(text, max_tables)


def escape_question(text: str) -> str:
    """A question the agent wrote, rendered as markdown (seed 001 R3) with the content's neutralisation.

    Several questions share one markdown element (which takes four tables at most), so a question
    never renders a table; a fence it leaves open is closed so the next line is not swallowed. Seed 001
    §6 keeps the rich question text from producing links, images or raw HTML: an http(s) link is
    defused as well (``[链接](https://…)`` reads as typed), unlike the streamed content.
    """
    return close_open_fence(escape_markdown(text, max_tables=0, web_links=False).strip())


def _defuse_links(text: str, *, web_links: bool = True) -> str:
    """Every link target but http(s) (all, without ``web_links``) made literal; no definition survives."""
    if "]" not in text:
        return text

    def defuse(match: re.Match[str]) -> str:
        token = match.group(0)
        if web_links and not token.endswith(":") and _WEB_DESTINATION.match(text, match.end()):
            return token
        return "&#93;" + token.lstrip("\\")[1:]

    return _LINK_TARGET.sub(defuse, text)


def _limit_tables(text: str, max_tables: int) -> str:
    if "-" not in text or "|" not in text:
        return text
    lines = text.split("\n")
    tables = 0
    for index, line in enumerate(lines):
        if _TABLE_DELIMITER.match(line):
            tables += 1
            if tables > max_tables:
                # A delimiter row without "-" is no delimiter: the table renders as text lines.
                lines[index] = line.replace("-", "&#45;")
    return "\n".join(lines)


def close_open_fence(markdown: str) -> str:
    """Close a code fence left open by a cut, so the text after it is not swallowed into code."""
    fences = sum(1 for line in markdown.split("\n") if line.lstrip().startswith("```"))
    return markdown + "\n```" if fences % 2 else markdown
