"""THE one place that maps Feishu errors to delivery decisions (ports.WriteOutcome).

Codes and their meanings come from docs/feishu-platform.md §2, §3, §4 (CardKit) and §7. Anything
not named here stops updating the card with the code and message recorded: an unknown failure is never
retried forever and never swallowed.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

from feishu_progress.errors import FeishuAPIError, FeishuTransportError
from feishu_progress.ports import OutcomeKind, WriteOutcome

log = logging.getLogger(__name__)

MESSAGE_RATE_LIMITED = 230020
GATEWAY_RATE_LIMITED = 99991400
TOKEN_INVALID = 99991663
TOKEN_MISSING = 99991661
TOKEN_CODES = frozenset({TOKEN_INVALID, TOKEN_MISSING})

# CardKit (card entities, streamed text).
CARDKIT_SCOPE_MISSING = 99991672  # the app lacks cardkit:card:write: use PATCH, ask again later
CARD_IN_INTERACTION = 200810  # a user is interacting with the card right now: try again shortly
STREAM_TIMED_OUT = 200850  # Feishu closed streaming 10 minutes after it was opened
STREAMING_CLOSED = 300309
# Streaming is off (closed by the window, or never opened): re-open it once and send the newest text.
STREAM_CLOSED_CODES = frozenset({STREAM_TIMED_OUT, STREAMING_CLOSED})
CARD_IN_INTERACTION_RETRY_SECONDS = 0.5
# A write the card refuses for now but a later write with a new sequence and uuid may pass.
CARDKIT_TRANSIENT: dict[int, str] = {
    200770: "uuid reused with another body",
    300317: "sequence not above the card's last (another writer?)",
    300120: "CardKit internal error",
}

# The card can no longer be edited: the reason is what the scheduler records.
STOP_REASONS: dict[int, str] = {
    230031: "message older than 14 days",
    230011: "message recalled",
    230110: "message deleted",
    200740: "card entity not found",
    200750: "card entity older than 14 days",
    300311: "this app may not update the card entity",
    CARDKIT_SCOPE_MISSING: "the app lost the CardKit scope (cardkit:card:write)",
}
# The card itself is refused: resend a minimal card instead of the full one.
DEGRADE_REASONS: dict[int, str] = {
    230025: "card over 30 KB",
    19036: "card over 30 KB",
    230099: "card rejected as invalid",
    300305: "card has too many elements",
    11310: "card could not be built (too many elements)",
    200860: "card entity over 30 KB",
    300302: "card entity refused update_multi",
    300301: "duplicate element_id in card",
    300303: "card entity needs schema 2.0",
    300310: "streamed element is not a text element",
}

DEFAULT_MESSAGE_RETRY_SECONDS = 0.25
DEFAULT_GATEWAY_RESET_SECONDS = 1.0
HTTP_TOO_MANY_REQUESTS = 429
HTTP_SERVER_ERROR = 500


def classify(exc: BaseException, *, message_interval: float = DEFAULT_MESSAGE_RETRY_SECONDS) -> WriteOutcome:
    """Turn a failed Open API call into what the delivery scheduler should do next."""
    if isinstance(exc, FeishuTransportError):
        return WriteOutcome(OutcomeKind.BACKOFF, reason=f"transport: {exc}")
    if not isinstance(exc, FeishuAPIError):
        return WriteOutcome(OutcomeKind.STOP, reason=f"unexpected {type(exc).__name__}: {exc}")
    return _classify_api_error(exc, message_interval)


def _classify_api_error(exc: FeishuAPIError, message_interval: float) -> WriteOutcome:
    code = exc.code
    if code == MESSAGE_RATE_LIMITED:
        return WriteOutcome(
            OutcomeKind.RETRY_MESSAGE,
            retry_after=message_interval,
            code=code,
            reason="per-message rate limit",
        )
    if code == GATEWAY_RATE_LIMITED or exc.http_status == HTTP_TOO_MANY_REQUESTS:
        reset = exc.retry_after if exc.retry_after and exc.retry_after > 0 else DEFAULT_GATEWAY_RESET_SECONDS
        return WriteOutcome(OutcomeKind.PAUSE_APP, retry_after=reset, code=code, reason="app rate limit")
    if code == CARD_IN_INTERACTION:
        return WriteOutcome(
            OutcomeKind.RETRY_MESSAGE,
            retry_after=max(message_interval, CARD_IN_INTERACTION_RETRY_SECONDS),
            code=code,
            reason="card in an interaction",
        )
    if code in CARDKIT_TRANSIENT or code in STREAM_CLOSED_CODES:
        reason = CARDKIT_TRANSIENT.get(code, "streaming closed")
        return WriteOutcome(OutcomeKind.BACKOFF, code=code, reason=reason)
    if code in STOP_REASONS:
        return WriteOutcome(OutcomeKind.STOP, code=code, reason=STOP_REASONS[code])
    if code in DEGRADE_REASONS:
        return WriteOutcome(
            OutcomeKind.DEGRADE, code=code, reason=f"{DEGRADE_REASONS[code]}: {exc.msg}"[:300]
        )
    if exc.http_status >= HTTP_SERVER_ERROR:
        return WriteOutcome(OutcomeKind.BACKOFF, code=code, reason=f"server error {exc.http_status}")
    if code in TOKEN_CODES:
        # The client already refreshed and retried once: the token service is flaky, not the card.
        return WriteOutcome(OutcomeKind.BACKOFF, code=code, reason="token rejected after refresh")
    return WriteOutcome(OutcomeKind.STOP, code=code, reason=f"Feishu {code}: {exc.msg}"[:300])


def retry_delay(exc: BaseException) -> float | None:
    """For a call that is not a card delivery (send, reply, image upload): seconds to wait before trying
    the same request again, or None when trying again cannot help (a refused card, a bad id...).

    0.0 means "use the caller's backoff"; a rate limit says how long itself.
    """
    if isinstance(exc, FeishuTransportError):
        return 0.0
    if not isinstance(exc, FeishuAPIError):
        return None
    if exc.code == GATEWAY_RATE_LIMITED or exc.http_status == HTTP_TOO_MANY_REQUESTS:
        return exc.retry_after if exc.retry_after and exc.retry_after > 0 else DEFAULT_GATEWAY_RESET_SECONDS
    if exc.code == MESSAGE_RATE_LIMITED:  # five a second into one chat
        return DEFAULT_MESSAGE_RETRY_SECONDS
    if exc.http_status >= HTTP_SERVER_ERROR:
        return 0.0
    return None


def failed_write(
    exc: BaseException, what: str, *, message_interval: float, ids: Mapping[str, str]
) -> WriteOutcome:
    """A card write's failure, classified and logged once (``ids``: the message or card it was for)."""
    outcome = classify(exc, message_interval=message_interval)
    log.warning(
        "%s failed: %s",
        what,
        outcome.kind,
        extra={
            **ids,
            "code": outcome.code,
            "log_id": exc.log_id if isinstance(exc, FeishuAPIError) else "",
            "outcome": str(outcome.kind),
            "reason": outcome.reason,
        },
    )
    return outcome
