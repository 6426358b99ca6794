"""lark-oapi's EventDispatcherHandler as an independent oracle for our callback crypto.

What the SDK accepts we accept (and decrypt to the same JSON); what it refuses we refuse with the
right 4xx. Where we are stricter on purpose (stale timestamps: the SDK never checks them), the test
says so.
"""

from __future__ import annotations

import json
from typing import Any

import lark_oapi as lark  # ~5 s: imported once for this module
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from lark_oapi.core.utils import AESCipher
from lark_oapi.event.callback.model.p2_card_action_trigger import (
    P2CardActionTrigger,
    P2CardActionTriggerResponse,
)

from feishu_progress.errors import CallbackRejected
from feishu_progress.feishu.callback import CardActionEvent, UrlVerification, decrypt, parse_callback
from tests.test_callback_support import (
    ENCRYPT_KEY,
    VERIFICATION_TOKEN,
    WALL_NOW,
    card_action_payload,
    encrypt,
    encrypted_body,
    make_settings,
    signed_headers,
    url_verification_payload,
)


class Oracle:
    """Runs one raw request through lark-oapi and remembers what its card handler saw."""

    def __init__(self, encrypt_key: str = ENCRYPT_KEY, token: str = VERIFICATION_TOKEN) -> None:
        self.seen: list[P2CardActionTrigger] = []
        self._dispatcher = (
            lark.EventDispatcherHandler.builder(encrypt_key, token)
            .register_p2_card_action_trigger(self._record)
            .build()
        )

    def _record(self, data: P2CardActionTrigger) -> P2CardActionTriggerResponse:
        self.seen.append(data)
        return P2CardActionTriggerResponse({"toast": {"type": "info", "content": "ok"}})

    def accepts(self, raw: bytes, headers: dict[str, str]) -> bool:
        request = lark.RawRequest()
        request.uri = "/feishu/callback"
        request.headers = headers  # the SDK needs the canonical header case
        request.body = raw
        return bool(self._dispatcher.do(request).status_code == 200)


def _ours(raw: bytes, headers: dict[str, str], encrypt_key: str = ENCRYPT_KEY, now: float = WALL_NOW) -> Any:
    settings_ = make_settings(encrypt_key=encrypt_key)
    try:
        return parse_callback(raw, headers, settings_, now)
    except CallbackRejected as rejected:
        return rejected


def test_both_accept_a_signed_encrypted_click_and_see_the_same_event() -> None:
    oracle = Oracle()
    raw = encrypted_body(card_action_payload())
    headers = signed_headers(raw)
    assert oracle.accepts(raw, headers)
    ours = _ours(raw, headers)
    assert isinstance(ours, CardActionEvent)
    theirs = oracle.seen[0]
    assert theirs.header is not None and theirs.event is not None and theirs.event.action is not None
    assert (ours.event_id, ours.token, ours.value, ours.form_value) == (
        theirs.header.event_id,
        theirs.event.token,
        theirs.event.action.value,
        theirs.event.action.form_value,
    )


def test_we_decrypt_to_exactly_the_sdk_plaintext() -> None:
    ciphertext = json.loads(encrypted_body(card_action_payload()))["encrypt"]
    assert decrypt(ENCRYPT_KEY, ciphertext).decode() == AESCipher(ENCRYPT_KEY).decrypt_str(ciphertext)


def _tampered(raw: bytes, headers: dict[str, str]) -> tuple[bytes, dict[str, str]]:
    return raw.replace(b'{"encrypt": ', b'{"encrypt":'), headers


def _bad_signature(raw: bytes, headers: dict[str, str]) -> tuple[bytes, dict[str, str]]:
    return raw, headers | {"X-Lark-Signature": "0" * 64}


def _other_nonce(raw: bytes, headers: dict[str, str]) -> tuple[bytes, dict[str, str]]:
    return raw, headers | {"X-Lark-Request-Nonce": "another"}


@pytest.mark.parametrize("spoil", [_tampered, _bad_signature, _other_nonce])
def test_both_refuse_a_broken_signature_we_with_401(spoil: Any) -> None:
    raw = encrypted_body(card_action_payload())
    raw, headers = spoil(raw, signed_headers(raw))
    assert not Oracle().accepts(raw, headers)
    ours = _ours(raw, headers)
    assert (ours.status, ours.reason) == (401, "invalid signature")


def test_both_refuse_a_wrong_verification_token_we_with_401() -> None:
    raw = encrypted_body(card_action_payload(token="stolen"))
    headers = signed_headers(raw)
    assert not Oracle().accepts(raw, headers)
    ours = _ours(raw, headers)
    assert (ours.status, ours.reason) == (401, "invalid verification token")


def test_both_refuse_a_body_encrypted_with_another_key_we_with_400() -> None:
    raw = encrypted_body(card_action_payload(), encrypt_key="another key")
    headers = signed_headers(raw)
    assert not Oracle().accepts(raw, headers)
    ours = _ours(raw, headers)
    assert (ours.status, ours.reason) == (400, "encrypt cannot be decrypted")


def test_stale_timestamp_the_sdk_accepts_but_we_refuse() -> None:
    raw = encrypted_body(card_action_payload(create_time=WALL_NOW - 3600))
    headers = signed_headers(raw, timestamp=WALL_NOW - 3600)
    assert Oracle().accepts(raw, headers)  # lark-oapi has no replay window
    rejected = _ours(raw, headers)
    assert (rejected.status, "stale" in rejected.reason) == (403, True)


@pytest.mark.parametrize("encrypted", [False, True])
def test_url_verification_plain_and_encrypted_match_the_sdk(encrypted: bool) -> None:
    payload = url_verification_payload("challenge-42")
    raw = encrypted_body(payload) if encrypted else json.dumps(payload).encode()
    request = lark.RawRequest()
    request.uri, request.headers, request.body = "/feishu/callback", {}, raw
    response = Oracle()._dispatcher.do(request)
    assert json.loads(response.content) == {"challenge": "challenge-42"}
    assert _ours(raw, {}) == UrlVerification("challenge-42")


# A blank FP_FEISHU__ENCRYPT_KEY means "unset" (config.py), so keys have at least one visible character.
_keys = st.text(st.characters(codec="utf-8", exclude_categories=["Cs"]), min_size=1, max_size=40).filter(
    lambda key: key.strip() != ""
)
_words = st.text(st.characters(codec="utf-8", exclude_categories=["Cs"]), max_size=30)


@settings(max_examples=60, deadline=None)
@given(encrypt_key=_keys, action=_words, nonce=st.text(st.characters(min_codepoint=33, max_codepoint=126)))
def test_any_key_and_content_the_sdk_accepts_we_accept_identically(
    encrypt_key: str, action: str, nonce: str
) -> None:
    payload = card_action_payload(value={"v": 1, "action": action, "session_id": 7})
    raw = json.dumps(
        {"encrypt": encrypt(encrypt_key, json.dumps(payload, ensure_ascii=False).encode())}
    ).encode()
    headers = signed_headers(raw, encrypt_key=encrypt_key, nonce=nonce)
    assert Oracle(encrypt_key).accepts(raw, headers)
    ours = _ours(raw, headers, encrypt_key=encrypt_key)
    assert isinstance(ours, CardActionEvent)
    assert ours.value["action"] == action
