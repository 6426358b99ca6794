"""The sandbox preview page: every card the sandbox holds, drawn live in a browser, and clickable.

``mount_preview`` adds these routes to the service's public app, only when a sandbox exists (sandbox
mode, or the demo's own sandbox handed to ``create_app``):

* ``GET /`` leads to the page (302), so the service's bare address finds it;
* ``GET /sandbox/`` the page (``?token=<FP_API__TOKEN>`` once sets an HttpOnly cookie), and its static files;
* ``GET /sandbox/api/messages`` a JSON snapshot; ``GET /sandbox/api/events`` Server-Sent Events: the
  snapshot again, then every message the sandbox reports as changed (``SandboxState.listeners``);
* ``GET /sandbox/images/{image_key}`` the images uploaded to the sandbox;
* ``POST /sandbox/api/click`` a click on the page, turned into the ``card.action.trigger`` Feishu would
  send (signed and encrypted with the service's keys) and POSTed to the service's own callback URL;
  Feishu's answer (toast, card) goes back to the page.

The page lets a visitor click as anyone, so it exists only next to a sandbox, takes FP_API__TOKEN when
one is set, accepts clicks only as ``application/json`` from its own origin, and is served with a
strict Content-Security-Policy (no inline script). The renderer itself (static/preview.js) never puts
card text into HTML: card text is untrusted.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from importlib import resources
from typing import Any

import aiohttp
from aiohttp import web
from pydantic import SecretStr

from feishu_progress.sandbox.clicks import card_action_payload, signed_request
from feishu_progress.sandbox.state import SandboxMessage, SandboxState
from feishu_progress.web.callbacks import CALLBACK_PATH
from feishu_progress.web.http import Handler, HttpError, bearer_matches, json_error, read_json, token_matches

log = logging.getLogger(__name__)

PREFIX = "/sandbox"
COOKIE = "fp_sandbox_token"
DEFAULT_OPERATOR = "ou_sandbox_user"  # who clicks when the message belongs to no task we know
MAX_SHOWN_MESSAGES = 200  # the newest; a benchmark's sandbox can hold thousands
FEED_LIMIT = 256  # distinct changed messages waiting for one page before that page is dropped
WRITE_TIMEOUT_SECONDS = 5.0  # a page that does not read its stream for this long is dropped
HEARTBEAT_SECONDS = 15.0
# aiohttp does not cancel a handler whose client left: the stream looks at its connection this often.
DISCONNECT_CHECK_SECONDS = 1.0
RECONNECT_MS = 1000
MAX_CLICK_BODY = 64 * 1024
# Open event streams at once: a page per developer is a handful; each costs a task, a feed and a socket.
MAX_STREAMS = 32
CLICK_TIMEOUT_SECONDS = 10.0
STATIC_TYPES = {"index.html": "text/html", "preview.css": "text/css", "preview.js": "text/javascript"}
CSP = (
    "default-src 'self'; img-src 'self' data:; object-src 'none'; base-uri 'none'; "
    "form-action 'none'; frame-ancestors 'none'"
)
_OPERATOR = re.compile(r"^[A-Za-z0-9_.:@-]{1,100}$")
_IMAGE_TYPES = (
    (b"\x89PNG\r\n\x1a\n", "image/png"),
    (b"\xff\xd8\xff", "image/jpeg"),
    (b"GIF87a", "image/gif"),
    (b"GIF89a", "image/gif"),
)

StateLookup = Callable[[], SandboxState | None]
RequesterOf = Callable[[str], str | None]


@dataclass(frozen=True, slots=True)
class CallbackKeys:
    """What a click needs to look like Feishu's: the service's Encrypt Key and Verification Token."""

    encrypt_key: str | None
    verification_token: str | None


def _secret(value: SecretStr | None) -> str | None:
    return value.get_secret_value() if value is not None else None


def callback_keys(encrypt_key: SecretStr | None, verification_token: SecretStr | None) -> CallbackKeys:
    """The keys from the settings' secrets."""
    return CallbackKeys(_secret(encrypt_key), _secret(verification_token))


# --- the live feed -----------------------------------------------------------------------------


class MessageFeed:
    """One page's pending changes: message ids in a bounded set, so a burst of PATCHes is one event.

    ``push`` is the sandbox listener: it never blocks and never raises. A page that falls more than
    ``limit`` distinct messages behind is dropped (its EventSource reconnects and gets a fresh snapshot).
    """

    def __init__(self, limit: int = FEED_LIMIT) -> None:
        self._limit = limit
        self._pending: dict[str, None] = {}
        self._wake = asyncio.Event()
        self._loop = asyncio.get_running_loop()
        self._thread = threading.get_ident()
        self.closed = False
        self.overflowed = False

    def push(self, message: SandboxMessage) -> None:
        """Note that ``message`` changed (called by the sandbox, possibly from another thread)."""
        if threading.get_ident() == self._thread:
            self._add(message.message_id)
        else:
            self._loop.call_soon_threadsafe(self._add, message.message_id)

    def _add(self, message_id: str) -> None:
        if self.closed:
            return
        self._pending[message_id] = None
        if len(self._pending) > self._limit:
            self.overflowed = True
            self.close()
        self._wake.set()

    def close(self) -> None:
        """End the feed: the stream writer returns."""
        self.closed = True
        self._wake.set()

    async def next_batch(self, timeout: float) -> list[str]:
        """The ids changed since the last batch, in order; [] when ``timeout`` passed with none."""
        try:
            await asyncio.wait_for(self._wake.wait(), timeout)
        except TimeoutError:
            return []
        self._wake.clear()
        ids = list(self._pending)
        self._pending.clear()
        return ids


# --- the page and its endpoints ----------------------------------------------------------------


class PreviewPage:
    """The handlers, over a lazily found sandbox (it starts after the routes are frozen)."""

    def __init__(
        self,
        state_of: StateLookup,
        requester_of: RequesterOf,
        *,
        keys: CallbackKeys,
        api_token: SecretStr | None,
        wall: Callable[[], float],
    ) -> None:
        self._state_of = state_of
        self._requester_of = requester_of
        self._keys = keys
        self._token = api_token
        self._wall = wall
        self._feeds: set[MessageFeed] = set()
        self._http: aiohttp.ClientSession | None = None
        folder = resources.files("feishu_progress.sandbox") / "static"
        self._static = {name: (folder / name).read_bytes() for name in STATIC_TYPES}

    def routes(self) -> list[web.RouteDef]:
        guarded = self._guarded
        return [
            # Temporary (302): the same address serves no page once the service has Feishu credentials.
            web.get("/", self.lead_to_page),
            web.get(PREFIX, self.redirect),
            web.get(f"{PREFIX}/", self.page),
            web.get(PREFIX + "/static/{name}", guarded(self.static)),
            web.get(f"{PREFIX}/api/messages", guarded(self.messages)),
            web.get(f"{PREFIX}/api/events", guarded(self.events)),
            web.get(PREFIX + "/images/{image_key}", guarded(self.image)),
            web.post(f"{PREFIX}/api/click", guarded(self.click)),
        ]

    # -- access ---------------------------------------------------------------------------------

    def authorized(self, request: web.Request) -> bool:
        """No token configured, or the request carries it (bearer header or the page's cookie)."""
        if self._token is None:
            return True
        return bearer_matches(request, self._token) or token_matches(
            request.cookies.get(COOKIE, ""), self._token
        )

    def _guarded(self, handler: Handler) -> Handler:
        async def guarded(request: web.Request) -> web.StreamResponse:
            if not self.authorized(request):
                raise HttpError(
                    401, "unauthorized", "this page needs FP_API__TOKEN: open /sandbox/?token=<token> once"
                )
            return await handler(request)

        return guarded

    def _state(self) -> SandboxState:
        state = self._state_of()
        if state is None:
            raise HttpError(503, "unavailable", "the sandbox is not running (yet)", retry_after=1)
        return state

    # -- the page -------------------------------------------------------------------------------

    async def redirect(self, request: web.Request) -> web.StreamResponse:
        return web.Response(status=308, headers={"Location": _page_location(request)})

    async def lead_to_page(self, request: web.Request) -> web.StreamResponse:
        return web.Response(status=302, headers={"Location": _page_location(request)})

    async def page(self, request: web.Request) -> web.StreamResponse:
        token = request.query.get("token")
        if token is not None:
            if not token_matches(token, self._token):
                return json_error(401, "unauthorized", "wrong token")
            # The token leaves the address bar (and the history) at once: only the cookie keeps it.
            response = web.Response(status=303, headers={"Location": f"{PREFIX}/"})
            response.set_cookie(COOKIE, token, path=PREFIX, httponly=True, samesite="Strict")
            return response
        if not self.authorized(request):
            return web.Response(
                status=401, text="This page needs FP_API__TOKEN: open /sandbox/?token=<token> once.\n"
            )
        return self._file("index.html")

    async def static(self, request: web.Request) -> web.StreamResponse:
        name = request.match_info["name"]
        if name not in STATIC_TYPES or name == "index.html":
            raise HttpError(404, "not_found", f"no static file {name!r}")
        return self._file(name)

    def _file(self, name: str) -> web.Response:
        return web.Response(body=self._static[name], content_type=STATIC_TYPES[name], charset="utf-8")

    async def image(self, request: web.Request) -> web.StreamResponse:
        data = self._state().images.get(request.match_info["image_key"])
        if data is None:
            raise HttpError(404, "unknown_image", "the sandbox stores no image with that key")
        content_type = next(
            (kind for magic, kind in _IMAGE_TYPES if data.startswith(magic)), "application/octet-stream"
        )
        return web.Response(
            body=data, content_type=content_type, headers={"Cache-Control": "private, max-age=3600"}
        )

    # -- what the sandbox holds -------------------------------------------------------------------

    def message_view(self, state: SandboxState, message: SandboxMessage, order: int) -> dict[str, Any]:
        """One message as the page draws it."""
        return {
            "message_id": message.message_id,
            "order": order,
            "chat_id": message.chat_id,
            "parent_id": message.parent_id,
            "in_thread": message.in_thread,
            "sent_at": message.sent_at,
            "updates": len(message.history) - 1,
            "updated_at": message.history[-1][0],
            "last_error_code": message.last_error_code,
            "recalled": message.recalled,
            "deleted": message.deleted,
            "requester": self._requester_of(message.message_id),
            "card": message.card,
            # Which of the card's image keys the sandbox stores: the page draws the others as placeholders.
            "images": {key: key in state.images for key in image_keys(message.card)},
        }

    def snapshot(self, state: SandboxState) -> dict[str, Any]:
        """The newest messages, oldest first, and who may be picked as the clicking operator."""
        messages = list(state.messages.values())
        first = max(0, len(messages) - MAX_SHOWN_MESSAGES)
        views = [self.message_view(state, message, first + i) for i, message in enumerate(messages[first:])]
        operators = sorted({view["requester"] for view in views if view["requester"]} | {DEFAULT_OPERATOR})
        return {
            "messages": views,
            "hidden": first,
            "operators": operators,
            "signed": bool(self._keys.encrypt_key),
        }

    async def messages(self, request: web.Request) -> web.StreamResponse:
        return web.json_response(self.snapshot(self._state()))

    async def events(self, request: web.Request) -> web.StreamResponse:
        if len(self._feeds) >= MAX_STREAMS:  # 1,000 streams were once accepted, each held open
            return json_error(
                503, "unavailable", f"{MAX_STREAMS} preview streams are open already; retry", retry_after=5
            )
        state = self._state()
        feed = MessageFeed()
        self._feeds.add(feed)
        state.listeners.append(feed.push)
        response = web.StreamResponse(
            headers={
                "Content-Type": "text/event-stream",
                "Cache-Control": "no-store",
                "X-Accel-Buffering": "no",
            }
        )
        try:
            await response.prepare(request)
            await self._send(response, f"retry: {RECONNECT_MS}\n\n")
            await self._send(response, _event("snapshot", self.snapshot(state)))
            await self._stream(request, state, feed, response)
        except (ConnectionError, TimeoutError):
            log.info("preview page stream dropped (gone or too slow)")
        finally:
            state.listeners.remove(feed.push)
            self._feeds.discard(feed)
        return response

    async def _stream(
        self, request: web.Request, state: SandboxState, feed: MessageFeed, response: web.StreamResponse
    ) -> None:
        order = {message_id: i for i, message_id in enumerate(state.messages)}
        idle = 0.0
        while not feed.closed and request.transport is not None:
            changed = await feed.next_batch(DISCONNECT_CHECK_SECONDS)
            if feed.overflowed:
                log.warning("preview page fell %d messages behind: dropped, it will reconnect", FEED_LIMIT)
                return
            if not changed:
                idle += DISCONNECT_CHECK_SECONDS
                if idle >= HEARTBEAT_SECONDS:
                    await self._send(response, ": keep-alive\n\n")
                    idle = 0.0
                continue
            idle = 0.0
            for message_id in changed:
                message = state.messages.get(message_id)
                if message is None:
                    continue
                if message_id not in order:
                    order = {known: i for i, known in enumerate(state.messages)}
                view = self.message_view(state, message, order[message_id])
                await self._send(response, _event("update", view))

    async def _send(self, response: web.StreamResponse, text: str) -> None:
        await asyncio.wait_for(response.write(text.encode("utf-8")), WRITE_TIMEOUT_SECONDS)

    async def close_feeds(self, _app: web.Application) -> None:
        """On shutdown: end every open stream so the server need not wait for them."""
        for feed in list(self._feeds):
            feed.close()

    async def close(self, _app: web.Application) -> None:
        if self._http is not None:
            await self._http.close()

    # -- clicks ---------------------------------------------------------------------------------

    async def click(self, request: web.Request) -> web.StreamResponse:
        _refuse_foreign_origin(request)
        # JSON only (read_json answers 415 otherwise): a cross-site HTML form cannot send it.
        try:
            click = Click.parse(await read_json(request, limit=MAX_CLICK_BODY))
        except ValueError as exc:
            raise HttpError(422, "invalid_click", str(exc)) from None
        message = self._state().messages.get(click.message_id)
        if message is None:
            raise HttpError(404, "unknown_message", f"the sandbox holds no message {click.message_id}")
        operator = click.operator or self._requester_of(message.message_id) or DEFAULT_OPERATOR
        status, answer = await self._deliver(request, click, message, operator)
        return web.json_response({"status": status, "answer": answer, "operator": operator})

    async def _deliver(
        self, request: web.Request, click: Click, message: SandboxMessage, operator: str
    ) -> tuple[int, Any]:
        now = self._wall()
        payload = card_action_payload(
            open_id=operator,
            message_id=message.message_id,
            chat_id=message.chat_id,
            value=click.value,
            form_value=click.form_value,
            verification_token=self._keys.verification_token or "",
            now=now,
            button_name=click.button_name,
        )
        body, headers = signed_request(payload, encrypt_key=self._keys.encrypt_key, now=now)
        if self._http is None:
            self._http = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=CLICK_TIMEOUT_SECONDS))
        async with self._http.post(_own_url(request, CALLBACK_PATH), data=body, headers=headers) as reply:
            text = await reply.text()
            try:
                return reply.status, json.loads(text)
            except ValueError:
                return reply.status, {"msg": text[:500]}


@dataclass(frozen=True, slots=True)
class Click:
    """A click the page sends: on which message, the button's callback value, the form's values."""

    message_id: str
    value: Mapping[str, Any]
    form_value: Mapping[str, Any] | None
    operator: str | None
    button_name: str | None

    @classmethod
    def parse(cls, body: Any) -> Click:
        """Raises ValueError naming what is wrong."""
        if not isinstance(body, dict):
            raise ValueError("send a JSON object of at most 64 KB")
        message_id = body.get("message_id")
        if not isinstance(message_id, str) or not message_id:
            raise ValueError("message_id: expected the message's id")
        value = body.get("value") or {}
        if not isinstance(value, dict):
            raise ValueError("value: expected the button's callback value object")
        form_value = body.get("form_value")
        if form_value is not None and not _is_form_value(form_value):
            raise ValueError("form_value: expected an object of strings and lists of strings")
        operator = body.get("operator") or None
        if operator is not None and not (isinstance(operator, str) and _OPERATOR.match(operator)):
            raise ValueError("operator: expected an open_id")
        name = body.get("button_name") or None
        if name is not None and not isinstance(name, str):
            raise ValueError("button_name: expected a string")
        return cls(message_id, value, form_value, operator, name)


def image_keys(node: Any) -> list[str]:
    """Every ``img_key`` in a card, in order, without repeats."""
    found: dict[str, None] = {}
    stack = [node]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            key = item.get("img_key")
            if isinstance(key, str):
                found[key] = None
            stack.extend(reversed(list(item.values())))
        elif isinstance(item, list):
            stack.extend(reversed(item))
    return list(found)


def _is_form_value(value: Any) -> bool:
    if not isinstance(value, dict):
        return False
    for field in value.values():
        if isinstance(field, list):
            if not all(isinstance(item, str) for item in field):
                return False
        elif not isinstance(field, str):
            return False
    return True


def _refuse_foreign_origin(request: web.Request) -> None:
    """Only the page itself may click: a browser names the page's origin on every POST it sends."""
    origin = request.headers.get("Origin")
    if origin is not None and origin != f"{request.scheme}://{request.host}":
        raise HttpError(403, "foreign_origin", "clicks are accepted only from the preview page's own origin")


def _own_url(request: web.Request, path: str) -> str:
    """Our own listener, as the address the request arrived on (not a Host header a client chose)."""
    transport = request.transport
    sockname = transport.get_extra_info("sockname") if transport is not None else None
    if not sockname:
        raise HttpError(503, "unavailable", "the listener's address is unknown", retry_after=1)
    host, port = str(sockname[0]), int(sockname[1])
    return f"http://[{host}]:{port}{path}" if ":" in host else f"http://{host}:{port}{path}"


def _event(name: str, data: Any) -> str:
    return f"event: {name}\ndata: {json.dumps(data, ensure_ascii=False)}\n\n"


async def _security_headers(request: web.Request, response: web.StreamResponse) -> None:
    if request.path != PREFIX and not request.path.startswith(PREFIX + "/"):
        return
    headers = response.headers
    headers.setdefault("Content-Security-Policy", CSP)
    headers.setdefault("X-Content-Type-Options", "nosniff")
    headers.setdefault("Referrer-Policy", "no-referrer")
    headers.setdefault("X-Frame-Options", "DENY")
    headers.setdefault("Cache-Control", "no-store")


def _page_location(request: web.Request) -> str:
    """The page's address, keeping the query (``?token=`` works on the short addresses too)."""
    return f"{PREFIX}/" + (f"?{request.query_string}" if request.query_string else "")


def page_url(host: str, port: int, *, token_set: bool) -> str:
    """Where a person on this machine opens the page (what ``serve`` prints in sandbox mode)."""
    shown = "127.0.0.1" if host in ("", "0.0.0.0", "::") else host  # a wildcard is no address to open
    shown = f"[{shown}]" if ":" in shown else shown
    return f"http://{shown}:{port}{PREFIX}/" + ("?token=<FP_API__TOKEN>" if token_set else "")


def mount_preview(
    app: web.Application,
    state_of: StateLookup,
    requester_of: RequesterOf,
    *,
    keys: CallbackKeys,
    api_token: SecretStr | None,
    wall: Callable[[], float],
) -> PreviewPage:
    """Add the preview page's routes and hooks to ``app`` (before it starts)."""
    page = PreviewPage(state_of, requester_of, keys=keys, api_token=api_token, wall=wall)
    app.router.add_routes(page.routes())
    app.on_response_prepare.append(_security_headers)
    app.on_shutdown.append(page.close_feeds)
    app.on_cleanup.append(page.close)
    return page


__all__ = [
    "CallbackKeys",
    "Click",
    "MessageFeed",
    "PreviewPage",
    "callback_keys",
    "mount_preview",
    "page_url",
]
