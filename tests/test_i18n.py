"""Every catalog: nine real locales per key, consistent placeholders, and every key the code refers to."""

from __future__ import annotations

import re
import string
from pathlib import Path

from feishu_progress.i18n.core import CATALOG_LOCALES, all_messages

MESSAGES = all_messages()
PREFIXES = ("card.", "tool.", "view.image.", "view.ask.", "view.asktool.", "view.subagents.")
PACKAGE_DIR = Path(__file__).resolve().parents[1] / "feishu_progress"
NOT_KEYS = {"card.action.trigger"}  # Feishu's event type, not a catalog key
# Keys whose text is only placeholders, units or product names are the same in every language
# ("Status" is also the German and Portuguese word).
LANGUAGE_NEUTRAL = re.compile(
    r"^(tool\.(label|line\.detail|asktool\.line|detail\.(exit|http))|view\.subagents\.tokens|card\.status$)"
)


def _fields(template: str) -> set[str]:
    return {name for _, name, _, _ in string.Formatter().parse(template) if name}


def test_every_key_has_all_nine_locales_filled() -> None:
    for key, translations in MESSAGES.items():
        assert key.startswith(PREFIXES), key
        assert tuple(translations) == CATALOG_LOCALES, key
        assert all(text.strip() for text in translations.values()), key


def test_placeholders_match_zh_cn_in_every_locale() -> None:
    for key, translations in MESSAGES.items():
        expected = _fields(translations["zh_cn"])
        for locale, text in translations.items():
            assert _fields(text) == expected, (key, locale)


def test_translations_are_not_copies_of_english() -> None:
    for key, translations in MESSAGES.items():
        if LANGUAGE_NEUTRAL.match(key):
            continue
        others = [translations[loc] for loc in ("de_de", "es_es", "fr_fr", "ko_kr", "pt_br", "tr")]
        copies = [text for text in others if text == translations["en_us"]]
        assert len(copies) <= 1, (key, copies)
        assert translations["zh_cn"] != translations["en_us"], key


def test_plural_pairs_are_complete() -> None:
    for key in MESSAGES:
        if key.endswith(".one"):
            assert key[: -len(".one")] + ".other" in MESSAGES, key


def test_every_literal_key_in_the_code_exists() -> None:
    source = "\n".join(path.read_text(encoding="utf-8") for path in PACKAGE_DIR.rglob("*.py"))
    literals = set(re.findall(r'"((?:card|tool|view)\.[A-Za-z_.]+)"', source))
    literals = {key for key in literals if not key.endswith(".")} - NOT_KEYS
    missing = {key for key in literals if key not in MESSAGES and key + ".one" not in MESSAGES}
    assert not missing
