"""Tool lines and rich views (seeds 000 and 001)."""

from __future__ import annotations

MESSAGES: dict[str, dict[str, str]] = {}
