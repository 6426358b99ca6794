"""bounded.BoundedCache: the one bounded cache (image keys: LRU; callback dedupe: insertion order)."""

from __future__ import annotations

import pytest

from feishu_progress.bounded import BoundedCache


def test_lru_drops_the_least_recently_used() -> None:
    cache: BoundedCache[str, int] = BoundedCache(2)
    cache.put("a", 1)
    cache.put("b", 2)
    assert cache.get("a") == 1  # a read: "b" is now the oldest
    cache.put("c", 3)
    assert list(cache) == ["a", "c"]
    assert cache.get("b") is None


def test_without_refresh_on_read_the_first_written_leaves_first() -> None:
    cache: BoundedCache[str, int] = BoundedCache(2, refresh_on_read=False)
    cache.put("a", 1)
    cache.put("b", 2)
    assert cache.get("a") == 1
    assert "a" in cache
    cache.put("c", 3)
    assert list(cache) == ["b", "c"]
    assert cache.oldest() == ("b", 2)
    assert cache.pop("b") == 2
    assert len(cache) == 1


def test_a_rewritten_key_counts_as_new_and_the_size_is_checked() -> None:
    cache: BoundedCache[str, int] = BoundedCache(2, refresh_on_read=False)
    cache.put("a", 1)
    cache.put("b", 2)
    cache.put("a", 3)
    cache.put("c", 4)
    assert list(cache) == ["a", "c"]
    assert cache.oldest() == ("a", 3)
    assert BoundedCache[str, int](1).oldest() is None
    with pytest.raises(ValueError, match="max_entries"):
        BoundedCache[str, int](0)
