"""The one bounded cache: a mapping that keeps at most ``max_entries``, dropping its oldest first.

"Oldest" is the least recently *read or written* when ``refresh_on_read`` (an LRU cache), else the
least recently written (insertion order, which is expiry order when every entry lives equally long).
Not thread-safe: each instance belongs to one event loop. cachetools would do this, but it is not a
dependency, its types live in a separate stubs package, and the callback deduper needs ``oldest()``,
which cachetools does not offer; this is the one place the bookkeeping lives.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator
from typing import Generic, TypeVar

K = TypeVar("K")
V = TypeVar("V")


class BoundedCache(Generic[K, V]):
    """At most ``max_entries`` keys; writing one more drops the oldest."""

    def __init__(self, max_entries: int, *, refresh_on_read: bool = True) -> None:
        if max_entries < 1:
            raise ValueError("max_entries must be at least 1")
        self.max_entries = max_entries
        self._refresh_on_read = refresh_on_read
        self._entries: OrderedDict[K, V] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: object) -> bool:
        """Whether ``key`` is held; never counts as a read."""
        return key in self._entries

    def __iter__(self) -> Iterator[K]:
        """Keys, oldest first."""
        return iter(self._entries)

    def get(self, key: K) -> V | None:
        value = self._entries.get(key)
        if value is not None and self._refresh_on_read:
            self._entries.move_to_end(key)
        return value

    def put(self, key: K, value: V) -> None:
        self._entries[key] = value
        self._entries.move_to_end(key)
        while len(self._entries) > self.max_entries:
            self._entries.popitem(last=False)

    def oldest(self) -> tuple[K, V] | None:
        return next(iter(self._entries.items()), None)

    def pop(self, key: K) -> V | None:
        return self._entries.pop(key, None)
