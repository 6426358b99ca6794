"""Card clicks as Feishu delivers them: a ``card.action.trigger`` body, encrypted and signed.

The demo and the end-to-end tests use this to click on cards through the real callback endpoint,
exactly as Feishu would (docs/feishu-platform.md §5).
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import uuid
from collections.abc import Mapping
from typing import Any

from cryptography.hazmat.primitives import padding
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes


def encrypt(encrypt_key: str, plaintext: bytes) -> str:
    """AES-256-CBC with key sha256(encrypt_key), a random IV prefixed, PKCS7; base64 of iv + ciphertext."""
    key = hashlib.sha256(encrypt_key.encode("utf-8")).digest()
    iv = os.urandom(16)
    padder = padding.PKCS7(128).padder()
    padded = padder.update(plaintext) + padder.finalize()
    encryptor = Cipher(algorithms.AES(key), modes.CBC(iv)).encryptor()
    return base64.b64encode(iv + encryptor.update(padded) + encryptor.finalize()).decode("ascii")


def card_action_payload(
    *,
    open_id: str,
    message_id: str,
    value: Mapping[str, Any],
    verification_token: str,
    now: float,
    chat_id: str | None = None,
    form_value: Mapping[str, Any] | None = None,
    click_token: str | None = None,
    event_id: str | None = None,
    button_name: str | None = None,
) -> dict[str, Any]:
    """A schema-2.0 ``card.action.trigger`` event for one click (or form submit).

    ``button_name`` is the clicked button's ``name`` (Feishu sends it; a form's submit button has one).
    """
    action: dict[str, Any] = {"tag": "button", "value": dict(value)}
    if form_value is not None:
        action["form_value"] = dict(form_value)
        action["name"] = "submit"
    if button_name:
        action["name"] = button_name
    context: dict[str, Any] = {"open_message_id": message_id}
    if chat_id:
        context["open_chat_id"] = chat_id
    return {
        "schema": "2.0",
        "header": {
            "event_id": event_id or uuid.uuid4().hex,
            "token": verification_token,
            "create_time": str(int(now * 1_000_000)),
            "event_type": "card.action.trigger",
            "tenant_key": "sandbox-tenant",
            "app_id": "cli_sandbox",
        },
        "event": {
            "operator": {"tenant_key": "sandbox-tenant", "open_id": open_id, "union_id": f"on_{open_id}"},
            "token": click_token or f"c-{uuid.uuid4().hex}",
            "action": action,
            "host": "im_message",
            "context": context,
        },
    }


def signed_request(
    payload: Mapping[str, Any], *, encrypt_key: str | None, now: float
) -> tuple[bytes, dict[str, str]]:
    """The HTTP body and headers Feishu would POST: encrypted and signed when an Encrypt Key is set."""
    plain = json.dumps(payload, ensure_ascii=False).encode("utf-8")
    headers = {"Content-Type": "application/json"}
    if not encrypt_key:
        return plain, headers
    body = json.dumps({"encrypt": encrypt(encrypt_key, plain)}).encode("utf-8")
    timestamp = str(int(now))
    nonce = uuid.uuid4().hex
    signature = hashlib.sha256((timestamp + nonce + encrypt_key).encode("utf-8") + body).hexdigest()
    headers.update(
        {
            "X-Lark-Request-Timestamp": timestamp,
            "X-Lark-Request-Nonce": nonce,
            "X-Lark-Signature": signature,
        }
    )
    return body, headers
