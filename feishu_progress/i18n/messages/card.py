"""Card chrome: status words, buttons, section headings, toasts."""

from __future__ import annotations

MESSAGES: dict[str, dict[str, str]] = {}
