"""Check a card against Feishu's JSON 2.0 rules: the schema plus the limits no schema can express.

Used by the sandbox (to refuse what Feishu would refuse) and by the tests (every card we build must
pass). Pure: the schema is read from package data once.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from functools import cache
from importlib import resources
from typing import Any

from jsonschema import Draft202012Validator

MAX_CARD_BYTES = 30 * 1024
MAX_ELEMENTS = 200
MAX_NESTING = 5

_CHILD_LISTS = ("elements", "columns")


@cache
def _validator() -> Draft202012Validator:
    text = (
        resources.files("feishu_progress.cards")
        .joinpath("schema/card-json-2.0.schema.json")
        .read_text("utf-8")
    )
    return Draft202012Validator(json.loads(text))


def card_bytes(card: Mapping[str, Any]) -> int:
    """Size of the card as it travels (compact JSON, UTF-8)."""
    return len(json.dumps(card, ensure_ascii=False, separators=(",", ":")).encode("utf-8"))


def _components(nodes: Any, depth: int) -> Iterator[tuple[Mapping[str, Any], int]]:
    if not isinstance(nodes, list):
        return
    for node in nodes:
        if isinstance(node, Mapping):
            yield node, depth
            for key in _CHILD_LISTS:
                yield from _components(node.get(key), depth + 1)


def tagged_objects(value: Any) -> Iterator[Mapping[str, Any]]:
    """Every object with a ``tag`` under ``value`` (components and text elements alike)."""
    if isinstance(value, Mapping):
        if "tag" in value:
            yield value
        for child in value.values():
            yield from tagged_objects(child)
    elif isinstance(value, list):
        for child in value:
            yield from tagged_objects(child)


def element_count(card: Mapping[str, Any]) -> int:
    """Components plus text elements (every object with a ``tag``) in the body: Feishu's 200 limit."""
    return sum(1 for _ in tagged_objects(card.get("body", {})))


def nesting_depth(card: Mapping[str, Any]) -> int:
    body = card.get("body", {})
    elements = body.get("elements") if isinstance(body, Mapping) else None
    return max((depth for _, depth in _components(elements, 1)), default=0)


def card_problems(card: Mapping[str, Any]) -> list[str]:
    """Every reason Feishu would refuse this card; an empty list means it is acceptable."""
    problems = [
        f"schema: {'/'.join(str(p) for p in error.absolute_path) or '<root>'}: {error.message[:200]}"
        for error in _validator().iter_errors(card)
    ]
    if card.get("schema") != "2.0":
        problems.append("schema must be '2.0'")
    config = card.get("config")
    if not isinstance(config, Mapping) or config.get("update_multi") is not True:
        problems.append("config.update_multi must be true")
    size = card_bytes(card)
    if size > MAX_CARD_BYTES:
        problems.append(f"card is {size} bytes, over {MAX_CARD_BYTES}")
    count = element_count(card)
    if count > MAX_ELEMENTS:
        problems.append(f"card has {count} elements, over {MAX_ELEMENTS}")
    depth = nesting_depth(card)
    if depth > MAX_NESTING:
        problems.append(f"card nests {depth} levels, over {MAX_NESTING}")
    problems.extend(_uniqueness_problems(card))
    return problems


def _uniqueness_problems(card: Mapping[str, Any]) -> list[str]:
    problems: list[str] = []
    seen_ids: set[str] = set()
    seen_names: set[str] = set()
    for obj in tagged_objects(card.get("body", {})):
        element_id = obj.get("element_id")
        if isinstance(element_id, str):
            if element_id in seen_ids:
                problems.append(f"duplicate element_id {element_id!r}")
            seen_ids.add(element_id)
        name = obj.get("name")
        if isinstance(name, str) and obj.get("tag") != "form":
            if name in seen_names:
                problems.append(f"duplicate form field name {name!r}")
            seen_names.add(name)
        if obj.get("tag") == "form" and not any(
            child.get("tag") == "button" and child.get("form_action_type") == "submit"
            for child in tagged_objects(obj.get("elements", []))
        ):
            problems.append(f"form {obj.get('name')!r} has no submit button")
    return problems
