"""Wall-clock seconds as the aware UTC datetimes the database columns take (models.UtcDateTime)."""

from __future__ import annotations

from datetime import UTC, datetime


def utc_datetime(seconds: float) -> datetime:
    """A POSIX timestamp (e.g. ``Clock.wall()``) as an aware UTC datetime."""
    return datetime.fromtimestamp(seconds, UTC)
