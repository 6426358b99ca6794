"""What a Feishu answer code means to an operator, and what to change (doctor and smoke print these)."""

from __future__ import annotations

from feishu_progress.feishu import errors

CONSOLE = "https://open.feishu.cn/app (Lark: https://open.larksuite.com/app)"
CREDENTIALS_FIX = (
    f"copy App ID and App Secret from the developer console {CONSOLE} → your app → 凭证与基础信息 "
    "(Credentials & Basic Info) into FP_FEISHU__APP_ID and FP_FEISHU__APP_SECRET"
)
APP_SECRET_INVALID = 10014
INVALID_PARAM = 10003

_MEANINGS: dict[int, str] = {
    APP_SECRET_INVALID: "app secret invalid: FP_FEISHU__APP_SECRET is not the secret of FP_FEISHU__APP_ID",
    INVALID_PARAM: "invalid parameter: FP_FEISHU__APP_ID or FP_FEISHU__APP_SECRET is empty or malformed",
    errors.TOKEN_INVALID: "tenant token invalid (expired or from another app)",
    errors.TOKEN_MISSING: "no tenant token sent",
    errors.GATEWAY_RATE_LIMITED: "app rate limit (per API, per app): wait x-ogw-ratelimit-reset seconds",
    errors.MESSAGE_RATE_LIMITED: "per-message/chat rate limit (5 writes a second)",
    errors.CARD_IN_INTERACTION: "a user is clicking the card right now",
    230002: "the bot is not in this chat",
    230001: "invalid request parameter (an unknown message or chat id)",
    99992402: "field validation failed (a malformed id or body)",
    **errors.CARDKIT_TRANSIENT,
    **errors.STOP_REASONS,
    **errors.DEGRADE_REASONS,
}


def scope_fix(scope: str) -> str:
    """Where a missing scope is granted, and that it needs a published version."""
    return (
        f"developer console {CONSOLE} → your app → 权限管理 (Permissions & Scopes) → enable {scope}, "
        "then 版本管理与发布 (Version Management) → publish a version (scopes apply once it is approved)"
    )


def meaning(code: int | None, msg: str = "") -> str:
    """A sentence for ``code`` (the answer's own message when the code is not one we know)."""
    if code is None:
        return f"no answer: {msg}" if msg else "no answer"
    if code == errors.CARDKIT_SCOPE_MISSING:
        return "the app lacks a scope: " + (msg or "see the answer")
    known = _MEANINGS.get(code)
    return f"{code}: {known}" if known else f"{code}: {msg or 'no message'}"


def fix_for(code: int | None, msg: str = "") -> str:
    """The change that makes ``code`` go away, or a pointer to the code's documentation."""
    if code is None:
        return "check FP_FEISHU__BASE_URL and that this host reaches it over HTTPS"
    if code in (APP_SECRET_INVALID, INVALID_PARAM):
        return CREDENTIALS_FIX
    if code == errors.CARDKIT_SCOPE_MISSING:
        scope = _scope_named(msg) or "the scope named in the answer"
        return scope_fix(scope)
    if code == 230002:
        return "add the bot to the chat (chat settings → 群机器人 / Bots → add)"
    if code in (errors.GATEWAY_RATE_LIMITED, errors.MESSAGE_RATE_LIMITED):
        return "wait and run again; lower FP_RATE__APP_PER_SECOND if serve shares the app with other tools"
    return "look the code up at https://open.feishu.cn/document/server-docs/api-call-guide/server-error-codes"


def _scope_named(msg: str) -> str | None:
    start, end = msg.find("["), msg.find("]")
    if 0 <= start < end:
        return msg[start + 1 : end].split(",", maxsplit=1)[0].strip() or None
    return None
