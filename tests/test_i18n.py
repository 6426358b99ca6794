"""Every catalog: nine real locales per key, matching placeholders, every key the code uses, plurals."""

from __future__ import annotations

import re
import string
from pathlib import Path
from typing import Any

import pytest

from feishu_progress.cards.builder import build_progress_card
from feishu_progress.domain import SubagentSummary, TaskStatus, ToolCall
from feishu_progress.i18n import (
    CARD_LOCALES,
    CATALOG_LOCALES,
    FEISHU_LOCALES,
    SINGLE_LANGUAGE_LOCALES,
    Msg,
    all_messages,
    plural,
    translate,
)
from feishu_progress.i18n.plurals import RULES, Operands, operands, plural_category
from feishu_progress.tools.line_parts import count
from feishu_progress.tools.view_labels import image_footer, image_hidden, wait_summary_msg
from feishu_progress.tools.view_models import ImageGridView, ImageItem, WaitSummary
from tests.fakes import card_model

MESSAGES = all_messages()
PREFIXES = ("card.", "tool.", "view.image.", "view.ask.", "view.asktool.", "view.subagents.", "view.raw.")
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


# -- plural rules (CLDR cardinal, plurals.xml sample values) -----------------------------------------

CLDR_SAMPLES: dict[str, dict[str, tuple[int | float, ...]]] = {
    "zh_cn": {"other": (0, 1, 2, 1.5, 1_000_000)},
    "zh_tw": {"other": (0, 1, 2, 1.5, 1_000_000)},
    "ko_kr": {"other": (0, 1, 2, 1.5, 1_000_000)},
    "en_us": {"one": (1,), "other": (0, 2, 16, 100, 1000, 1.0, 0.5, 1.5, 1_000_000)},
    "de_de": {"one": (1,), "other": (0, 2, 16, 100, 1000, 1.0, 0.5, 1.5, 1_000_000)},
    "es_es": {"one": (1, 1.0), "many": (1_000_000, 2_000_000), "other": (0, 2, 16, 100, 0.5, 1.5, 1000)},
    "fr_fr": {"one": (0, 1, 0.5, 1.5), "many": (1_000_000, 3_000_000), "other": (2, 16, 100, 1000, 2.5)},
    "pt_br": {"one": (0, 1, 0.5, 1.5), "many": (1_000_000, 3_000_000), "other": (2, 16, 100, 1000, 2.5)},
    "tr": {"one": (1, 1.0), "other": (0, 2, 16, 100, 1000, 0.5, 1.5, 1_000_000)},
}


def test_every_catalog_locale_has_a_plural_rule() -> None:
    assert set(RULES) == set(CATALOG_LOCALES)
    assert set(CLDR_SAMPLES) == set(CATALOG_LOCALES)


@pytest.mark.parametrize("locale", CATALOG_LOCALES)
def test_plural_rule_matches_the_cldr_samples(locale: str) -> None:
    for category, numbers in CLDR_SAMPLES[locale].items():
        for number in numbers:
            assert plural_category(locale, number) == category, (locale, number)


def test_operands_follow_cldr() -> None:
    assert operands(-3) == Operands(n=3, i=3, v=0)
    assert operands(1.0) == Operands(n=1.0, i=1, v=1)  # "1.0": a visible fraction digit
    assert operands(12.25) == Operands(n=12.25, i=12, v=2)
    assert plural_category("en_us", float("inf")) == "other"


PLURAL_KEYS = sorted(key.removesuffix(".one") for key in MESSAGES if key.endswith(".one"))


def _expected_form(key: str, locale: str, number: int | float) -> str:
    form = f"{key}.{plural_category(locale, number)}"
    return MESSAGES[form if form in MESSAGES else f"{key}.other"][locale]


@pytest.mark.parametrize("key", PLURAL_KEYS)
def test_every_one_other_pair_translates_by_the_locale_rule(key: str) -> None:
    assert key not in MESSAGES  # only the forms exist: a bare key would shadow the choice
    params: dict[str, Any] = dict.fromkeys(_fields(MESSAGES[f"{key}.other"]["zh_cn"]), 0)
    count_param = _count_param(params)
    for locale in CATALOG_LOCALES:
        for number in (0, 1, 2, 1_000_000):
            values = {**params, count_param: number}
            rendered = translate(plural(key, count_param, values), locale)
            assert rendered == _expected_form(key, locale, number).format(**values), (key, locale, number)


# The parameter a counted key's form follows: the one it counts (``view.image.more`` counts the hidden).
COUNT_PARAMS = ("hidden", "count", "n", "total")
# Counted by nothing: units after a number are abbreviations (3 min, 12 s), ``round {round}`` is an
# ordinal label, ``task #{id}`` an id and ``{prompt}+{completion} tok`` a unit symbol.
UNCOUNTED = re.compile(r"^(card\.duration\.|card\.round$|tool\.preview\.task$|view\.subagents\.tokens$)")
# Written out from CLDR plurals.xml, not read from plurals.py: the category of 0, 1, 2 and 5.
FORMS_AT_0_1_2_5 = {
    "zh_cn": ("other", "other", "other", "other"),
    "zh_tw": ("other", "other", "other", "other"),
    "ko_kr": ("other", "other", "other", "other"),
    "en_us": ("other", "one", "other", "other"),
    "de_de": ("other", "one", "other", "other"),
    "es_es": ("other", "one", "other", "other"),
    "tr": ("other", "one", "other", "other"),
    "fr_fr": ("one", "one", "other", "other"),
    "pt_br": ("one", "one", "other", "other"),
}


def _count_param(params: dict[str, Any]) -> str:
    return next(name for name in COUNT_PARAMS if name in params)


def test_every_counted_text_has_its_plural_forms() -> None:
    """Seeds 000/002 counted texts: a count placeholder means ``.one`` / ``.other`` forms, never one text."""
    counted = {
        key
        for key, translations in MESSAGES.items()
        if set(COUNT_PARAMS) & _fields(translations["zh_cn"]) and not UNCOUNTED.match(key)
    }
    assert counted and all(key.endswith((".one", ".other")) for key in counted), sorted(
        key for key in counted if not key.endswith((".one", ".other"))
    )
    assert set(FORMS_AT_0_1_2_5) == set(CATALOG_LOCALES)


@pytest.mark.parametrize("key", PLURAL_KEYS)
def test_every_counted_key_renders_its_cldr_form_at_0_1_2_5(key: str) -> None:
    params: dict[str, Any] = dict.fromkeys(_fields(MESSAGES[f"{key}.other"]["zh_cn"]), 3)
    count_param = _count_param(params)
    for locale in CATALOG_LOCALES:
        for number, category in zip((0, 1, 2, 5), FORMS_AT_0_1_2_5[locale], strict=True):
            values = {**params, count_param: number}
            rendered = translate(plural(key, count_param, values), locale)
            assert rendered == MESSAGES[f"{key}.{category}"][locale].format(**values), (key, locale, number)


@pytest.mark.parametrize(
    ("text", "locale", "expected"),
    [
        (
            wait_summary_msg(WaitSummary(completed=1, all_completed=True, timed_out=False)),
            "fr_fr",
            "1 terminé · tous terminés",
        ),
        (
            wait_summary_msg(WaitSummary(completed=1, all_completed=True, timed_out=False)),
            "pt_br",
            "1 concluído · todos concluídos",
        ),
        (
            wait_summary_msg(WaitSummary(completed=1, all_completed=False, timed_out=False)),
            "es_es",
            "1 completado",
        ),
        (
            wait_summary_msg(WaitSummary(completed=2, all_completed=False, timed_out=True)),
            "fr_fr",
            "2 terminés · délai dépassé",
        ),
    ],
)
def test_the_issue_s_counted_lines_read_right(text: Msg, locale: str, expected: str) -> None:
    assert translate(text, locale) == expected


@pytest.mark.parametrize(
    ("locale", "six", "more", "one"),
    [
        ("de_de", "**Subagenten · 6 laufen**", "- 1 weiterer läuft", "**Subagenten · 1 läuft**"),
        ("fr_fr", "**Sous-agents · 6 en cours**", "- 1 autre en cours", "**Sous-agents · 1 en cours**"),
        ("en_us", "**Subagents · 6 running**", "- 1 more running", "**Subagents · 1 running**"),
    ],
)
def test_the_subagent_section_counts_in_the_card_s_language(
    locale: str, six: str, more: str, one: str
) -> None:
    subagents = tuple(SubagentSummary(i, "worker", f"t{i}", "RUNNING", 0) for i in range(6))

    def section(shown: tuple[SubagentSummary, ...]) -> list[str]:
        model = card_model(
            session_id=1, status=TaskStatus.RUNNING, round=1, subagents=shown, locales=(locale,)
        )
        elements = build_progress_card(model)["body"]["elements"]
        return next(e["content"] for e in elements if "t0" in e.get("content", "")).split("\n")

    lines = section(subagents)
    assert lines[0] == six and lines[-1] == more
    assert section(subagents[:1])[0] == one


def test_hidden_images_count_the_hidden_ones() -> None:
    view = ImageGridView(
        prompt="", model="", size="", items=tuple(ImageItem("u", None, None, None) for _ in range(10))
    )
    hidden = image_hidden(view)
    assert hidden is not None
    assert translate(hidden, "fr_fr") == "10 au total, 1 autre non affichée"
    assert translate(hidden, "pt_br") == "10 no total, mais 1 não exibida"
    assert translate(image_footer(view), "en_us") == "10 images"


def test_zero_is_singular_in_french_and_brazilian_portuguese_only() -> None:
    lines = count("tool.detail.lines", 0)
    assert translate(lines, "fr_fr") == "0 ligne"
    assert translate(lines, "pt_br") == "0 linha"
    assert translate(lines, "en_us") == "0 lines"
    assert translate(lines, "de_de") == "0 Zeilen"
    assert translate(count("tool.detail.lines", 1), "en_us") == "1 line"
    assert translate(count("tool.detail.lines", 2), "fr_fr") == "2 lignes"


def test_a_locale_without_a_catalog_reads_english_with_the_english_rule() -> None:
    assert translate(count("tool.detail.lines", 0), "ja_jp") == "0 lines"
    assert translate(count("tool.detail.lines", 1), "ja_jp") == "1 line"


def test_plural_choice_survives_escaping_and_capping_in_a_card() -> None:
    calls = (
        ToolCall("a", "read_file", {"path": "x.py"}, "", finished=True),
        ToolCall("b", "read_file", {"path": "y.py"}, "a\nb\n", finished=True),
    )
    card = build_progress_card(
        card_model(session_id=1, status=TaskStatus.RUNNING, round=1, tools=calls, locales=("fr_fr", "en_us"))
    )
    tools = next(e for e in card["body"]["elements"] if "x.py" in e.get("content", ""))
    assert tools["content"].endswith("- Lire x.py (0 ligne)\n- Lire y.py (2 lignes)")
    assert tools["i18n_content"]["en_us"].endswith("- Read x.py (0 lines)\n- Read y.py (2 lines)")


# -- one list of locales ------------------------------------------------------------------------------


def test_locale_lists_live_in_i18n_only() -> None:
    """No module but i18n/locales.py spells out Feishu's codes (one list, imported everywhere)."""
    spelled = re.compile(r'"(?:zh_hk|ja_jp|id_id|vi_vn|th_th|it_it|ru_ru|ms_my)"')
    offenders = [
        str(path.relative_to(PACKAGE_DIR))
        for path in PACKAGE_DIR.rglob("*.py")
        if spelled.search(path.read_text(encoding="utf-8")) and path.name != "locales.py"
    ]
    assert offenders == []
    assert set(CATALOG_LOCALES) <= set(CARD_LOCALES)
    assert tuple(code for code in CATALOG_LOCALES if code not in FEISHU_LOCALES) == SINGLE_LANGUAGE_LOCALES
