"""Msg, translate and the merged catalog."""

from __future__ import annotations

import string
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cache
from typing import Union

# The nine catalogs of seed 001 §4.7, by Feishu code (Turkish has none: "tr").
CATALOG_LOCALES: tuple[str, ...] = (
    "zh_cn",
    "en_us",
    "zh_tw",
    "de_de",
    "es_es",
    "fr_fr",
    "ko_kr",
    "pt_br",
    "tr",
)
DEFAULT_LOCALE = "zh_cn"

# A parameter is plain text (already-escaped by whoever built it), a number, or another message.
Param = Union[str, int, float, "Msg"]


@dataclass(frozen=True, slots=True)
class Msg:
    """A reference to a catalog entry plus its parameters (``{name}`` placeholders)."""

    key: str
    params: Mapping[str, Param] = field(default_factory=dict)


# Text is either a message to translate or literal text (user content, file names...).
Text = Msg | str


class _Formatter(string.Formatter):
    def __init__(self, locale: str) -> None:
        super().__init__()
        self.locale = locale

    def format_field(self, value: object, format_spec: str) -> str:
        if isinstance(value, Msg):
            return translate(value, self.locale)
        formatted: str = super().format_field(value, format_spec)
        return formatted


@cache
def all_messages() -> dict[str, dict[str, str]]:
    """Every catalog entry, merged from the message modules."""
    from feishu_progress.i18n.messages import MODULES

    merged: dict[str, dict[str, str]] = {}
    for module in MODULES:
        for key, translations in module.items():
            if key in merged:
                raise ValueError(f"i18n key {key!r} is defined twice")
            merged[key] = translations
    return merged


def _template(key: str, locale: str) -> str:
    translations = all_messages().get(key)
    if translations is None:
        return key  # visible, never silent: a test fails on any unknown key
    return translations.get(locale) or translations.get("en_us") or translations[DEFAULT_LOCALE]


def translate(text: Text, locale: str = DEFAULT_LOCALE) -> str:
    """Render a message (or pass literal text through) for ``locale``."""
    if isinstance(text, str):
        return text
    template = _template(text.key, locale)
    if not text.params:
        return template
    return _Formatter(locale).vformat(template, (), dict(text.params))


def i18n_map(text: Text, locales: tuple[str, ...]) -> dict[str, str]:
    """``{locale: rendered}`` for Feishu's field-level ``i18n_content``."""
    return {locale: translate(text, locale) for locale in locales}
