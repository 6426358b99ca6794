"""Localised text for card fields: one render per locale, folded into ``content`` + ``i18n_content``."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from feishu_progress.cards.escape import escape_inline, plain_text
from feishu_progress.i18n import FEISHU_LOCALES, Msg, Text, plural, translate
from feishu_progress.i18n.user_text import cut_text

# A piece of card text as a function of the locale: lets one line mix catalog words and user text.
Render = Callable[[str], str]


def md_text(text: Text, locale: str) -> str:
    """A catalog message for markdown, its string params escaped; literal text escaped inline."""
    if isinstance(text, str):
        return escape_inline(text)
    return translate(_escaped_params(text, escape_inline), locale)


def plain(text: Text, locale: str) -> str:
    """A catalog message (or literal text) for a plain_text field."""
    if isinstance(text, str):
        return plain_text(text)
    return plain_text(translate(_escaped_params(text, plain_text), locale))


def msg(key: str, **params: Any) -> Msg:
    """Shorthand for a card catalog message."""
    return Msg(key, params)


def counted(key: str, count: int) -> Msg:
    """A counted card message: ``<key>.one`` / ``<key>.other`` by ``count`` (the locale's CLDR rule)."""
    return plural(key, "count", {"count": count})


def _escaped_params(message: Msg, escape: Callable[[str], str]) -> Msg:
    if not message.params:
        return message
    params = {
        name: _escaped_params(value, escape)
        if isinstance(value, Msg)
        else escape(value)
        if isinstance(value, str)
        else value
        for name, value in message.params.items()
    }
    return replace(message, params=params)


def cap_params(text: Text, limit: int) -> Text:
    """Cut literal text and every string param to ``limit`` characters (an ellipsis shows the cut)."""
    if isinstance(text, str):
        return cut_text(text, limit)
    if not text.params:
        return text
    params = {
        name: cap_params(value, limit) if isinstance(value, Msg | str) else value
        for name, value in text.params.items()
    }
    return replace(text, params=params)


@dataclass(frozen=True, slots=True)
class Langs:
    """The card's languages: the first is the default ``content``, the rest go to ``i18n_content``."""

    locales: tuple[str, ...]

    @property
    def default(self) -> str:
        return self.locales[0]

    @property
    def config_locales(self) -> list[str]:
        """Only Feishu's own codes may appear in ``config.locales`` (not ``tr``)."""
        return [code for code in self.locales if code in FEISHU_LOCALES]

    def fields(self, render: Render) -> dict[str, Any]:
        """``{"content": ..., "i18n_content": {...}}``; i18n only when some locale differs."""
        content = render(self.default)
        targets = self.config_locales
        if len(targets) < 2:
            return {"content": content}
        rendered = {code: content if code == self.default else render(code) for code in targets}
        if all(value == content for value in rendered.values()):
            return {"content": content}
        return {"content": content, "i18n_content": rendered}

    def markdown(self, render: Render) -> dict[str, Any]:
        """A markdown element."""
        return {"tag": "markdown", **self.fields(render)}

    def plain_text(self, render: Render) -> dict[str, Any]:
        """A plain_text text object (button text, option text, placeholder...)."""
        return {"tag": "plain_text", **self.fields(render)}

    def md_msg(self, text: Text) -> dict[str, Any]:
        """A markdown element holding one message."""
        return self.markdown(lambda locale: md_text(text, locale))

    def plain_msg(self, text: Text) -> dict[str, Any]:
        """A plain_text object holding one message."""
        return self.plain_text(lambda locale: plain(text, locale))
