"""Builders shared by the callback tests: payloads, encryption, signatures, settings, fake handlers.

Encryption here uses pycryptodome (what lark-oapi uses), not the ``cryptography`` code under test.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import os
from typing import Any

from Crypto.Cipher import AES
from pydantic import SecretStr

from feishu_progress.config import CallbackSettings, CardSettings, FeishuSettings, Settings
from feishu_progress.feishu.callback import CallbackReply, CardActionEvent
from feishu_progress.i18n import Text

ENCRYPT_KEY = "kX9-encrypt-key-for-tests"
VERIFICATION_TOKEN = "v-token-for-tests"
WALL_NOW = 1_780_000_000.0


def make_settings(
    encrypt_key: str | None = ENCRYPT_KEY,
    verification_token: str | None = VERIFICATION_TOKEN,
    **callback: Any,
) -> Settings:
    """Settings with the given callback credentials, ignoring the environment."""
    return Settings(
        _env_file=None,
        feishu=FeishuSettings(
            encrypt_key=SecretStr(encrypt_key) if encrypt_key is not None else None,
            verification_token=SecretStr(verification_token) if verification_token is not None else None,
        ),
        card=CardSettings(locales=("zh_cn", "en_us")),
        callback=CallbackSettings(**callback),
    )


def card_action_payload(
    event_id: str = "ev-1",
    callback_token: str = "c-token-1",
    token: str = VERIFICATION_TOKEN,
    create_time: float = WALL_NOW,
    value: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """A schema 2.0 ``card.action.trigger`` body like Feishu sends it (create_time in µs)."""
    return {
        "schema": "2.0",
        "header": {
            "event_id": event_id,
            "token": token,
            "create_time": str(int(create_time * 1_000_000)),
            "event_type": "card.action.trigger",
            "tenant_key": "tenant-1",
            "app_id": "cli_test",
        },
        "event": {
            "operator": {"tenant_key": "tenant-1", "user_id": "u1", "open_id": "ou_1", "union_id": "on_1"},
            "token": callback_token,
            "action": {
                "value": value if value is not None else {"v": 1, "action": "cancel", "session_id": 42},
                "tag": "button",
                "name": "submit",
                "form_value": {"q1": "yes", "q2": ["a", "b"]},
            },
            "host": "im_message",
            "context": {"open_message_id": "om_1", "open_chat_id": "oc_1"},
        },
    }


def url_verification_payload(challenge: str = "ch-123", token: str = VERIFICATION_TOKEN) -> dict[str, Any]:
    return {"challenge": challenge, "token": token, "type": "url_verification"}


def encrypt(encrypt_key: str, plaintext: bytes, iv: bytes | None = None) -> str:
    """Feishu's encryption: base64(iv + AES-256-CBC(sha256(key), iv, PKCS7(plaintext))); a random
    ``iv`` unless one is given (a test whose outcome must not depend on chance)."""
    iv = os.urandom(16) if iv is None else iv
    pad = 16 - len(plaintext) % 16
    cipher = AES.new(hashlib.sha256(encrypt_key.encode()).digest(), AES.MODE_CBC, iv)
    return base64.b64encode(iv + cipher.encrypt(plaintext + bytes([pad]) * pad)).decode()


def encrypted_body(payload: dict[str, Any], encrypt_key: str = ENCRYPT_KEY) -> bytes:
    return json.dumps({"encrypt": encrypt(encrypt_key, json.dumps(payload).encode())}).encode()


def signed_headers(
    raw_body: bytes, encrypt_key: str = ENCRYPT_KEY, timestamp: float = WALL_NOW, nonce: str = "n0nce"
) -> dict[str, str]:
    """Feishu's request headers, signed as sha256(ts + nonce + key + body)."""
    ts = str(int(timestamp))
    signature = hashlib.sha256((ts + nonce + encrypt_key).encode() + raw_body).hexdigest()
    return {
        "Content-Type": "application/json; charset=utf-8",
        "X-Lark-Request-Timestamp": ts,
        "X-Lark-Request-Nonce": nonce,
        "X-Lark-Signature": signature,
    }


class RecordingHandler:
    """An ActionHandler that records events and answers a fixed reply (or raises / waits)."""

    def __init__(
        self,
        text: Text | None = "ok",
        card: dict[str, Any] | None = None,
        error: Exception | None = None,
        gate: asyncio.Event | None = None,
    ) -> None:
        self.events: list[CardActionEvent] = []
        self.finished = 0  # handle() calls that ran to the end (a cancelled one never does)
        self._reply = CallbackReply("success", text, card)
        self._error = error
        self._gate = gate

    async def handle(self, event: CardActionEvent) -> CallbackReply:
        self.events.append(event)
        if self._gate is not None:
            await self._gate.wait()
        if self._error is not None:
            raise self._error
        self.finished += 1
        return self._reply
