"""parse_callback, decrypt, verify_signature, dedupe and reply rendering, without the oracle."""

from __future__ import annotations

import base64
import hashlib
import json
from typing import Any

import pytest

from feishu_progress.errors import CallbackRejected
from feishu_progress.feishu.callback import (
    CallbackReply,
    CardActionEvent,
    MemoryDeduper,
    UrlVerification,
    decrypt,
    is_duplicate,
    parse_callback,
    render_reply,
    verify_signature,
)
from feishu_progress.i18n import Msg
from tests.fakes import FakeClock
from tests.test_callback_support import (
    ENCRYPT_KEY,
    WALL_NOW,
    card_action_payload,
    encrypt,
    encrypted_body,
    make_settings,
    signed_headers,
    url_verification_payload,
)


def _parse(raw: bytes, headers: dict[str, str] | None = None, now: float = WALL_NOW, **kw: Any) -> Any:
    return parse_callback(raw, signed_headers(raw) if headers is None else headers, make_settings(**kw), now)


def _rejection(raw: bytes, headers: dict[str, str] | None = None, **kw: Any) -> CallbackRejected:
    with pytest.raises(CallbackRejected) as caught:
        _parse(raw, headers, **kw)
    return caught.value


def test_encrypted_signed_click_becomes_a_card_action_event() -> None:
    event = _parse(encrypted_body(card_action_payload()))
    assert event == CardActionEvent(
        event_id="ev-1",
        token="c-token-1",
        open_id="ou_1",
        message_id="om_1",
        union_id="on_1",
        user_id="u1",
        chat_id="oc_1",
        tag="button",
        name="submit",
        value={"v": 1, "action": "cancel", "session_id": 42},
        form_value={"q1": "yes", "q2": ["a", "b"]},
        create_time=WALL_NOW,
        tenant_key="tenant-1",
    )


def test_header_names_are_case_insensitive() -> None:
    raw = encrypted_body(card_action_payload())
    lower = {name.lower(): value for name, value in signed_headers(raw).items()}
    assert isinstance(_parse(raw, lower), CardActionEvent)


def test_signature_is_checked_on_the_raw_bytes_not_the_json() -> None:
    raw = encrypted_body(card_action_payload())
    reformatted = json.dumps(json.loads(raw), indent=2).encode()  # same JSON, other bytes
    rejected = _rejection(reformatted, signed_headers(raw))
    assert (rejected.status, rejected.reason) == (401, "invalid signature")


@pytest.mark.parametrize("missing", ["X-Lark-Request-Timestamp", "X-Lark-Request-Nonce", "X-Lark-Signature"])
def test_missing_signature_header_is_401(missing: str) -> None:
    raw = encrypted_body(card_action_payload())
    headers = signed_headers(raw)
    del headers[missing]
    rejected = _rejection(raw, headers)
    assert (rejected.status, rejected.reason) == (401, "missing signature headers")


def test_wrong_token_is_401() -> None:
    raw = encrypted_body(card_action_payload(token="someone-else"))
    assert _rejection(raw).reason == "invalid verification token"


def test_plain_body_without_encrypt_key_checks_only_the_token() -> None:
    raw = json.dumps(card_action_payload()).encode()
    event = _parse(raw, {"Content-Type": "application/json"}, encrypt_key=None)
    assert isinstance(event, CardActionEvent)
    bad = json.dumps(card_action_payload(token="x")).encode()
    rejected = _rejection(bad, {}, encrypt_key=None)
    assert (rejected.status, rejected.reason) == (401, "invalid verification token")


def test_plain_body_with_encrypt_key_still_needs_the_signature() -> None:
    raw = json.dumps(card_action_payload()).encode()
    rejected = _rejection(raw, {})
    assert (rejected.status, rejected.reason) == (401, "missing signature headers")


@pytest.mark.parametrize("skew", [-301.0, 301.0])
def test_stale_request_timestamp_is_refused(skew: float) -> None:
    raw = encrypted_body(card_action_payload())
    rejected = _rejection(raw, signed_headers(raw, timestamp=WALL_NOW + skew))
    assert (rejected.status, "stale" in rejected.reason) == (403, True)


def test_stale_create_time_is_refused_even_with_a_fresh_header() -> None:
    raw = encrypted_body(card_action_payload(create_time=WALL_NOW - 3600))
    assert "stale event create_time" in _rejection(raw).reason


def test_timestamp_window_is_configurable() -> None:
    raw = encrypted_body(card_action_payload(create_time=WALL_NOW - 100))
    assert isinstance(_parse(raw), CardActionEvent)
    rejected = _rejection(raw, timestamp_window_seconds=60)
    assert (rejected.status, rejected.reason) == (403, "stale event create_time: outside the 60 s window")


@pytest.mark.parametrize(
    ("create_time", "seconds"),
    [
        ("1780000000", 1_780_000_000.0),
        ("1780000000123", 1_780_000_000.123),
        ("1780000000123456", 1_780_000_000.123456),
    ],
)
def test_create_time_unit_follows_its_magnitude(create_time: str, seconds: float) -> None:
    payload = card_action_payload()
    payload["header"]["create_time"] = create_time
    event = _parse(encrypted_body(payload))
    assert event.create_time == pytest.approx(seconds)


def test_an_altered_timestamp_header_fails_the_signature() -> None:
    raw = encrypted_body(card_action_payload())
    headers = signed_headers(raw) | {"X-Lark-Request-Timestamp": "yesterday"}
    rejected = _rejection(raw, headers)
    # The signature covers the timestamp, and it is checked first: an altered one fails there.
    assert (rejected.status, rejected.reason) == (401, "invalid signature")


def test_other_event_type_is_400_and_named() -> None:
    payload = card_action_payload()
    payload["header"]["event_type"] = "im.message.receive_v1"
    rejected = _rejection(encrypted_body(payload))
    assert (rejected.status, "im.message.receive_v1" in rejected.reason) == (400, True)


@pytest.mark.parametrize(
    ("path", "field"),
    [
        (("event", "operator", "open_id"), "event.operator.open_id"),
        (("event", "context", "open_message_id"), "event.context.open_message_id"),
        (("event", "token"), "event.token"),
        (("header", "event_id"), "header.event_id"),
        (("event", "action"), "event.action"),
    ],
)
def test_missing_required_field_is_400_and_named(path: tuple[str, ...], field: str) -> None:
    payload = card_action_payload()
    parent = payload
    for key in path[:-1]:
        parent = parent[key]
    del parent[path[-1]]
    rejected = _rejection(encrypted_body(payload))
    assert (rejected.status, rejected.reason) == (400, f"missing field {field}")


def test_value_that_is_not_an_object_is_400() -> None:
    payload = card_action_payload()
    payload["event"]["action"]["value"] = "cancel"
    assert _rejection(encrypted_body(payload)).reason == "event.action.value must be an object"


@pytest.mark.parametrize(
    "raw", [b"not json", b"[1, 2]", b"\xff\xfe\x00", b"[" * 100_000, b'{"encrypt": 5}', b'{"encrypt": "!!"}']
)
def test_malformed_bodies_are_400(raw: bytes) -> None:
    rejected = _rejection(raw)
    assert rejected.status == 400
    assert any(
        words in rejected.reason
        for words in (
            "is not valid JSON",
            "is not a JSON object",
            "encrypt is not",
            "cannot be decrypted",
            "ciphertext length",
        )
    ), rejected.reason


def test_body_over_the_limit_is_413_before_parsing() -> None:
    rejected = _rejection(b"x" * 101, max_body_bytes=100)
    assert (rejected.status, rejected.reason) == (413, "body too large")


def test_url_verification_plain_and_encrypted() -> None:
    plain = json.dumps(url_verification_payload("abc")).encode()
    assert _parse(plain, {}) == UrlVerification("abc")  # no signature headers needed
    assert _parse(encrypted_body(url_verification_payload("xyz")), {}) == UrlVerification("xyz")


def test_url_verification_with_wrong_token_is_401() -> None:
    plain = json.dumps(url_verification_payload("abc", token="nope")).encode()
    rejected = _rejection(plain, {})  # unsigned: the one answer every unsigned failure gets
    assert (rejected.status, rejected.reason) == (401, "missing signature headers")


def test_encrypted_body_without_a_configured_key_is_400() -> None:
    rejected = _rejection(encrypted_body(card_action_payload()), {}, encrypt_key=None)
    assert (rejected.status, rejected.reason) == (400, "encrypted callback but no Encrypt Key is configured")


def test_decrypt_with_the_wrong_key_is_400() -> None:
    # A fixed IV: with a random one, 1 in 256 wrong-key decryptions ends in valid padding by chance.
    with pytest.raises(CallbackRejected) as caught:
        decrypt("other key", encrypt(ENCRYPT_KEY, b'{"a": 1}' * 3, iv=bytes(16)))
    assert caught.value.status == 400


def test_every_failure_after_aes_has_one_reason_so_there_is_no_padding_oracle() -> None:
    bad_padding = encrypt("other key", b'{"a": 1}')
    not_json = encrypt(ENCRYPT_KEY, b"\x01\x02 not json")
    not_object = encrypt(ENCRYPT_KEY, b"[1]")
    unsigned = {
        (rejected.status, rejected.reason)
        for blob in (bad_padding, not_json, not_object, "!!", base64.b64encode(b"\x00" * 33).decode())
        for rejected in [_rejection(json.dumps({"encrypt": blob}).encode(), {})]
    }
    assert unsigned == {(401, "missing signature headers")}  # issue 26: nothing tells what AES made of it
    signed = {_rejection(json.dumps({"encrypt": blob}).encode()).reason for blob in (bad_padding, not_json)}
    assert signed == {"encrypt cannot be decrypted"}


@pytest.mark.parametrize("blob", [b"", b"\x00" * 16, b"\x00" * 33])
def test_decrypt_rejects_impossible_ciphertext_lengths(blob: bytes) -> None:
    with pytest.raises(CallbackRejected, match="length"):
        decrypt(ENCRYPT_KEY, base64.b64encode(blob).decode())


def test_decrypt_round_trips_feishu_encryption() -> None:
    assert (
        decrypt(ENCRYPT_KEY, encrypt(ENCRYPT_KEY, b"hello, \xe9\xa3\x9e\xe4\xb9\xa6"))
        == "hello, 飞书".encode()
    )


def test_verify_signature_matches_the_documented_formula() -> None:
    body = b'{"encrypt":"abc"}'
    good = hashlib.sha256(b"1700000000nonce" + ENCRYPT_KEY.encode() + body).hexdigest()
    assert verify_signature(body, "1700000000", "nonce", good, ENCRYPT_KEY)
    assert not verify_signature(body + b" ", "1700000000", "nonce", good, ENCRYPT_KEY)
    assert not verify_signature(body, "1700000000", "nonce", good, ENCRYPT_KEY + "x")
    assert not verify_signature(body, "1700000000", "\ud800", good, ENCRYPT_KEY)  # lone surrogate: no crash


async def test_deduper_refuses_a_key_within_the_ttl_and_forgets_it_after() -> None:
    clock = FakeClock()
    deduper = MemoryDeduper(ttl_seconds=60, now=clock.monotonic)
    assert await deduper.first_seen("a")
    assert not await deduper.first_seen("a")
    await clock.advance(61)
    assert await deduper.first_seen("a")


async def test_deduper_is_bounded_and_drops_the_oldest() -> None:
    deduper = MemoryDeduper(ttl_seconds=60, max_entries=3, now=FakeClock().monotonic)
    for key in "abcd":
        assert await deduper.first_seen(key)
    assert len(deduper) == 3
    assert await deduper.first_seen("a")  # evicted, so new again
    assert not await deduper.first_seen("d")


async def test_a_click_is_a_duplicate_if_its_event_id_or_its_token_was_seen() -> None:
    deduper = MemoryDeduper(ttl_seconds=60, now=FakeClock().monotonic)
    first = _parse(encrypted_body(card_action_payload("ev-1", "tok-1")))
    same_token = _parse(encrypted_body(card_action_payload("ev-2", "tok-1")))
    same_event = _parse(encrypted_body(card_action_payload("ev-1", "tok-3")))
    fresh = _parse(encrypted_body(card_action_payload("ev-4", "tok-4")))
    assert [await is_duplicate(deduper, e) for e in (first, same_token, same_event, fresh)] == [
        False,
        True,
        True,
        False,
    ]


def test_render_reply_builds_feishu_toast_and_raw_card() -> None:
    card = {"schema": "2.0", "body": {"elements": []}}
    body = render_reply(CallbackReply("success", "done", card), ("zh_cn", "en_us"))
    assert body == {
        "toast": {"type": "success", "content": "done", "i18n": {"zh_cn": "done", "en_us": "done"}},
        "card": {"type": "raw", "data": card},
    }


def test_render_reply_translates_messages_and_omits_absent_parts() -> None:
    body = render_reply(CallbackReply("info", Msg("no.such.key")), ("tr",))
    assert body == {"toast": {"type": "info", "content": "no.such.key"}}  # tr has no Feishu i18n code
    assert render_reply(CallbackReply(), ("zh_cn",)) == {}
