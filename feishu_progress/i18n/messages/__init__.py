"""Catalog modules. Each module exposes ``MESSAGES: dict[str, dict[str, str]]``."""

from __future__ import annotations

from feishu_progress.i18n.messages import card, tools

MODULES: tuple[dict[str, dict[str, str]], ...] = (card.MESSAGES, tools.MESSAGES)
