"""The size budget's fair cap: the longest texts are cut first, short ones stay whole."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from feishu_progress.cards.size import MIN_TEXT_CAP, fair_cap


def test_everything_that_fits_is_not_cut() -> None:
    assert fair_cap([10, 20, 30], 60) is None
    assert fair_cap([], 0) is None


def test_only_the_longest_texts_are_cut_to_one_length() -> None:
    assert fair_cap([10, 20, 1000], 100) == 70  # 10 + 20 whole, the long one keeps 70
    assert fair_cap([50, 1000, 1000], 250) == 100


def test_the_cap_never_goes_below_the_minimum() -> None:
    assert fair_cap([1000] * 100, 10) == MIN_TEXT_CAP


@given(st.lists(st.integers(0, 5000), max_size=40), st.integers(0, 20_000))
def test_the_cap_is_the_largest_that_fits(lengths: list[int], budget: int) -> None:
    cap = fair_cap(lengths, budget)
    if cap is None:
        assert sum(lengths) <= budget
        return
    kept = sum(min(length, cap) for length in lengths)
    assert kept <= budget or cap == MIN_TEXT_CAP
    assert cap == MIN_TEXT_CAP or sum(min(length, cap + 1) for length in lengths) > budget
