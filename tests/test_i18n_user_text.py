"""The one text cutter (grapheme-safe, one ellipsis rule) and the one-line flattener."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from feishu_progress.i18n.user_text import ELLIPSIS, cut_index, cut_text, one_line

PACKAGE_DIR = Path(__file__).resolve().parents[1] / "feishu_progress"
FAMILY = "👨\u200d👩\u200d👧"
THUMBS = "👍🏽"
FLAG = "🇨🇳"
E_ACUTE = "e\u0301"
HANGUL = "\u1112\u1161\u11ab"  # 한 as three conjoining jamo
HEART = "❤\ufe0f"


def test_short_text_is_returned_as_is() -> None:
    assert cut_text("abc", 3) == "abc"
    assert cut_text("", 0) == ""
    assert cut_index("abc", 10) == 3


def test_limit_counts_the_kept_characters_and_the_ellipsis_follows() -> None:
    assert cut_text("abcdef", 3) == "abc" + ELLIPSIS
    assert cut_text("abcdef", 3, "...") == "abc..."
    assert cut_text("abcdef", 3, "") == "abc"


def test_trailing_space_is_dropped_before_an_ellipsis_only() -> None:
    assert cut_text("ab cd", 3) == "ab…"
    assert cut_text("ab cd", 3, "") == "ab "  # the seed's exact first-n characters


@pytest.mark.parametrize(
    ("cluster", "name"),
    [
        (FAMILY, "ZWJ family"),
        (THUMBS, "skin tone"),
        (FLAG, "flag"),
        (E_ACUTE, "combining accent"),
        (HANGUL, "Hangul jamo"),
        (HEART, "variation selector"),
        ("\r\n", "CR LF"),
    ],
)
def test_a_cut_never_splits_a_cluster(cluster: str, name: str) -> None:
    text = "ab" + cluster + "cd"
    for limit in range(3, 2 + len(cluster)):
        assert cut_text(text, limit, "") == "ab", (name, limit)
    assert cut_text(text, 2 + len(cluster), "") == "ab" + cluster, name


def test_two_flags_are_cut_between_them() -> None:
    assert cut_text(FLAG + FLAG + "x", 3, "") == FLAG
    assert cut_text(FLAG + FLAG + "x", 4, "") == FLAG + FLAG


def test_a_cluster_longer_than_the_limit_is_cut_anyway() -> None:
    zalgo = "a" + "\u0301" * 100
    assert cut_text(zalgo, 10, "") == zalgo[:10]


def test_one_line_flattens_controls_and_whitespace() -> None:
    assert one_line("  a\n\tb\x00c\u2028d  \u3000 e ") == "a b c d e"


PIECES = st.sampled_from(["a", "长", " ", FAMILY, THUMBS, FLAG, E_ACUTE, HANGUL, HEART, "\r\n", "😀"])


@given(pieces=st.lists(PIECES, max_size=30), limit=st.integers(0, 60))
def test_any_cut_is_a_prefix_ending_on_a_piece_boundary(pieces: list[str], limit: int) -> None:
    text = "".join(pieces)
    boundaries = {0}
    for piece in pieces:
        boundaries.add(max(boundaries) + len(piece))
    index = cut_index(text, limit)
    assert index <= max(limit, 0) or index == len(text)
    assert index in boundaries or index == limit  # only a cluster longer than the limit is split
    assert cut_text(text, limit, "").startswith(text[:index])


def test_no_module_cuts_user_text_by_hand() -> None:
    """Slicing plus an ellipsis is the cutter's job (grapheme-safe, one rule), not a module's."""
    by_hand = re.compile(r"\[[^\]\n]*:[^\]\n]*\]\s*\+\s*(?:[A-Z_]*ELLIPSIS|[\"'](?:…|\.\.\.)[\"'])")
    offenders = [
        str(path.relative_to(PACKAGE_DIR))
        for path in PACKAGE_DIR.rglob("*.py")
        if by_hand.search(path.read_text(encoding="utf-8"))
    ]
    assert offenders == []
