"""Naive-UTC datetimes: the only kind the database stores (see ``models``)."""

from __future__ import annotations

from datetime import UTC, datetime


def to_naive_utc(value: datetime) -> datetime:
    """An aware datetime converted to UTC without tzinfo; a naive one is taken as UTC already."""
    if value.tzinfo is None:
        return value
    return value.astimezone(UTC).replace(tzinfo=None)


def naive_utc_from_timestamp(seconds: float) -> datetime:
    """A POSIX timestamp (e.g. ``Clock.wall()``) as a naive UTC datetime."""
    return datetime.fromtimestamp(seconds, UTC).replace(tzinfo=None)
