"""Message catalogs: every user-visible string of the card, in the nine locales of seed 001 §4.7.

Pure: no I/O. A message is referenced as ``Msg(key, params)``; ``translate`` renders it for one
locale. Catalogs live in ``i18n/messages/*.py`` as ``{key: {locale: template}}`` so that each key's
translations sit together and a missing one is easy to spot (tests/test_i18n.py fails on it).

Locale codes (``locales.py``) are Feishu's (zh_cn, en_us, ...) plus ``tr`` (Turkish has a catalog but
no Feishu per-viewer code: it can only be a deployment's single card language). Counted messages pick
their form by the CLDR plural rules of ``plurals.py`` when translated.
"""

from __future__ import annotations

from feishu_progress.i18n.core import Msg, Text, all_messages, i18n_map, plural, translate
from feishu_progress.i18n.locales import (
    CARD_LOCALES,
    CATALOG_LOCALES,
    DEFAULT_LOCALE,
    FEISHU_LOCALES,
    SINGLE_LANGUAGE_LOCALES,
)

__all__ = [
    "CARD_LOCALES",
    "CATALOG_LOCALES",
    "DEFAULT_LOCALE",
    "FEISHU_LOCALES",
    "SINGLE_LANGUAGE_LOCALES",
    "Msg",
    "Text",
    "all_messages",
    "i18n_map",
    "plural",
    "translate",
]
