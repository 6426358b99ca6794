"""The Feishu checks of one app: tenant token, scopes, clock skew, rate-limit headroom.

Everything is a function of one app's ``FeishuSettings`` so that several apps can be checked in a loop.
The probes are harmless: a PATCH of a message id that cannot exist (answers "scope missing" when the
scope is missing, "unknown message" otherwise), a 1x1 image upload, a CardKit create of an empty card
(never sent, it expires on its own after 14 days). No message is sent to anyone.
"""

from __future__ import annotations

import json
import struct
import time
import zlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from email.utils import parsedate_to_datetime
from typing import Any

import aiohttp

from feishu_progress.config import FeishuSettings
from feishu_progress.doctor.checks import Check, Status, fail, ok, warn
from feishu_progress.doctor.meanings import CREDENTIALS_FIX, fix_for, meaning, scope_fix
from feishu_progress.feishu.client import CARDS_PATH, IMAGES_PATH, MESSAGES_PATH, TOKEN_PATH
from feishu_progress.feishu.errors import CARDKIT_SCOPE_MISSING, TOKEN_CODES

PROBE_MESSAGE_ID = "om_feishu_progress_doctor_probe"  # no real message id looks like this
SKEW_WARN_SECONDS = 30.0
CLOCK_FIX = "sync this host's clock: timedatectl set-ntp true (or chronyc makestep)"
RATE_HEADERS = ("x-ogw-ratelimit-limit", "x-ogw-ratelimit-reset")


@dataclass(frozen=True, slots=True)
class Answer:
    """One probe's answer: HTTP status (0: none), Feishu code (None: none), timing and headers."""

    status: int
    code: int | None
    msg: str
    elapsed_ms: float
    headers: Mapping[str, str] = field(default_factory=dict)
    data: Mapping[str, Any] = field(default_factory=dict)


class Probe:
    """Raw Open API calls that keep the answer's headers (the client keeps only the data)."""

    def __init__(self, session: aiohttp.ClientSession, base_url: str) -> None:
        self._session = session
        self._base_url = base_url.rstrip("/")
        self.answers: list[Answer] = []

    async def call(
        self, method: str, path: str, *, token: str | None = None, body: Any = None, form: Any = None
    ) -> Answer:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        started = time.perf_counter()
        try:
            async with self._session.request(
                method, self._base_url + path, json=body, data=form, headers=headers
            ) as response:
                raw = await response.read()
                answer = _answer(response.status, raw, dict(response.headers), started)
        except (TimeoutError, aiohttp.ClientError) as exc:
            answer = Answer(0, None, f"{type(exc).__name__}: {exc}", _ms_since(started))
        self.answers.append(answer)
        return answer


async def check_app(
    app: FeishuSettings, *, needs_cardkit: bool, skew_fail_seconds: float, label: str = "feishu"
) -> list[Check]:
    """Every Feishu check of one app, in the order an operator fixes them."""
    timeout = aiohttp.ClientTimeout(total=app.timeout_seconds)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        probe = Probe(session, app.base_url)
        secret = app.app_secret.get_secret_value() if app.app_secret else ""
        answer = await probe.call("POST", TOKEN_PATH, body={"app_id": app.app_id or "", "app_secret": secret})
        checks = [_token_check(label, app, answer)]
        if answer.status == 0:
            return checks
        checks.append(_skew_check(label, answer, skew_fail_seconds))
        token = str(answer.data.get("tenant_access_token") or "")
        if checks[0].status is not Status.OK or not token:
            return checks
        checks.append(await _message_scope(label, probe, token))
        checks.append(await _image_scope(label, probe, token))
        checks.append(await _cardkit_scope(label, probe, token, needs_cardkit))
        checks.append(_headroom(label, probe.answers))
    return checks


def _token_check(label: str, app: FeishuSettings, answer: Answer) -> Check:
    name = f"{label}.token"
    if answer.status == 0:
        return fail(
            name,
            f"cannot reach {app.base_url}: {answer.msg}",
            "check FP_FEISHU__BASE_URL (https://open.feishu.cn; Lark: https://open.larksuite.com) and "
            "that this host reaches it over HTTPS (proxy, firewall)",
        )
    if answer.code != 0 or not answer.data.get("tenant_access_token"):
        return fail(
            name,
            f"tenant token refused for app {app.app_id}: {meaning(answer.code, answer.msg)}",
            fix_for(answer.code, answer.msg) if answer.code not in (None, 0) else CREDENTIALS_FIX,
        )
    return ok(name, f"tenant token issued for app {app.app_id} in {answer.elapsed_ms:.0f} ms")


def _skew_check(label: str, answer: Answer, fail_seconds: float) -> Check:
    name = f"{label}.clock"
    sent = answer.headers.get("Date")
    if not sent:
        return warn(name, "Feishu's answer had no Date header: clock skew not measured")
    try:
        skew = parsedate_to_datetime(sent).timestamp() - time.time()
    except (TypeError, ValueError):
        return warn(name, f"unreadable Date header {sent!r}: clock skew not measured")
    side = "behind" if skew > 0 else "ahead of"
    text = (
        f"this host's clock is {abs(skew):.0f} s {side} Feishu's" if round(skew) else "in step with Feishu's"
    )
    if abs(skew) > fail_seconds:
        return fail(
            name,
            f"{text}: past FP_CALLBACK__TIMESTAMP_WINDOW_SECONDS={fail_seconds:.0f}, every signed "
            "callback (card click) would be refused as stale",
            CLOCK_FIX,
        )
    if abs(skew) > SKEW_WARN_SECONDS:
        return warn(name, f"{text} (Date header, 1 s resolution)", CLOCK_FIX)
    return ok(name, f"{text} (within {SKEW_WARN_SECONDS:.0f} s)")


async def _message_scope(label: str, probe: Probe, token: str) -> Check:
    body = {"content": json.dumps({"schema": "2.0", "body": {"elements": []}})}
    answer = await probe.call("PATCH", f"{MESSAGES_PATH}/{PROBE_MESSAGE_ID}", token=token, body=body)
    return _scope_verdict(f"{label}.scope.im:message:send_as_bot", "im:message:send_as_bot", answer, True)


async def _image_scope(label: str, probe: Probe, token: str) -> Check:
    form = aiohttp.FormData()
    form.add_field("image_type", "message")
    form.add_field("image", tiny_png(), filename="doctor.png", content_type="image/png")
    answer = await probe.call("POST", IMAGES_PATH, token=token, form=form)
    return _scope_verdict(f"{label}.scope.im:resource", "im:resource", answer, True)


async def _cardkit_scope(label: str, probe: Probe, token: str, needed: bool) -> Check:
    # The smallest valid card (Feishu refuses one without elements); it is never sent, it only expires.
    card = {"schema": "2.0", "body": {"elements": [{"tag": "markdown", "content": "feishu-progress doctor"}]}}
    body = {"type": "card_json", "data": json.dumps(card)}
    answer = await probe.call("POST", CARDS_PATH, token=token, body=body)
    return _scope_verdict(f"{label}.scope.cardkit:card:write", "cardkit:card:write", answer, needed)


def _scope_verdict(name: str, scope: str, answer: Answer, needed: bool) -> Check:
    """Missing scope: fail (warn when the setting does not need it); any other answer means granted."""
    if answer.status == 0 or answer.code in TOKEN_CODES:
        return fail(
            name, f"probe failed: {meaning(answer.code, answer.msg)}", fix_for(answer.code, answer.msg)
        )
    if answer.code == CARDKIT_SCOPE_MISSING:
        detail = f"scope {scope} not granted ({answer.code})"
        if not needed:
            return warn(name, detail + ": FP_CARD__TRANSPORT=patch does not need it", scope_fix(scope))
        fix = scope_fix(scope)
        if scope == "cardkit:card:write":
            fix += "; or set FP_CARD__TRANSPORT=patch (whole-card updates, no typewriter text)"
        return fail(name, detail, fix)
    how = "accepted" if answer.code == 0 else f"answered {meaning(answer.code, answer.msg)}, as expected"
    return ok(name, f"granted: the probe was {how} in {answer.elapsed_ms:.0f} ms")


def _headroom(label: str, answers: list[Answer]) -> Check:
    name = f"{label}.rate_limit"
    limited = [answer for answer in answers if answer.status == 429]
    seen = {
        header: answer.headers[header]
        for answer in answers
        for header in RATE_HEADERS
        if header in answer.headers
    }
    if limited:
        reset = seen.get("x-ogw-ratelimit-reset", "?")
        return warn(
            name,
            f"rate limited right now ({len(limited)} probe(s) answered 429, reset in {reset} s): "
            "another process spends this app's budget",
            "run doctor again later; give each deployment its own app or lower FP_RATE__APP_PER_SECOND",
        )
    if not seen:
        return ok(name, "no rate-limit headers returned (Feishu sends x-ogw-ratelimit-* on some APIs only)")
    return ok(name, "headroom: " + ", ".join(f"{key}={value}" for key, value in sorted(seen.items())))


def tiny_png() -> bytes:
    """A valid 1x1 transparent PNG (the image-upload probe)."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    header = struct.pack(">IIBBBBB", 1, 1, 8, 6, 0, 0, 0)
    pixels = zlib.compress(b"\x00\x00\x00\x00\x00")
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", pixels) + chunk(b"IEND", b"")


def _answer(status: int, raw: bytes, headers: dict[str, str], started: float) -> Answer:
    try:
        payload = json.loads(raw) if raw else {}
    except ValueError:
        payload = {}
    payload = payload if isinstance(payload, dict) else {}
    code = payload.get("code")
    data = payload.get("data")
    # The token endpoint answers its fields at the top level, every other API under "data".
    fields = data if isinstance(data, dict) else payload
    msg = str(payload.get("msg") or f"HTTP {status}")
    return Answer(status, code if isinstance(code, int) else None, msg, _ms_since(started), headers, fields)


def _ms_since(started: float) -> float:
    return (time.perf_counter() - started) * 1000
