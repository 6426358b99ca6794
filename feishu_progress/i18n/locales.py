"""Every locale code the project knows, in one place: Feishu's card codes and the catalogs' codes.

Feishu shows a card in the viewer's language when the card carries ``i18n_content`` for that code
(docs/feishu-platform.md §8). The catalogs cover nine languages (seed 001 §4.7); Turkish is one
of them but has no Feishu code, so a deployment can only pick it as the card's single language.
"""

from __future__ import annotations

# Feishu's card locale codes (docs/feishu-platform.md §8), in Feishu's order.
FEISHU_LOCALES: tuple[str, ...] = (
    "zh_cn",
    "en_us",
    "zh_hk",
    "zh_tw",
    "ja_jp",
    "id_id",
    "vi_vn",
    "th_th",
    "pt_br",
    "es_es",
    "ko_kr",
    "de_de",
    "fr_fr",
    "it_it",
    "ru_ru",
    "ms_my",
)
# A catalog language with no Feishu per-viewer code: only ever a card's one and only language.
SINGLE_LANGUAGE_LOCALES: tuple[str, ...] = ("tr",)
# Every code a card (or a task) may ask for.
CARD_LOCALES: tuple[str, ...] = FEISHU_LOCALES + SINGLE_LANGUAGE_LOCALES

# The nine catalogs of seed 001 §4.7, by Feishu code ("tr" for Turkish). zh_cn first: the default.
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
# The catalog a locale without one of its own is shown in (ja_jp, it_it... read English).
FALLBACK_LOCALE = "en_us"


def catalog_locale(locale: str) -> str:
    """The catalog that renders ``locale``: its own when there is one, else English."""
    return locale if locale in CATALOG_LOCALES else FALLBACK_LOCALE
