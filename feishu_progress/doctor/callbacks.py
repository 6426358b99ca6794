"""Can Feishu reach the service, for each app? Webhook mode: a URL-verification challenge posted to
FP_PUBLIC_URL + the app's callback route (``/feishu/callback`` for the default app,
``/feishu/callback/<name>`` for another app of FP_APPS_FILE); long-connection mode: one connection opened
(endpoint discovery, then the websocket) and closed. Checks are named ``callbacks.*`` for the default app,
``callbacks.<name>.*`` for another.

The challenge is built as Feishu builds it (encrypted and signed when an Encrypt Key is set), so an
answer proves the keys match too. It is sent from this host, not from Feishu's network: a URL that
only resolves inside your network passes here and still fails for Feishu.
"""

from __future__ import annotations

import json
import secrets
import time
from dataclasses import dataclass

import aiohttp

from feishu_progress.config import DEFAULT_APP, FeishuSettings, Settings
from feishu_progress.doctor.checks import Check, app_label, fail, ok, warn
from feishu_progress.doctor.meanings import CREDENTIALS_FIX, meaning
from feishu_progress.sandbox.clicks import signed_request
from feishu_progress.web.callbacks import callback_path

FEISHU_DEADLINE_MS = 1000.0  # Feishu wants the challenge answered within 1 s
WS_ENDPOINT_PATH = "/callback/ws/endpoint"
NAME = "callbacks"
CONSOLE_PAGE = (
    "developer console → your app → 事件与回调 (Events & Callbacks) → 回调配置 (Callback Configuration)"
)


async def callback_checks(settings: Settings, app: str, feishu: FeishuSettings) -> list[Check]:
    """The callback check of ``app`` (its name) with its ``feishu`` settings: keys, mode, credentials."""
    if feishu.sandbox:
        return []
    label = app_label(NAME, app)
    if feishu.mode == "ws":
        return [await _long_connection(label, feishu)]
    path = callback_path(app)
    if settings.public_url is None:
        return [
            warn(
                f"{label}.webhook",
                "FP_PUBLIC_URL is not set: cannot check that Feishu reaches the callback endpoint",
                "set FP_PUBLIC_URL to the https URL at which Feishu reaches this service (its "
                f"{path} goes into the {CONSOLE_PAGE} 请求地址)",
            )
        ]
    return [await _challenge(_Target(label, app, feishu, settings.public_url + path))]


@dataclass(frozen=True, slots=True)
class _Target:
    """One app's webhook: the check's name, the app, its keys and the URL Feishu posts to."""

    label: str
    app: str
    feishu: FeishuSettings
    url: str

    @property
    def keys_setting(self) -> str:
        """Where the serving process reads this app's callback keys from."""
        if self.app == DEFAULT_APP:
            return "FP_FEISHU__ENCRYPT_KEY and FP_FEISHU__VERIFICATION_TOKEN"
        return (
            f"the variables [apps.{self.app}] encrypt_key_env and verification_token_env name (FP_APPS_FILE)"
        )


async def _challenge(target: _Target) -> Check:
    name, url = f"{target.label}.webhook", target.url
    challenge = secrets.token_hex(8)
    token = target.feishu.verification_token
    payload = {
        "challenge": challenge,
        "type": "url_verification",
        "token": token.get_secret_value() if token else "",
    }
    key = target.feishu.encrypt_key
    body, headers = signed_request(
        payload, encrypt_key=key.get_secret_value() if key else None, now=time.time()
    )
    started = time.perf_counter()
    try:
        async with (
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as session,
            session.post(url, data=body, headers=headers) as response,
        ):
            status, raw = response.status, await response.read()
    except (TimeoutError, aiohttp.ClientError) as exc:
        return fail(
            name,
            f"{url} is not reachable: {type(exc).__name__}: {exc}",
            "start feishu-progress serve, and make FP_PUBLIC_URL reach its FP_HTTP__PORT (DNS, reverse "
            f"proxy, firewall, TLS); the {CONSOLE_PAGE} 请求地址 must be {url}",
        )
    elapsed = (time.perf_counter() - started) * 1000
    return _challenge_verdict(target, (status, raw), challenge, elapsed)


def _challenge_verdict(target: _Target, answer: tuple[int, bytes], challenge: str, elapsed: float) -> Check:
    name, url = f"{target.label}.webhook", target.url
    status, raw = answer
    if status == 401:
        return fail(
            name,
            f"{url} refused the challenge (401): the serving process has other callback keys",
            f"give serve and doctor the same {target.keys_setting} as the {CONSOLE_PAGE} of this app "
            "(Encrypt Key, Verification Token)",
        )
    if status == 404 and target.app != DEFAULT_APP:
        return fail(
            name,
            f"{url} is not a callback route of the serving process (404): no webhook app {target.app!r}",
            f"give serve the same FP_APPS_FILE as doctor (with [apps.{target.app}] in mode webhook), "
            "and restart it",
        )
    try:
        answered = json.loads(raw).get("challenge") if status == 200 else None
    except (ValueError, AttributeError):
        answered = None
    if answered != challenge:
        return fail(
            name,
            f"{url} answered HTTP {status} without the challenge: something else serves this URL",
            f"route {callback_path(target.app)} on FP_PUBLIC_URL to feishu-progress serve (FP_HTTP__PORT)",
        )
    if elapsed > FEISHU_DEADLINE_MS:
        return warn(name, f"{url} answered the challenge in {elapsed:.0f} ms; Feishu gives up after 1 s")
    return ok(name, f"{url} answered the challenge in {elapsed:.0f} ms")


async def _long_connection(label: str, app: FeishuSettings) -> Check:
    name = f"{label}.long_connection"
    secret = app.app_secret.get_secret_value() if app.app_secret else ""
    url = app.base_url + WS_ENDPOINT_PATH
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=app.timeout_seconds)) as session:
            async with session.post(url, json={"AppID": app.app_id, "AppSecret": secret}) as response:
                answer = await response.json(content_type=None)
            code = answer.get("code") if isinstance(answer, dict) else None
            if code != 0:
                msg = str(answer.get("msg", "")) if isinstance(answer, dict) else ""
                return fail(
                    name,
                    f"endpoint discovery refused: {meaning(code, msg)}",
                    CREDENTIALS_FIX + "; "
                    f"and in the {CONSOLE_PAGE} choose 使用长连接接收回调 (long connection)",
                )
            async with session.ws_connect(str(answer["data"]["URL"])) as ws:
                await ws.close()
    except (TimeoutError, aiohttp.ClientError, KeyError, TypeError, ValueError) as exc:
        return fail(
            name,
            f"long connection not opened: {type(exc).__name__}: {exc}",
            "check FP_FEISHU__BASE_URL and that this host may open outbound websockets (wss, 443)",
        )
    return ok(name, "long connection opened and closed again")
