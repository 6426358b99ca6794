"""Escaping untrusted text for card markdown (issue 15 item 9: every link destination is checked)."""

from __future__ import annotations

import pytest

from feishu_progress.cards.escape import (
    escape_inline,
    escape_markdown,
    escape_question,
    plain_text,
    sanitize_inline_title,
)


def test_escape_inline_kills_markdown_and_tags() -> None:
    assert escape_inline("<at id=all></at>") == "&#60;at id=all&#62;&#60;/at&#62;"
    assert (
        escape_inline("**b** _i_ [l](u) # h\nx")
        == "&#42;&#42;b&#42;&#42; &#95;i&#95; &#91;l&#93;(u) &#35; h x"
    )
    assert escape_inline("&#60;at") == "&#38;&#35;60;at"


@pytest.mark.parametrize(
    "attack",
    [
        "<at id=all></at>",
        "<AT ID=ALL>",
        "< at email=a@b.c>",
        "<at\tids=1,2>",
        "&#60;at id=all&#62;",
        "&lt;at id=all&gt;",
    ],
)
def test_escape_markdown_never_leaves_a_live_at(attack: str) -> None:
    out = escape_markdown(f"x {attack} y")
    assert "<" not in out
    if attack.startswith("&"):  # an entity in the text stays text: its "&" is escaped itself
        assert out.startswith("x &#38;")


def test_escape_markdown_keeps_markdown_and_limits_tables() -> None:
    table = "| a | b |\n|---|---|\n| 1 | 2 |\n"
    out = escape_markdown("# H\n**b**\n" + table * 6)
    assert out.startswith("#### H\n**b**\n")
    assert out.count("|---|---|") == 4


def test_plain_text_and_title_sanitising() -> None:
    assert plain_text("a\n<at id=all>") == "a ＜at id=all>"
    assert sanitize_inline_title("  a\n*b*  [c] <d> | e ") == "a b c d e"
    # Seed 002 §4.2.3: only its own set is replaced; a backslash is not in it.
    assert sanitize_inline_title("back\\slash") == "back\\slash"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("[a[b]c](javascript:alert(1))", "[a[b]c&#93;(javascript:alert(1))"),  # brackets in the text
        ("[a\nb](javascript:x)", "[a\nb&#93;(javascript:x)"),  # text over two lines
        ("[a](lark://x)", "[a&#93;(lark://x)"),
        ("[a]( javascript:x)", "[a&#93;( javascript:x)"),
        ("[a] (javascript:x)", "[a&#93; (javascript:x)"),
        ("[a]\n(javascript:x)", "[a&#93;\n(javascript:x)"),
        ("[a](//evil.example)", "[a&#93;(//evil.example)"),
        ("[a](<https://x>)", "[a&#93;(&#60;https://x>)"),
        ("\\](javascript:x)", "&#93;(javascript:x)"),  # an escaped bracket, for a renderer without escapes
        ("[[a](https://ok)](lark://x)", "[[a](https://ok)&#93;(lark://x)"),  # the outer one only
        ("[r]: lark://x", "[r&#93;: lark://x"),  # reference definitions never survive
        ("> [r]: https://ok", "> [r&#93;: https://ok"),
        ("- [r\nx]: lark://x", "- [r\nx&#93;: lark://x"),
        ("<javascript:x>", "&#60;javascript:x>"),  # autolinks are dead with every "<"
        ("<https://ok>", "&#60;https://ok>"),
    ],
)
def test_escape_markdown_defuses_every_link_but_http(text: str, expected: str) -> None:
    assert escape_markdown(text) == expected


@pytest.mark.parametrize(
    "text", ["[a](https://ok)", "[a](HTTP://ok)", "[a]( https://ok )", "[多\n行](https://ok)", "a]b", "x]"]
)
def test_escape_markdown_keeps_web_links_and_plain_brackets(text: str) -> None:
    assert escape_markdown(text) == text


@pytest.mark.parametrize(
    "question",
    [
        "[链接](https://example.com)",
        "[a]( HTTPS://example.com/x)",
        "[r]: https://example.com\n[r]",
        "[x\\](http://e.com)",
    ],
)
def test_escape_question_makes_no_link_not_even_a_web_one(question: str) -> None:
    """Seed 001 §6: a question makes no link, image or raw HTML (the content keeps web links)."""
    rendered = escape_question(question)
    assert "](" not in rendered.replace("&#93;(", "") and "]:" not in rendered
    assert "&#93;" in rendered
    assert "](https://example.com)" in escape_markdown("[链接](https://example.com)")


def test_escape_question_has_no_table_and_no_open_fence() -> None:
    table = "| a | b |\n|---|---|\n| 1 | 2 |"
    assert "|---|" not in escape_question(table)
    assert escape_question("```\ncode") == "```\ncode\n```"
