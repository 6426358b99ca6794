"""Feishu card callbacks: verify, decrypt and parse one request into a ``CardActionEvent``.

No aiohttp here: ``parse_callback`` takes the raw bytes, the headers and the time, so the webhook
(``web/callbacks.py``) and the long-connection receiver (``feishu/ws.py``) share one conversion.

Checks, in this order (docs/feishu-platform.md §5):

1. body size (``callback.max_body_bytes``) → 413
2. signature ``sha256(ts + nonce + encrypt_key + raw_body)`` when an Encrypt Key is configured → 401,
   checked on the raw bytes BEFORE anything is decrypted or parsed. Only ``url_verification`` may come
   unsigned, as lark-oapi allows: it has no side effect beyond echoing the challenge, and it still needs
   the verification token (and the Encrypt Key, when encrypted).
3. JSON object → 400
4. AES-256-CBC decryption when the body is ``{"encrypt": ...}`` → 400
5. verification token (``header.token``; top-level ``token`` for ``url_verification`` and 1.0 bodies) → 401
6. timestamp window (``X-Lark-Request-Timestamp`` and ``header.create_time``) → 403 "stale ..."
7. ``event_type`` must be ``card.action.trigger`` → 400 naming it
8. required fields → 400 naming the missing field

With neither an Encrypt Key nor a verification token configured every callback is refused (401): the
service refuses to start that way outside sandbox mode, and sandbox mode makes up keys of its own.
Nothing here logs a payload, a token or a key.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from cryptography.hazmat.primitives import padding
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

from feishu_progress.bounded import BoundedCache
from feishu_progress.config import DEFAULT_APP as DEFAULT_APP_NAME
from feishu_progress.config import FeishuSettings, Settings
from feishu_progress.errors import CallbackRejected
from feishu_progress.i18n import FEISHU_LOCALES, Text, i18n_map, translate
from feishu_progress.ports import Deduper

CARD_ACTION_TRIGGER = "card.action.trigger"
URL_VERIFICATION = "url_verification"
TIMESTAMP_HEADER = "x-lark-request-timestamp"
NONCE_HEADER = "x-lark-request-nonce"
SIGNATURE_HEADER = "x-lark-signature"
_AES_BLOCK = 16
_DIGITS = re.compile(r"[0-9]{1,20}")
# One reason for every failure after AES (padding, UTF-8, JSON): distinct answers would be a padding oracle.
UNDECRYPTABLE = "encrypt cannot be decrypted"
UNSIGNED = "missing signature headers"  # the one answer to every unsigned body but the URL check

ToastType = Literal["info", "success", "warning", "error"]


@dataclass(frozen=True, slots=True)
class UrlVerification:
    """The platform's URL check: answer ``{"challenge": challenge}``."""

    challenge: str


@dataclass(frozen=True, slots=True)
class CardActionEvent:
    """One verified click or form submit on a card (schema 2.0 ``card.action.trigger``)."""

    event_id: str
    token: str  # event.token: the per-click callback token (delayed updates, dedupe)
    open_id: str
    message_id: str  # event.context.open_message_id
    union_id: str | None = None
    user_id: str | None = None  # absent over the long connection
    chat_id: str | None = None  # event.context.open_chat_id
    tag: str | None = None
    name: str | None = None  # the submit button's name for a form submit
    value: Mapping[str, Any] = field(default_factory=dict)
    form_value: Mapping[str, Any] = field(default_factory=dict)
    input_value: str | None = None
    option: str | None = None
    options: tuple[str, ...] = ()
    checked: bool | None = None
    create_time: float | None = None  # epoch seconds, from header.create_time
    tenant_key: str | None = None
    # The app whose callback route (or long connection) carried the click; None: not known (tests).
    app: str | None = None


Parsed = UrlVerification | CardActionEvent


@dataclass(frozen=True, slots=True)
class CallbackReply:
    """What the action handler answers: an optional toast and an optional replacement card."""

    toast_type: ToastType = "info"
    text: Text | None = None  # None: no toast
    card: Mapping[str, Any] | None = None  # a full 2.0 card to replace the clicked one
    # Cluster mode: the answer another instance (the card's writer) already rendered; sent as it is.
    rendered: Mapping[str, Any] | None = None


class ActionHandler(Protocol):
    """Does what a click means. Must answer within Feishu's 3 s; slow work goes to background tasks."""

    async def handle(self, event: CardActionEvent) -> CallbackReply: ...


# 24 h of keys at two a click (event id and token) is 50,000 clicks a day before the oldest is forgotten
# early; at ~150 bytes a key that is ~15 MB at most. A redelivery comes within minutes, not a day later.
DEDUPE_MEMORY_ENTRIES = 100_000


class MemoryDeduper:
    """``ports.Deduper`` in process: a TTL set, bounded in size (the oldest key goes first when full)."""

    def __init__(
        self,
        ttl_seconds: float,
        max_entries: int = DEDUPE_MEMORY_ENTRIES,
        now: Callable[[], float] = time.monotonic,
    ) -> None:
        self._ttl = ttl_seconds
        self._now = now
        # key -> expiry. With one TTL for all keys, insertion order is expiry order: expired keys sit at
        # the front, and a lookup is no use of a key (it must not outlive its TTL by being clicked again).
        self._expiry: BoundedCache[str, float] = BoundedCache(max_entries, refresh_on_read=False)

    def __len__(self) -> int:
        return len(self._expiry)

    async def warm(self) -> int:
        return 0  # nothing stored beyond this process: see runtime/dedupe.py for the warmed one

    async def first_seen(self, key: str) -> bool:
        """Record ``key``; True if it was not seen within the TTL."""
        now = self._now()
        self._drop_expired(now)
        if key in self._expiry:
            return False
        self._expiry.put(key, now + self._ttl)
        return True

    def remember(self, key: str, expires_in: float) -> None:
        """Record ``key`` as seen for ``expires_in`` more seconds (warming from storage, soonest first)."""
        if expires_in > 0 and key not in self._expiry:
            self._expiry.put(key, self._now() + min(expires_in, self._ttl))

    def _drop_expired(self, now: float) -> None:
        while (oldest := self._expiry.oldest()) is not None and oldest[1] <= now:
            self._expiry.pop(oldest[0])


async def is_duplicate(deduper: Deduper, event: CardActionEvent) -> bool:
    """A click is a duplicate if its event id OR its callback token was seen before."""
    # Record both keys even when the first one already says "duplicate", so a redelivery that changes
    # only one of them is still caught next time.
    # Per app (the default app's keys stay as they were): a click refused on another app's route must
    # not use up the key of the same click on the right route.
    scope = "" if event.app in (None, DEFAULT_APP_NAME) else f"{event.app}:"
    new_event = await deduper.first_seen(f"{scope}event:{event.event_id}")
    new_token = await deduper.first_seen(f"{scope}token:{event.token}")
    return not (new_event and new_token)


def verify_signature(raw_body: bytes, timestamp: str, nonce: str, signature: str, encrypt_key: str) -> bool:
    """Whether ``signature`` is Feishu's sha256 over ``timestamp + nonce + encrypt_key`` and the raw body."""
    digest = hashlib.sha256(_utf8(timestamp + nonce + encrypt_key) + raw_body).hexdigest()
    return hmac.compare_digest(digest.encode(), _utf8(signature.strip().lower()))


def decrypt(encrypt_key: str, encrypted_b64: str) -> bytes:
    """AES-256-CBC with key sha256(encrypt_key), IV = first 16 bytes, PKCS7 padding."""
    try:
        blob = base64.b64decode(encrypted_b64, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise CallbackRejected(400, "encrypt is not valid base64") from exc
    if len(blob) < 2 * _AES_BLOCK or len(blob) % _AES_BLOCK:
        raise CallbackRejected(400, "encrypt has an invalid ciphertext length")
    key = hashlib.sha256(_utf8(encrypt_key)).digest()
    decryptor = Cipher(algorithms.AES(key), modes.CBC(blob[:_AES_BLOCK])).decryptor()
    padded = decryptor.update(blob[_AES_BLOCK:]) + decryptor.finalize()
    unpadder = padding.PKCS7(128).unpadder()
    try:
        return unpadder.update(padded) + unpadder.finalize()
    except ValueError as exc:
        raise CallbackRejected(400, UNDECRYPTABLE) from exc


def parse_callback(
    raw_body: bytes,
    headers: Mapping[str, str],
    settings: Settings,
    now: float,
    keys: FeishuSettings | None = None,
) -> Parsed:
    """Verify and parse one webhook request; raises ``CallbackRejected`` with the status to answer.

    ``keys``: the app whose route this is (its Encrypt Key and token only); default ``settings.feishu``.
    """
    if len(raw_body) > settings.callback.max_body_bytes:
        raise CallbackRejected(413, "body too large")
    lower_headers = {name.lower(): value for name, value in headers.items()}
    keys = settings.feishu if keys is None else keys
    encrypt_key = _secret(keys.encrypt_key)
    verification_token = _secret(keys.verification_token)
    if not encrypt_key and not verification_token:
        raise CallbackRejected(401, "callbacks are not configured: no Encrypt Key and no verification token")
    if encrypt_key and not _has_signature(lower_headers):
        return _unsigned_url_check(raw_body, encrypt_key, verification_token)
    if encrypt_key:
        # The signature covers the raw bytes: check it before decrypting or parsing anything.
        _check_signature(raw_body, lower_headers, encrypt_key)
    payload = _load_object(raw_body, "body")
    if "encrypt" in payload:
        payload = _decrypted_payload(payload["encrypt"], encrypt_key)
    _check_token(payload, verification_token)
    if payload.get("type") == URL_VERIFICATION:
        return _url_verification(payload)
    _check_fresh(lower_headers, _create_time(payload), now, settings.callback.timestamp_window_seconds)
    _check_event_type(payload)
    return event_from_payload(payload)


def _unsigned_url_check(raw_body: bytes, encrypt_key: str, verification_token: str) -> UrlVerification:
    """With an Encrypt Key, only Feishu's URL check comes unsigned; anything else unsigned is refused.

    Every failure answers the same 401 and sentence: telling bad base64, bad padding and bad JSON of a
    decrypted body apart would make this endpoint an oracle for ciphertexts nobody signed.
    """
    try:
        payload = _load_object(raw_body, "body")
        if "encrypt" in payload:
            payload = _decrypted_payload(payload["encrypt"], encrypt_key)
        if payload.get("type") == URL_VERIFICATION:
            _check_token(payload, verification_token)
            return _url_verification(payload)
    except CallbackRejected:
        pass
    raise CallbackRejected(401, UNSIGNED)


def event_from_payload(payload: Mapping[str, Any]) -> CardActionEvent:
    """Convert a decrypted ``card.action.trigger`` body (webhook or long connection) to an event."""
    header = _object(payload, "header")
    event = _object(payload, "event")
    operator = _object(event, "operator", "event.")
    action = _object(event, "action", "event.")
    context = _object(event, "context", "event.")
    return CardActionEvent(
        event_id=_required_str(header, "header.event_id"),
        token=_required_str(event, "event.token"),
        open_id=_required_str(operator, "event.operator.open_id"),
        message_id=_required_str(context, "event.context.open_message_id"),
        union_id=_optional_str(operator, "union_id"),
        user_id=_optional_str(operator, "user_id"),
        chat_id=_optional_str(context, "open_chat_id"),
        tenant_key=_optional_str(header, "tenant_key") or _optional_str(operator, "tenant_key"),
        tag=_optional_str(action, "tag"),
        name=_optional_str(action, "name"),
        value=_optional_object(action, "value", "event.action.value"),
        form_value=_optional_object(action, "form_value", "event.action.form_value"),
        input_value=_optional_str(action, "input_value"),
        option=_optional_str(action, "option"),
        options=_string_tuple(action.get("options"), "event.action.options"),
        checked=action.get("checked") if isinstance(action.get("checked"), bool) else None,
        create_time=_create_time(payload),
    )


def render_reply(reply: CallbackReply, locales: tuple[str, ...]) -> dict[str, Any]:
    """Feishu's callback response body: ``{"toast": {...}, "card": {"type": "raw", "data": card}}``."""
    if reply.rendered is not None:
        return dict(reply.rendered)
    body: dict[str, Any] = {}
    if reply.text is not None:
        body["toast"] = render_toast(reply.toast_type, reply.text, locales)
    if reply.card is not None:
        body["card"] = {"type": "raw", "data": dict(reply.card)}
    return body


def render_toast(toast_type: ToastType, text: Text, locales: tuple[str, ...]) -> dict[str, Any]:
    """A toast in the card's first locale, plus per-viewer ``i18n`` for Feishu's locale codes."""
    toast: dict[str, Any] = {"type": toast_type, "content": translate(text, locales[0])}
    feishu_locales = tuple(code for code in locales if code in FEISHU_LOCALES)
    if feishu_locales:
        toast["i18n"] = i18n_map(text, feishu_locales)
    return toast


# ---- steps of parse_callback -------------------------------------------------------------------------


def _utf8(text: str) -> bytes:
    # surrogatepass: a lone surrogate from a JSON escape or a header must not raise, only mismatch.
    return text.encode("utf-8", "surrogatepass")


def _secret(value: Any) -> str:
    return str(value.get_secret_value()) if value is not None else ""


def _load_object(data: bytes, what: str) -> dict[str, Any]:
    try:
        loaded = json.loads(data)
    except (ValueError, RecursionError) as exc:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise CallbackRejected(400, f"{what} is not valid JSON") from exc
    if not isinstance(loaded, dict):
        raise CallbackRejected(400, f"{what} is not a JSON object")
    return loaded


def _decrypted_payload(encrypted: Any, encrypt_key: str) -> dict[str, Any]:
    if not encrypt_key:
        raise CallbackRejected(400, "encrypted callback but no Encrypt Key is configured")
    if not isinstance(encrypted, str):
        raise CallbackRejected(400, "encrypt is not a string")
    plaintext = decrypt(encrypt_key, encrypted)
    try:
        return _load_object(plaintext, "decrypted body")
    except CallbackRejected as rejected:
        raise CallbackRejected(400, UNDECRYPTABLE) from rejected


def _has_signature(headers: Mapping[str, str]) -> bool:
    return any(name in headers for name in (TIMESTAMP_HEADER, NONCE_HEADER, SIGNATURE_HEADER))


def _check_signature(raw_body: bytes, headers: Mapping[str, str], encrypt_key: str) -> None:
    timestamp = headers.get(TIMESTAMP_HEADER)
    nonce = headers.get(NONCE_HEADER)
    signature = headers.get(SIGNATURE_HEADER)
    if timestamp is None or nonce is None or signature is None:
        raise CallbackRejected(401, "missing signature headers")
    if not verify_signature(raw_body, timestamp, nonce, signature, encrypt_key):
        raise CallbackRejected(401, "invalid signature")


def _check_token(payload: Mapping[str, Any], expected: str) -> None:
    if not expected:
        return
    header = payload.get("header")
    token = header.get("token") if isinstance(header, dict) else payload.get("token")
    if not isinstance(token, str) or not hmac.compare_digest(_utf8(token), _utf8(expected)):
        raise CallbackRejected(401, "invalid verification token")


def _url_verification(payload: Mapping[str, Any]) -> UrlVerification:
    challenge = payload.get("challenge")
    if not isinstance(challenge, str):
        raise CallbackRejected(400, "url_verification without a challenge")
    return UrlVerification(challenge)


def _check_event_type(payload: Mapping[str, Any]) -> None:
    header = payload.get("header")
    if not isinstance(header, dict):
        kind = payload.get("type") or "a schema 1.0 body"
        raise CallbackRejected(
            400, f"unsupported callback: {str(kind)[:64]} (expected {CARD_ACTION_TRIGGER})"
        )
    event_type = header.get("event_type")
    if event_type != CARD_ACTION_TRIGGER:
        raise CallbackRejected(400, f"unsupported event_type {str(event_type)[:64]!r}")


def _check_fresh(headers: Mapping[str, str], create_time: float | None, now: float, window: int) -> None:
    stamps: list[tuple[str, float]] = []
    if TIMESTAMP_HEADER in headers:
        stamps.append(("request timestamp", _header_seconds(headers[TIMESTAMP_HEADER])))
    if create_time is not None:
        stamps.append(("event create_time", create_time))
    if not stamps:
        raise CallbackRejected(401, "missing timestamp: no X-Lark-Request-Timestamp nor header.create_time")
    for name, stamp in stamps:
        if abs(now - stamp) > window:
            raise CallbackRejected(403, f"stale {name}: outside the {window} s window")


def _create_time(payload: Mapping[str, Any]) -> float | None:
    header = payload.get("header")
    raw = header.get("create_time") if isinstance(header, dict) else None
    return None if raw is None else _epoch_seconds(raw, "header.create_time", status=400)


def _header_seconds(raw: str) -> float:
    return _epoch_seconds(raw.strip(), "X-Lark-Request-Timestamp", status=401)


def _epoch_seconds(raw: Any, where: str, status: int) -> float:
    """Feishu sends epoch seconds, ms or µs as digits; the magnitude tells which."""
    text = str(raw) if isinstance(raw, str | int) and not isinstance(raw, bool) else ""
    if not _DIGITS.fullmatch(text):
        raise CallbackRejected(status, f"{where} is not an epoch timestamp")
    value = int(text)
    for threshold, divisor in ((10**17, 1e9), (10**14, 1e6), (10**11, 1e3)):
        if value >= threshold:
            return value / divisor
    return float(value)


def _object(parent: Mapping[str, Any], key: str, prefix: str = "") -> Mapping[str, Any]:
    value = parent.get(key)
    if not isinstance(value, dict):
        raise CallbackRejected(400, f"missing field {prefix}{key}")
    return value


def _optional_object(parent: Mapping[str, Any], key: str, where: str) -> Mapping[str, Any]:
    value = parent.get(key)
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise CallbackRejected(400, f"{where} must be an object")
    return value


def _required_str(parent: Mapping[str, Any], where: str) -> str:
    value = parent.get(where.rsplit(".", 1)[-1])
    if not isinstance(value, str) or not value:
        raise CallbackRejected(400, f"missing field {where}")
    return value


def _optional_str(parent: Mapping[str, Any], key: str) -> str | None:
    value = parent.get(key)
    return value if isinstance(value, str) else None


def _string_tuple(value: Any, where: str) -> tuple[str, ...]:
    if value is None:
        return ()
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        raise CallbackRejected(400, f"{where} must be a list of strings")
    return tuple(value)
