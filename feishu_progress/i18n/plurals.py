"""CLDR cardinal plural rules for the nine catalog locales (unicode.org/cldr, plurals.xml).

The table is small, so it is written out rather than taken from Babel. A rule maps a number's CLDR
operands to a category (``one``, ``many``, ``other``); a catalog provides ``<key>.one`` and
``<key>.other``, and a category it lacks (``many``) reads ``<key>.other``.

Operands (CLDR, "Plural Operand Meanings"): ``n`` the absolute value, ``i`` its integer digits, ``v``
the number of visible fraction digits (``1.0`` has v = 1: English says "1.0 lines").
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

ONE = "one"
MANY = "many"
OTHER = "other"
_MILLION = 1_000_000


@dataclass(frozen=True, slots=True)
class Operands:
    n: float
    i: int
    v: int


def operands(number: int | float) -> Operands:
    """CLDR operands of ``number`` as it would be printed (``repr`` of a float gives its digits)."""
    if isinstance(number, int):
        return Operands(n=abs(number), i=abs(number), v=0)
    if not math.isfinite(number):
        return Operands(n=math.inf, i=0, v=0)
    digits = repr(abs(number))
    fraction = digits.split(".", 1)[1] if "." in digits and "e" not in digits else ""
    return Operands(n=abs(number), i=int(abs(number)), v=len(fraction))


def _other_only(_: Operands) -> str:
    # zh, ko: no grammatical number.
    return OTHER


def _one_if_integer_one(op: Operands) -> str:
    # en, de: one → i = 1 and v = 0.
    return ONE if op.i == 1 and op.v == 0 else OTHER


def _one_if_n_is_one(op: Operands) -> str:
    # tr: one → n = 1.
    return ONE if op.n == 1 else OTHER


def _millions_are_many(op: Operands) -> bool:
    # es, fr, pt: many → e = 0 and i != 0 and i % 1000000 = 0 and v = 0.
    return op.i != 0 and op.i % _MILLION == 0 and op.v == 0


def _spanish(op: Operands) -> str:
    # es: one → n = 1.
    if op.n == 1:
        return ONE
    return MANY if _millions_are_many(op) else OTHER


def _zero_and_one_are_one(op: Operands) -> str:
    # fr: one → i = 0,1; pt (Brazil): one → i = 0..1. Zero is singular: "0 ligne", "0 linha".
    if op.i in (0, 1):
        return ONE
    return MANY if _millions_are_many(op) else OTHER


RULES: dict[str, Callable[[Operands], str]] = {
    "zh_cn": _other_only,
    "zh_tw": _other_only,
    "ko_kr": _other_only,
    "en_us": _one_if_integer_one,
    "de_de": _one_if_integer_one,
    "es_es": _spanish,
    "fr_fr": _zero_and_one_are_one,
    "pt_br": _zero_and_one_are_one,
    "tr": _one_if_n_is_one,
}


def plural_category(locale: str, number: int | float) -> str:
    """The CLDR category of ``number`` in ``locale`` (a catalog locale; unknown ones count as English)."""
    rule = RULES.get(locale, _one_if_integer_one)
    return rule(operands(number))
