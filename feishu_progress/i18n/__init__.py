"""Message catalogs: every user-visible string of the card, in the nine locales of seed 001 §4.7.

Pure: no I/O. A message is referenced as ``Msg(key, params)``; ``translate`` renders it for one
locale. Catalogs live in ``i18n/messages/*.py`` as ``{key: {locale: template}}`` so that each key's
translations sit together and a missing one is easy to spot (tests/test_i18n.py fails on it).

Locale codes are Feishu's (zh_cn, en_us, ...) plus ``tr`` (Turkish has a catalog but no Feishu
per-viewer code: it can only be a deployment's single card language).
"""

from __future__ import annotations

from feishu_progress.i18n.core import (
    CATALOG_LOCALES,
    DEFAULT_LOCALE,
    Msg,
    Text,
    all_messages,
    i18n_map,
    translate,
)

__all__ = ["CATALOG_LOCALES", "DEFAULT_LOCALE", "Msg", "Text", "all_messages", "i18n_map", "translate"]
