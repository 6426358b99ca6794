"""What the sandbox knows and decides: tokens, messages, limits, and every card it received.

The HTTP layer (server.py) only parses and answers; every rule lives here so tests can read it.
Limits and codes follow docs/feishu-platform.md §2, §3, §4, §6, §7. CardKit (card entities and
streaming) lives in cardkit.py, which builds on this module; its codes are listed here with the others.
"""

from __future__ import annotations

import itertools
import json
import logging
import math
import secrets
import time
import weakref
from collections import Counter, OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from feishu_progress.cards.validate import card_problems, element_count
from feishu_progress.sandbox.faults import Faults
from feishu_progress.sandbox.updates import UpdateLog

if TYPE_CHECKING:
    from feishu_progress.sandbox.cardkit import CardKit, CardKitRecord

log = logging.getLogger(__name__)

DAY = 86400.0
RECEIVE_ID_TYPES = frozenset({"open_id", "user_id", "union_id", "email", "chat_id"})

# Codes the sandbox answers with (feishu-platform.md).
OK = 0
INVALID_PARAM = 230001  # unknown message id / bad request parameter
FIELD_VALIDATION = 99992402
MESSAGE_RATE_LIMITED = 230020
GATEWAY_RATE_LIMITED = 99991400
RATE_LIMIT_CODES = frozenset({MESSAGE_RATE_LIMITED, GATEWAY_RATE_LIMITED})  # CardKit's per-card limit too
MESSAGE_EXPIRED = 230031
MESSAGE_RECALLED = 230011
MESSAGE_DELETED = 230110
CARD_TOO_LARGE = 230025
CARD_INVALID = 230099
TOO_MANY_ELEMENTS = 300305
IMAGE_TOO_LARGE = 234006
IMAGE_BAD_FORMAT = 234011
TOKEN_MISSING = 99991661
TOKEN_INVALID = 99991663
APP_SECRET_INVALID = 10014
# CardKit (feishu-platform.md §4).
CARD_NOT_FOUND = 200740
CARD_ENTITY_EXPIRED = 200750
UUID_CONFLICT = 200770
STREAM_TIMED_OUT = 200850  # the streaming window closed (10 min after it was last opened)
CARDKIT_CARD_TOO_LARGE = 200860
DUPLICATE_ELEMENT_ID = 300301
UPDATE_MULTI_FALSE = 300302
SCHEMA_NOT_2 = 300303
STREAMING_CLOSED = 300309
ELEMENT_NOT_STREAMABLE = 300310
# Sandbox guess: not in Feishu's CardKit code table; peers log it for an unknown element id
# ("not find elementID", Cheerwhy/hermes-lark-streaming #66).
ELEMENT_NOT_FOUND = 300313
SEQUENCE_NOT_INCREASING = 300317
MISSING_SCOPE = 99991672  # the app lacks cardkit:card:write
# Sandbox guess: Feishu documents 10 operations/s per card entity, not the code it answers with.
CARD_RATE_LIMITED = 230020
# Sandbox guess: "a card entity can be sent only once" has no documented code; sending an invalid
# card_id is reported by peers as 230099 / ErrCode 11310 (lark-coding-agent-bridge #163).
CARD_ALREADY_SENT = 230099

_CARD_VERDICT_CACHE_SIZE = 512


@dataclass(slots=True)
class SandboxConfig:
    """Every limit and window the sandbox enforces; ``math.inf`` lifts a rate limit."""

    app_id: str | None = None  # when set, the token endpoint checks app_id/app_secret
    app_secret: str | None = None
    # Ids it makes are om_<id_prefix>_000001...: two sandboxes playing two apps give distinct message ids,
    # as Feishu does (its ids are unique across apps).
    id_prefix: str = "sandbox"
    token_ttl: int = 7200
    token_reissue_below: float = 1800.0  # Feishu issues a new token when < 30 min are left
    per_message_qps: float = 5
    app_per_second: float = 50
    app_per_minute: float = 1000
    max_bytes: int = 30 * 1024
    max_elements: int = 200
    update_window_days: float = 14
    uuid_ttl: float = 3600
    max_image_bytes: int = 10 * 1024 * 1024
    time_scale: float = 1.0  # sandbox seconds per real second: 60 makes a minute pass in a second
    hang_cap_seconds: float = 60.0
    validate_cards: bool = True
    cardkit_scope: bool = True  # False: the app lacks cardkit:card:write, every CardKit call is 99991672
    cardkit_sequence_gaps: bool = True  # False: a sequence must be exactly one more than the last
    cardkit_streaming_window: float = 600.0  # streaming closes this long after it was last opened
    cardkit_per_card_qps: float = 10
    card_entity_days: float = 14
    max_stream_chars: int = 100_000
    # Added to the wall clock in every answer's Date header: a host whose clock is off (doctor's skew check).
    clock_offset_seconds: float = 0.0
    # /_sandbox/* (stats, reset, every message's update log): for tests and benchmarks only. The
    # sandbox a service runs in-process for sandbox mode has none: nothing unauthenticated beside it.
    test_endpoints: bool = True

    def unlimited(self) -> SandboxConfig:
        """The same config with every rate limit lifted (for benchmarks)."""
        return replace(
            self,
            per_message_qps=math.inf,
            app_per_second=math.inf,
            app_per_minute=math.inf,
            cardkit_per_card_qps=math.inf,
        )


@dataclass(frozen=True, slots=True)
class Answer:
    """An Open API answer: HTTP status, JSON body and extra headers."""

    status: int
    body: dict[str, Any]
    headers: dict[str, str] = field(default_factory=dict)

    @property
    def code(self) -> int:
        return int(self.body.get("code", self.status))


@dataclass(slots=True)
class SandboxMessage:
    """One message the sandbox holds, with every card it ever carried."""

    message_id: str
    chat_id: str
    sent_at: float
    history: list[tuple[float, dict[str, Any]]]
    parent_id: str | None = None
    in_thread: bool = False
    recalled: bool = False
    deleted: bool = False
    responses: Counter[int] = field(default_factory=Counter)
    patch_times: deque[float] = field(default_factory=deque)
    card_id: str | None = None  # set when the message shows a CardKit card entity
    cardkit: CardKitRecord | None = None  # that entity's accepted updates and last error
    last_error_code: int | None = (
        None  # the latest refusal of an update to this message (kept after a success)
    )

    @property
    def card(self) -> dict[str, Any]:
        """The latest card."""
        return self.history[-1][1]


class SlidingWindow:
    """At most ``limit`` events in any ``span`` seconds."""

    def __init__(self, limit: float, span: float) -> None:
        self._limit = limit
        self._span = span
        self._times: deque[float] = deque()

    def admit(self, now: float) -> float | None:
        """Record an event and return None, or return the seconds until one would be admitted."""
        if math.isinf(self._limit):
            return None
        times = self._times
        while times and times[0] <= now - self._span:
            times.popleft()
        if len(times) >= self._limit:
            return times[0] + self._span - now
        times.append(now)
        return None


def error(code: int, msg: str, status: int = 400, headers: dict[str, str] | None = None) -> Answer:
    """A Feishu-shaped error answer."""
    return Answer(status, {"code": code, "msg": msg, "error": {}}, headers or {})


def success(data: dict[str, Any] | None = None) -> Answer:
    """A Feishu-shaped success answer."""
    return Answer(200, {"code": OK, "msg": "success", "data": data or {}})


class SandboxState:
    """The sandbox's memory and rules. ``clock`` is real monotonic time unless a test injects one."""

    def __init__(self, config: SandboxConfig, clock: Callable[[], float] = time.monotonic) -> None:
        from feishu_progress.sandbox.cardkit import CardKit  # cardkit.py builds on this module

        self.config = config
        self._clock = clock
        self._origin = clock()
        self.faults = Faults(self.now)
        self.updates = UpdateLog(clock)  # every card update request, for multi-instance tests
        self.messages: dict[str, SandboxMessage] = {}
        self.images: dict[str, bytes] = {}
        self.tokens: dict[str, float] = {}  # token -> expiry (sandbox time)
        self.token_fetches = 0
        self.responses: Counter[int] = Counter()  # code -> how many answers carried it
        self.requests: Counter[str] = Counter()  # endpoint -> how many requests
        self.peers: set[tuple[str, int]] = set()  # distinct client (host, port) pairs seen
        self.connections = 0  # client connections that sent at least one request
        self._transports: weakref.WeakSet[object] = weakref.WeakSet()
        self._uuids: dict[str, tuple[str, float]] = {}
        self._app_limits: dict[str, tuple[SlidingWindow, SlidingWindow]] = {}
        self._verdicts: OrderedDict[str, Answer | dict[str, Any]] = OrderedDict()
        self._ids = itertools.count(1)
        # Called (synchronously, in the sandbox's thread) after every accepted or refused change to a
        # message: the preview page's live feed listens here. A listener must never block.
        self.listeners: list[Callable[[SandboxMessage], None]] = []
        self.cardkit: CardKit = CardKit(self)

    # --- change notifications -----------------------------------------------------------------

    def _notify(self, message: SandboxMessage) -> None:
        """Tell every listener that ``message`` changed; a failing listener never breaks the sandbox."""
        for listener in list(self.listeners):
            try:
                listener(message)
            except Exception:
                log.exception("sandbox listener %r failed on %s", listener, message.message_id)

    def note_refusal(self, message_id: str, code: int) -> None:
        """Record that an update of ``message_id`` was refused with ``code``, then notify."""
        message = self.messages.get(message_id)
        if message is None:
            return
        message.last_error_code = code
        self._notify(message)

    # --- time ---------------------------------------------------------------------------------

    def now(self) -> float:
        """Sandbox time in seconds: real (or injected) time, sped up by ``time_scale``."""
        return (self._clock() - self._origin) * self.config.time_scale

    def to_real_seconds(self, sandbox_seconds: float) -> float:
        """Convert a sandbox duration to what a client waits in real time."""
        return sandbox_seconds / self.config.time_scale

    # --- test controls ------------------------------------------------------------------------

    def age_message(self, message_id: str, days: float) -> None:
        """Pretend ``message_id`` was sent ``days`` earlier than it was."""
        self.messages[message_id].sent_at -= days * DAY

    def recall(self, message_id: str) -> None:
        """Recall a message: PATCHes then fail with 230011."""
        self.messages[message_id].recalled = True
        self._notify(self.messages[message_id])

    def delete(self, message_id: str) -> None:
        """Delete a message: PATCHes then fail with 230110."""
        self.messages[message_id].deleted = True
        self._notify(self.messages[message_id])

    def expire_tokens(self) -> None:
        """Invalidate every issued token (as if they all lived past their 2 hours)."""
        self.tokens.clear()

    def reset_stats(self) -> None:
        """Forget counters and peers (benchmarks take one measurement per run)."""
        self.responses.clear()
        self.requests.clear()
        self.peers.clear()
        self.connections = 0
        self._transports.clear()
        self.cardkit.counters.clear()
        self.updates.by_instance.clear()

    def note_connection(self, transport: object) -> None:
        """Count a client connection the first time one of its requests arrives."""
        if transport not in self._transports:
            self._transports.add(transport)
            self.connections += 1

    # --- tokens -------------------------------------------------------------------------------

    def issue_token(self, app_id: str, app_secret: str) -> Answer:
        """tenant_access_token/internal: the current token, or a new one when < 30 min are left."""
        if self.config.app_id is not None and (
            app_id != self.config.app_id or app_secret != (self.config.app_secret or "")
        ):
            return error(APP_SECRET_INVALID, "app secret invalid")
        self.token_fetches += 1
        now = self.now()
        live = [(expiry, token) for token, expiry in self.tokens.items() if expiry > now]
        if live and max(live)[0] - now >= self.config.token_reissue_below:
            expiry, token = max(live)
        else:
            token, expiry = f"t-sandbox-{secrets.token_hex(12)}", now + self.config.token_ttl
            self.tokens[token] = expiry
        remaining = int(expiry - now)
        return Answer(200, {"code": OK, "msg": "ok", "tenant_access_token": token, "expire": remaining})

    def check_token(self, authorization: str | None) -> Answer | None:
        """None when the bearer token is valid, else the 99991661/99991663 answer."""
        if not authorization or not authorization.startswith("Bearer ") or len(authorization) <= 7:
            return error(TOKEN_MISSING, "Missing access token for authorization.", status=400)
        expiry = self.tokens.get(authorization[7:])
        if expiry is None or expiry <= self.now():
            return error(TOKEN_INVALID, "Invalid access token for authorization.", status=401)
        return None

    # --- limits -------------------------------------------------------------------------------

    def app_limit(self, endpoint: str) -> Answer | None:
        """None if the app budget of ``endpoint`` admits one more call, else the gateway's 429."""
        windows = self._app_limits.get(endpoint)
        if windows is None:
            windows = (
                SlidingWindow(self.config.app_per_second, 1.0),
                SlidingWindow(self.config.app_per_minute, 60.0),
            )
            self._app_limits[endpoint] = windows
        now = self.now()
        for window in windows:
            wait = window.admit(now)
            if wait is not None:
                return self.gateway_limited(wait)
        return None

    def gateway_limited(self, sandbox_seconds: float) -> Answer:
        """HTTP 429 / 99991400 with ``x-ogw-ratelimit-reset`` in (real) seconds."""
        reset = self.to_real_seconds(max(sandbox_seconds, 0.0))
        header = str(math.ceil(reset)) if self.config.time_scale == 1 else f"{max(reset, 0.001):.3f}"
        return error(
            GATEWAY_RATE_LIMITED,
            "request trigger frequency limit",
            status=429,
            headers={"x-ogw-ratelimit-reset": header},
        )

    def _message_limit(self, message: SandboxMessage, now: float) -> Answer | None:
        qps = self.config.per_message_qps
        if math.isinf(qps):
            return None
        times = message.patch_times
        while times and times[0] <= now - 1.0:
            times.popleft()
        if len(times) >= qps:
            return error(MESSAGE_RATE_LIMITED, "The message triggers the frequency limit.")
        times.append(now)
        return None

    # --- cards --------------------------------------------------------------------------------

    def judge_card(self, content: object) -> Answer | dict[str, Any]:
        """The parsed card if Feishu would accept ``content``, else the error answer (memoised)."""
        if not isinstance(content, str):
            return error(
                CARD_INVALID, "Failed to create card content, ext=ErrCode: 200621; content must be a string"
            )
        verdict = self._verdicts.get(content)
        if verdict is None:
            verdict = self._judge_uncached(content)
            self._verdicts[content] = verdict
            if len(self._verdicts) > _CARD_VERDICT_CACHE_SIZE:
                self._verdicts.popitem(last=False)
        return verdict

    def _judge_uncached(self, content: str) -> Answer | dict[str, Any]:
        size = len(content.encode("utf-8"))
        if size > self.config.max_bytes:
            return error(
                CARD_TOO_LARGE,
                f"The message is too long: card content is {size} bytes, "
                f"the limit is {self.config.max_bytes} (30KB)",
            )
        try:
            card = json.loads(content)
        except ValueError:
            return error(CARD_INVALID, "Failed to create card content, ext=ErrCode: 200621; invalid JSON")
        if not isinstance(card, dict):
            return error(CARD_INVALID, "Failed to create card content, ext=ErrCode: 200621; not an object")
        count = element_count(card)
        if count > self.config.max_elements:
            return error(
                TOO_MANY_ELEMENTS, f"card has {count} elements, the limit is {self.config.max_elements}"
            )
        problems = card_problems(card) if self.config.validate_cards else []
        if problems:
            return error(
                CARD_INVALID,
                "Failed to create card content, ext=ErrCode: 200861; ErrMsg: " + "; ".join(problems)[:1000],
            )
        return card

    # --- messages -----------------------------------------------------------------------------

    def send(
        self,
        receive_id_type: str | None,
        body: dict[str, Any],
        parent: SandboxMessage | None = None,
        endpoint: str = "send",
    ) -> Answer:
        """Create a card message (``send`` or ``reply``), deduplicated by uuid for an hour."""
        invalid = self._invalid_send(receive_id_type, body, parent)
        if invalid is not None:
            return invalid
        limited = self.app_limit(endpoint)
        if limited is not None:
            return limited
        now = self.now()
        uuid = body.get("uuid")
        if isinstance(uuid, str) and uuid:
            seen = self._uuids.get(uuid)
            if seen is not None and now - seen[1] < self.config.uuid_ttl:
                return success(self._message_data(self.messages[seen[0]]))
        # A card entity sent by reference shows its current card; anything else is a card JSON.
        card_id = self.cardkit.referenced_card_id(body.get("content"))
        verdict = self.cardkit.sendable(card_id) if card_id else self.judge_card(body.get("content"))
        if isinstance(verdict, Answer):
            return verdict
        message = self._new_message(body, receive_id_type, parent, verdict, now)
        if card_id:
            self.cardkit.attach(card_id, message)
        if isinstance(uuid, str) and uuid:
            self._uuids[uuid] = (message.message_id, now)
        return success(self._message_data(message))

    def _invalid_send(
        self, receive_id_type: str | None, body: dict[str, Any], parent: SandboxMessage | None
    ) -> Answer | None:
        if parent is None and receive_id_type not in RECEIVE_ID_TYPES:
            return error(FIELD_VALIDATION, f"field validation failed: receive_id_type {receive_id_type!r}")
        if parent is None and not body.get("receive_id"):
            return error(FIELD_VALIDATION, "field validation failed: receive_id is required")
        if body.get("msg_type") != "interactive":
            return error(INVALID_PARAM, "the sandbox only accepts msg_type interactive")
        uuid = body.get("uuid")
        if isinstance(uuid, str) and len(uuid) > 50:
            return error(FIELD_VALIDATION, "field validation failed: uuid longer than 50 characters")
        if parent is not None:
            return self._unusable(parent)
        return None

    def _new_message(
        self,
        body: dict[str, Any],
        receive_id_type: str | None,
        parent: SandboxMessage | None,
        card: dict[str, Any],
        now: float,
    ) -> SandboxMessage:
        message_id = f"om_{self.config.id_prefix}_{next(self._ids):06d}"
        if parent is not None:
            chat_id = parent.chat_id
        else:
            receive_id = str(body["receive_id"])
            chat_id = receive_id if receive_id_type == "chat_id" else f"oc_p2p_{receive_id}"
        message = SandboxMessage(
            message_id,
            chat_id,
            now,
            [(now, card)],
            parent_id=parent.message_id if parent else None,
            in_thread=bool(body.get("reply_in_thread")),
        )
        self.messages[message_id] = message
        self._notify(message)
        return message

    def _message_data(self, message: SandboxMessage) -> dict[str, Any]:
        return {
            "message_id": message.message_id,
            "chat_id": message.chat_id,
            "msg_type": "interactive",
            "parent_id": message.parent_id or "",
            "create_time": str(int(message.sent_at * 1000)),
        }

    def reply(self, message_id: str, body: dict[str, Any]) -> Answer:
        """Reply to a message with a card."""
        parent = self.messages.get(message_id)
        if parent is None:
            return error(INVALID_PARAM, f"invalid message_id {message_id}")
        return self.send(None, body, parent=parent, endpoint="reply")

    def patch(self, message_id: str, body: dict[str, Any]) -> Answer:
        """PATCH a card message, enforcing the gateway, message-state, per-message and card rules."""
        answer = self._patch(message_id, body)
        if answer.code != OK:
            self.note_refusal(message_id, answer.code)
        elif message_id in self.messages:
            self._notify(self.messages[message_id])
        return answer

    def _patch(self, message_id: str, body: dict[str, Any]) -> Answer:
        limited = self.app_limit("patch")
        if limited is not None:
            return limited
        message = self.messages.get(message_id)
        if message is None:
            return error(INVALID_PARAM, f"invalid message_id {message_id}")
        now = self.now()
        refused = self._unusable(message) or self._message_limit(message, now)
        if refused is not None:
            return refused
        verdict = self.judge_card(body.get("content"))
        if isinstance(verdict, Answer):
            return verdict
        message.history.append((now, verdict))
        return success()

    def _unusable(self, message: SandboxMessage) -> Answer | None:
        if message.deleted:
            return error(MESSAGE_DELETED, "The message was deleted.")
        if message.recalled:
            return error(MESSAGE_RECALLED, "The message was recalled.")
        if self.now() - message.sent_at > self.config.update_window_days * DAY:
            return error(MESSAGE_EXPIRED, "Message has expired when updating message.")
        return None

    def upload_image(self, image_type: str | None, data: bytes | None) -> Answer:
        """im/v1/images: stores the bytes and returns an image_key."""
        limited = self.app_limit("image")
        if limited is not None:
            return limited
        if image_type != "message" or not data:
            return error(IMAGE_BAD_FORMAT, "image_type must be 'message' and the image must not be empty")
        if len(data) > self.config.max_image_bytes:
            return error(IMAGE_TOO_LARGE, f"image is {len(data)} bytes, over the 10M limit")
        image_key = f"img_{self.config.id_prefix}_{next(self._ids):06d}"
        self.images[image_key] = data
        return success({"image_key": image_key})

    def rate_limited(self) -> int:
        """How many answers were a rate limit (per message or card, or the app's gateway budget)."""
        return sum(self.responses[code] for code in RATE_LIMIT_CODES)

    def record(self, answer: Answer, message_id: str | None = None) -> None:
        """Count the answer's code (globally and on the message) for inspection."""
        self.responses[answer.code] += 1
        message = self.messages.get(message_id) if message_id else None
        if message is not None:
            message.responses[answer.code] += 1
