"""CardKit in the sandbox: card entities, sending them by reference, full updates, settings, streamed text.

Rules and codes follow docs/feishu-platform.md §4; state.py's code list marks the sandbox's guesses.
An entity's card is never mutated: every change builds a new dict (sharing the untouched parts), so the
cards in a message's ``history`` stay as they were shown. Time is the sandbox's (scaled or injected).
"""

from __future__ import annotations

import hashlib
import itertools
import json
from collections import Counter, OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from feishu_progress.cards.validate import card_problems, element_count, tagged_objects
from feishu_progress.sandbox.state import (
    CARD_ALREADY_SENT,
    CARD_ENTITY_EXPIRED,
    CARD_INVALID,
    CARD_NOT_FOUND,
    CARD_RATE_LIMITED,
    CARDKIT_CARD_TOO_LARGE,
    DAY,
    DUPLICATE_ELEMENT_ID,
    ELEMENT_NOT_FOUND,
    ELEMENT_NOT_STREAMABLE,
    FIELD_VALIDATION,
    MISSING_SCOPE,
    OK,
    SCHEMA_NOT_2,
    SEQUENCE_NOT_INCREASING,
    STREAM_TIMED_OUT,
    STREAMING_CLOSED,
    TOO_MANY_ELEMENTS,
    UPDATE_MULTI_FALSE,
    UUID_CONFLICT,
    Answer,
    SandboxConfig,
    SandboxMessage,
    SandboxState,
    SlidingWindow,
    error,
    success,
)

CREATE = "card_create"
UPDATE = "card_update"
SETTINGS = "card_settings"
CONTENT = "card_content"

INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1
STREAMABLE_TAGS = frozenset({"markdown", "plain_text"})
_VERDICT_CACHE_SIZE = 256


class UpdateKind(StrEnum):
    """The accepted changes a card entity can receive."""

    FULL = "full"
    SETTINGS = "settings"
    CONTENT = "content"


@dataclass(frozen=True, slots=True)
class StreamUpdate:
    """One accepted streamed text: did it extend the old text (Feishu types it out) or rewrite it?"""

    at: float
    element_id: str
    sequence: int
    prefix: bool
    chars: int


@dataclass(slots=True)
class CardKitRecord:
    """What one card entity received; the message showing it reads the same record."""

    updates: Counter[str] = field(default_factory=Counter)  # UpdateKind -> accepted updates
    streams: list[StreamUpdate] = field(default_factory=list)
    last_error: int | None = None
    dropped: int = 0  # streamed texts answered 0 but dropped (the silent-drop fault)


@dataclass(slots=True)
class CardEntity:
    """A card entity: its current card (streamed texts merged in) and the rules' memory."""

    card_id: str
    card: dict[str, Any]
    created_at: float
    rate: SlidingWindow
    record: CardKitRecord = field(default_factory=CardKitRecord)
    message_id: str | None = None
    sequence: int | None = None  # the highest sequence accepted so far
    streaming_since: float | None = None  # when streaming was last opened; None while it is off
    closed_by_window: bool = False  # streaming closed itself; stays so until the card is set again
    window_error_sent: bool = False  # the one 200850 for that closing was answered
    uuids: OrderedDict[str, tuple[bytes, float, Answer]] = field(default_factory=OrderedDict)


Apply = Callable[[CardEntity, int, float], Answer]


class CardKit:
    """The CardKit endpoints' rules; ``state`` supplies time, config, app budgets, faults and messages."""

    def __init__(self, state: SandboxState) -> None:
        self._state = state
        self.cards: dict[str, CardEntity] = {}
        self.counters: Counter[str] = Counter()
        self._ids = itertools.count(1)
        self._verdicts: OrderedDict[str, Answer | dict[str, Any]] = OrderedDict()

    @property
    def _config(self) -> SandboxConfig:
        return self._state.config

    # --- test controls and inspection --------------------------------------------------------

    def age_card(self, card_id: str, days: float) -> None:
        """Pretend ``card_id`` was created ``days`` earlier than it was."""
        self.cards[card_id].created_at -= days * DAY

    def message_id_of(self, card_id: str) -> str | None:
        """The message showing ``card_id``, if it was sent."""
        entity = self.cards.get(card_id)
        return entity.message_id if entity is not None else None

    def notify(self, card_id: str) -> None:
        """Tell the state's listeners that the message showing ``card_id`` was acted on."""
        message_id = self.message_id_of(card_id)
        if message_id is not None:
            self._state._notify(self._state.messages[message_id])

    def stats(self) -> dict[str, int]:
        """Counters for ``/_sandbox/stats``: entities, sends, accepted updates by kind, stream shapes."""
        names = ("created", "sent", *UpdateKind, "prefix", "rewrite", "dropped", "windows_closed")
        return {"cards": len(self.cards), **{str(name): self.counters[name] for name in names}}

    # --- create and send ---------------------------------------------------------------------

    def create(self, body: Mapping[str, Any]) -> Answer:
        """POST cardkit/v1/cards: a new entity from card JSON 2.0, answered with its card_id."""
        refused = self._scope_refusal() or self._state.app_limit(CREATE)
        if refused is not None:
            return refused
        if body.get("type") != "card_json":
            return error(FIELD_VALIDATION, "field validation failed: type must be 'card_json'")
        verdict = self.judge(body.get("data"))
        if isinstance(verdict, Answer):
            return verdict
        now = self._state.now()
        card_id = f"7sandbox{next(self._ids):06d}"
        entity = CardEntity(card_id, verdict, now, SlidingWindow(self._config.cardkit_per_card_qps, 1.0))
        entity.streaming_since = now if _streaming_mode(verdict) else None
        self.cards[card_id] = entity
        self.counters["created"] += 1
        return success({"card_id": card_id})

    def referenced_card_id(self, content: object) -> str | None:
        """The card_id when an im/v1 message ``content`` sends a card entity by reference."""
        if not isinstance(content, str) or '"card_id"' not in content:
            return None
        try:
            parsed = json.loads(content)
        except ValueError:
            return None
        if not isinstance(parsed, dict) or parsed.get("type") != "card":
            return None
        data = parsed.get("data")
        card_id = data.get("card_id") if isinstance(data, dict) else None
        return card_id if isinstance(card_id, str) else None

    def sendable(self, card_id: str) -> Answer | dict[str, Any]:
        """The entity's current card if it may be sent now, else the refusal."""
        entity = self.cards.get(card_id)
        if entity is None:
            return error(CARD_NOT_FOUND, f"card not found: card_id {card_id}")
        now = self._state.now()
        if self._expired(entity, now):
            return error(CARD_ENTITY_EXPIRED, "card entity expired: valid for 14 days after creation")
        if entity.message_id is not None:
            return error(
                CARD_ALREADY_SENT,
                "Failed to create card content, ext=ErrCode: 11310; "
                "ErrMsg: a card entity can be sent only once (sandbox guess);",
            )
        self._close_if_window_passed(entity, now)
        return entity.card

    def attach(self, card_id: str, message: SandboxMessage) -> None:
        """Bind a just-sent message to its entity: later updates show in its history."""
        entity = self.cards[card_id]
        entity.message_id = message.message_id
        message.card_id = card_id
        message.cardkit = entity.record
        self.counters["sent"] += 1

    # --- the three updates -------------------------------------------------------------------

    def update(self, card_id: str, body: Mapping[str, Any]) -> Answer:
        """PUT cardkit/v1/cards/:card_id: replace the whole card."""
        return self._operate(UPDATE, card_id, body, lambda e, seq, now: self._apply_update(e, body, now))

    def settings(self, card_id: str, body: Mapping[str, Any]) -> Answer:
        """PATCH …/settings: change only the ``config`` keys and ``card_link`` the settings name."""
        return self._operate(SETTINGS, card_id, body, lambda e, seq, now: self._apply_settings(e, body, now))

    def content(self, card_id: str, element_id: str, body: Mapping[str, Any]) -> Answer:
        """PUT …/elements/:element_id/content: the element's full new text, while streaming."""
        return self._operate(
            CONTENT,
            card_id,
            body,
            lambda e, seq, now: self._apply_content(e, element_id, body, seq, now),
            scope=element_id,
        )

    def _operate(
        self, endpoint: str, card_id: str, body: Mapping[str, Any], apply: Apply, scope: str = ""
    ) -> Answer:
        entity = self.cards.get(card_id)
        answer = self._decide(endpoint, entity, card_id, body, apply, scope=scope)
        if entity is not None and answer.code != OK:
            entity.record.last_error = answer.code
            message = self._state.messages.get(entity.message_id or "")
            if message is not None:  # the preview's badge shows a message's last refusal, any API
                message.last_error_code = answer.code
        return answer

    def _decide(
        self,
        endpoint: str,
        entity: CardEntity | None,
        card_id: str,
        body: Mapping[str, Any],
        apply: Apply,
        *,
        scope: str,
    ) -> Answer:
        """Rules every update shares, in order: scope, app budget, entity, uuid, per-card rate, sequence."""
        refused = self._scope_refusal() or self._state.app_limit(endpoint)
        if refused is not None:
            return refused
        if entity is None:
            return error(CARD_NOT_FOUND, f"card not found: card_id {card_id}")
        now = self._state.now()
        if self._expired(entity, now):
            return error(CARD_ENTITY_EXPIRED, "card entity expired: valid for 14 days after creation")
        self._close_if_window_passed(entity, now)
        uuid = body.get("uuid")
        uuid = uuid if isinstance(uuid, str) and uuid else None
        fingerprint = _fingerprint(endpoint, scope, body)
        if uuid is not None:
            replayed = self._replay(entity, uuid, fingerprint, now)
            if replayed is not None:
                return replayed
        sequence = body.get("sequence")
        refused = self._card_rate(entity, now) or self._sequence_refusal(entity, sequence)
        if refused is not None:
            return refused
        assert isinstance(sequence, int)  # _sequence_refusal refused anything else
        answer = apply(entity, sequence, now)
        if answer.code == OK:
            entity.sequence = sequence
            if uuid is not None:
                entity.uuids[uuid] = (fingerprint, now, answer)
        return answer

    def _apply_update(self, entity: CardEntity, body: Mapping[str, Any], now: float) -> Answer:
        card = body.get("card")
        if not isinstance(card, Mapping) or card.get("type") != "card_json":
            return error(FIELD_VALIDATION, "field validation failed: card.type must be 'card_json'")
        verdict = self.judge(card.get("data"))
        if isinstance(verdict, Answer):
            return verdict
        # Turning streaming on opens the window; a card that keeps streaming keeps its window.
        if not _streaming_mode(verdict):
            entity.streaming_since = None
        elif entity.streaming_since is None:
            entity.streaming_since = now
        entity.closed_by_window = False
        return self._accept(entity, verdict, UpdateKind.FULL, now)

    def _apply_settings(self, entity: CardEntity, body: Mapping[str, Any], now: float) -> Answer:
        settings = _parse_settings(body.get("settings"))
        if isinstance(settings, Answer):
            return settings
        card = dict(entity.card)
        config = settings.get("config", {})
        card["config"] = {**(card.get("config") or {}), **config}
        if "card_link" in settings:
            card["card_link"] = settings["card_link"]
        verdict = self.judge(_compact(card))
        if isinstance(verdict, Answer):
            return verdict
        if "streaming_mode" in config:
            # Setting streaming_mode true (re)opens the window even when it is already open.
            entity.streaming_since = now if config["streaming_mode"] is True else None
            entity.closed_by_window = False
        return self._accept(entity, verdict, UpdateKind.SETTINGS, now)

    def _apply_content(
        self, entity: CardEntity, element_id: str, body: Mapping[str, Any], sequence: int, now: float
    ) -> Answer:
        text = body.get("content")
        if not isinstance(text, str):
            return error(FIELD_VALIDATION, "field validation failed: content must be a string")
        element = _find_element(entity.card, element_id)
        if element is None:
            return error(ELEMENT_NOT_FOUND, f"ErrMsg: not find elementID: {element_id}")
        if element.get("tag") not in STREAMABLE_TAGS:
            return error(ELEMENT_NOT_STREAMABLE, "only markdown and plain_text elements can be streamed")
        if len(text) > self._config.max_stream_chars:
            return error(
                FIELD_VALIDATION,
                f"field validation failed: content is {len(text)} characters, "
                f"the limit is {self._config.max_stream_chars}",
            )
        refused = self._streaming_refusal(entity)
        if refused is not None:
            return refused
        if entity.closed_by_window:  # the silent-drop fault: success, but nothing changes
            entity.record.dropped += 1
            self.counters["dropped"] += 1
            return success()
        old = element.get("content")
        prefix = text.startswith(old if isinstance(old, str) else "")
        entity.record.streams.append(StreamUpdate(now, element_id, sequence, prefix, len(text)))
        self.counters["prefix" if prefix else "rewrite"] += 1
        return self._accept(entity, _with_text(entity.card, element_id, text), UpdateKind.CONTENT, now)

    def _streaming_refusal(self, entity: CardEntity) -> Answer | None:
        """200850 once when the window closed the stream, 300309 while it is off (unless dropping)."""
        if entity.closed_by_window and self._state.faults.drops_expired_streams:
            return None
        if entity.closed_by_window and not entity.window_error_sent:
            entity.window_error_sent = True
            return error(STREAM_TIMED_OUT, "streaming timed out: streaming mode closes 10 min after it opens")
        if entity.streaming_since is None:
            return error(STREAMING_CLOSED, "card streaming mode is closed")
        return None

    def _accept(self, entity: CardEntity, card: dict[str, Any], kind: UpdateKind, now: float) -> Answer:
        entity.card = card
        entity.record.updates[kind] += 1
        self.counters[kind] += 1
        self._show(entity, now)
        return success()

    # --- rules -------------------------------------------------------------------------------

    def _scope_refusal(self) -> Answer | None:
        if self._config.cardkit_scope:
            return None
        return error(
            MISSING_SCOPE,
            "Access denied. One of the following scopes is required: [cardkit:card:write]. "
            "The app has not been granted the scope.",
        )

    def _expired(self, entity: CardEntity, now: float) -> bool:
        return now - entity.created_at > self._config.card_entity_days * DAY

    def _close_if_window_passed(self, entity: CardEntity, now: float) -> None:
        """Feishu closes streaming a fixed time after it was last opened; the card then reads false."""
        opened = entity.streaming_since
        if opened is None or now - opened < self._config.cardkit_streaming_window:
            return
        entity.streaming_since = None
        entity.closed_by_window = True
        entity.window_error_sent = False
        entity.card = _with_config(entity.card, streaming_mode=False)
        self.counters["windows_closed"] += 1
        self._show(entity, now)

    def _replay(self, entity: CardEntity, uuid: str, fingerprint: bytes, now: float) -> Answer | None:
        """The first answer for a repeated uuid with the same body; 200770 for another body."""
        uuids = entity.uuids
        while uuids:
            oldest = next(iter(uuids.values()))
            if now - oldest[1] < self._config.uuid_ttl:
                break
            uuids.popitem(last=False)
        seen = uuids.get(uuid)
        if seen is None:
            return None
        if seen[0] != fingerprint:
            return error(UUID_CONFLICT, f"uuid {uuid} was already used with a different request body")
        return seen[2]

    def _card_rate(self, entity: CardEntity, now: float) -> Answer | None:
        if entity.rate.admit(now) is None:
            return None
        return error(CARD_RATE_LIMITED, "The card triggers the frequency limit: 10 operations per second.")

    def _sequence_refusal(self, entity: CardEntity, sequence: object) -> Answer | None:
        if (
            isinstance(sequence, bool)
            or not isinstance(sequence, int)
            or not INT32_MIN <= sequence <= INT32_MAX
        ):
            return error(FIELD_VALIDATION, "field validation failed: sequence must be an int32")
        last = entity.sequence
        if last is None or (sequence == last + 1) or (sequence > last and self._config.cardkit_sequence_gaps):
            return None
        return error(
            SEQUENCE_NOT_INCREASING,
            f"sequence number compare failed: {sequence} after {last}; "
            "the sequence did not increment consecutively",
        )

    # --- cards -------------------------------------------------------------------------------

    def judge(self, data: object) -> Answer | dict[str, Any]:
        """The parsed card if CardKit would accept the card JSON ``data``, else the refusal (memoised)."""
        if not isinstance(data, str):
            return error(
                CARD_INVALID, "Failed to create card content, ext=ErrCode: 200621; data must be a string"
            )
        verdict = self._verdicts.get(data)
        if verdict is None:
            verdict = self._judge_uncached(data)
            self._verdicts[data] = verdict
            if len(self._verdicts) > _VERDICT_CACHE_SIZE:
                self._verdicts.popitem(last=False)
        return verdict

    def _judge_uncached(self, data: str) -> Answer | dict[str, Any]:
        size = len(data.encode("utf-8"))
        if size > self._config.max_bytes:
            return error(CARDKIT_CARD_TOO_LARGE, f"card is {size} bytes, keep it within 30KB")
        try:
            card = json.loads(data)
        except ValueError:
            card = None
        if not isinstance(card, dict):
            return error(CARD_INVALID, "Failed to create card content, ext=ErrCode: 200621; invalid JSON")
        refused = self._entity_refusal(card)
        if refused is not None:
            return refused
        problems = card_problems(card) if self._config.validate_cards else []
        if problems:
            return error(
                CARD_INVALID,
                "Failed to create card content, ext=ErrCode: 200861; ErrMsg: " + "; ".join(problems)[:1000],
            )
        return card

    def _entity_refusal(self, card: Mapping[str, Any]) -> Answer | None:
        """The CardKit-specific refusals, which come with their own codes."""
        if card.get("schema") != "2.0":
            return error(SCHEMA_NOT_2, "card entities support card JSON 2.0 only (schema must be '2.0')")
        config = card.get("config")
        if isinstance(config, Mapping) and config.get("update_multi") is False:
            return error(UPDATE_MULTI_FALSE, "card entities cannot set config.update_multi to false")
        count = element_count(card)
        if count > self._config.max_elements:
            return error(
                TOO_MANY_ELEMENTS, f"card has {count} elements, the limit is {self._config.max_elements}"
            )
        duplicate = _duplicate_element_id(card)
        if duplicate is not None:
            return error(DUPLICATE_ELEMENT_ID, f"duplicate element_id {duplicate!r} in card")
        return None

    def _show(self, entity: CardEntity, now: float) -> None:
        """Append the entity's current card to the history of the message showing it."""
        if entity.message_id is not None:
            self._state.messages[entity.message_id].history.append((now, entity.card))


# --- pure helpers ----------------------------------------------------------------------------------


def _streaming_mode(card: Mapping[str, Any]) -> bool:
    config = card.get("config")
    return isinstance(config, Mapping) and config.get("streaming_mode") is True


def _fingerprint(endpoint: str, scope: str, body: Mapping[str, Any]) -> bytes:
    """What makes two requests "the same body" for uuid idempotency."""
    canonical = json.dumps(body, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(f"{endpoint}\0{scope}\0{canonical}".encode()).digest()


def _compact(card: Mapping[str, Any]) -> str:
    return json.dumps(card, ensure_ascii=False, separators=(",", ":"))


def _parse_settings(raw: object) -> Answer | dict[str, Any]:
    """The settings string: a JSON object naming ``config`` (an object) and/or ``card_link``."""
    refused = error(FIELD_VALIDATION, "field validation failed: settings must hold config and/or card_link")
    if not isinstance(raw, str):
        return refused
    try:
        settings = json.loads(raw)
    except ValueError:
        return refused
    if not isinstance(settings, dict) or not ({"config", "card_link"} & settings.keys()):
        return refused
    if not isinstance(settings.get("config", {}), dict):
        return refused
    return settings


def _duplicate_element_id(card: Mapping[str, Any]) -> str | None:
    seen: set[str] = set()
    for obj in tagged_objects(card.get("body", {})):
        element_id = obj.get("element_id")
        if isinstance(element_id, str):
            if element_id in seen:
                return element_id
            seen.add(element_id)
    return None


def _find_element(card: Mapping[str, Any], element_id: str) -> Mapping[str, Any] | None:
    for obj in tagged_objects(card.get("body", {})):
        if obj.get("element_id") == element_id:
            return obj
    return None


def _with_config(card: Mapping[str, Any], **changes: Any) -> dict[str, Any]:
    return {**card, "config": {**(card.get("config") or {}), **changes}}


def _with_text(card: Mapping[str, Any], element_id: str, text: str) -> dict[str, Any]:
    """A copy of ``card`` whose element ``element_id`` reads ``text``; untouched parts are shared."""
    body, _ = _replace_text(card.get("body", {}), element_id, text)
    return {**card, "body": body}


def _replace_text(node: Any, element_id: str, text: str) -> tuple[Any, bool]:
    if isinstance(node, Mapping):
        if "tag" in node and node.get("element_id") == element_id:
            return {**node, "content": text}, True
        for key, child in node.items():
            replaced, found = _replace_text(child, element_id, text)
            if found:
                return {**node, key: replaced}, True
    elif isinstance(node, list):
        for index, child in enumerate(node):
            replaced, found = _replace_text(child, element_id, text)
            if found:
                return [*node[:index], replaced, *node[index + 1 :]], True
    return node, False
