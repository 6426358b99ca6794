"""Msg, translate and the merged catalog."""

from __future__ import annotations

import string
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cache
from typing import Union

from feishu_progress.i18n.locales import DEFAULT_LOCALE, FALLBACK_LOCALE, catalog_locale
from feishu_progress.i18n.plurals import OTHER, plural_category

# A parameter is plain text (already-escaped by whoever built it), a number, or another message.
Param = Union[str, int, float, "Msg"]


@dataclass(frozen=True, slots=True)
class Msg:
    """A reference to a catalog entry plus its parameters (``{name}`` placeholders).

    ``plural`` names the parameter whose number picks the form: the entry is then ``<key>.one`` /
    ``<key>.other``, chosen by the locale's CLDR rule when the message is translated (French says
    "0 ligne", English "0 lines": the choice cannot be made before the locale is known).
    """

    key: str
    params: Mapping[str, Param] = field(default_factory=dict)
    plural: str | None = None


def plural(key: str, param: str, params: Mapping[str, Param]) -> Msg:
    """A counted message: ``<key>.one`` or ``<key>.other`` by the number in ``params[param]``."""
    return Msg(key, params, plural=param)


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
    return translations.get(locale) or translations.get(FALLBACK_LOCALE) or translations[DEFAULT_LOCALE]


def _form_key(message: Msg, locale: str) -> str:
    """``<key>.<category>`` by the catalog locale's plural rule; ``<key>.other`` when that form is absent."""
    if message.plural is None:
        return message.key
    number = message.params.get(message.plural)
    category = OTHER
    if isinstance(number, int | float) and not isinstance(number, bool):
        category = plural_category(catalog_locale(locale), number)
    form = f"{message.key}.{category}"
    return form if form in all_messages() else f"{message.key}.{OTHER}"


def translate(text: Text, locale: str = DEFAULT_LOCALE) -> str:
    """Render a message (or pass literal text through) for ``locale``."""
    if isinstance(text, str):
        return text
    template = _template(_form_key(text, locale), locale)
    if not text.params:
        return template
    return _Formatter(locale).vformat(template, (), dict(text.params))


def i18n_map(text: Text, locales: tuple[str, ...]) -> dict[str, str]:
    """``{locale: rendered}`` for Feishu's field-level ``i18n_content``."""
    return {locale: translate(text, locale) for locale in locales}
