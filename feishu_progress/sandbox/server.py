"""The sandbox's HTTP face: an aiohttp app speaking the Open API subset the service uses.

``create_sandbox_app`` builds the app; ``run_sandbox`` serves it on a (free) port for tests, the
demo and benchmarks. ``GET /_sandbox/stats`` and ``POST /_sandbox/reset`` exist for benchmarks
that run the sandbox in another process; ``GET /_sandbox/messages`` (and ``/_sandbox/messages/{id}``) is
test-only: every message's update log (updates.py), for tests that run several service instances
against one sandbox (``feishu-progress sandbox``). The long connection's discovery and websocket gateway
(``FP_FEISHU__MODE=ws``) live in ``ws_gateway.py``; ``RunningSandbox.gateway`` drives it.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from email.utils import formatdate
from typing import Any

from aiohttp import web

# The header the service's client names its instance with (sent to any host but Feishu's own).
from feishu_progress.feishu.client import INSTANCE_HEADER
from feishu_progress.feishu.ws_protocol import ClientConfig
from feishu_progress.sandbox.cardkit import CardKit
from feishu_progress.sandbox.faults import Fault, FaultKind
from feishu_progress.sandbox.state import Answer, SandboxConfig, SandboxMessage, SandboxState
from feishu_progress.sandbox.updates import overlaps
from feishu_progress.sandbox.ws_gateway import WsGateway
from feishu_progress.web.http import serving

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
STATE_KEY = web.AppKey("sandbox_state", SandboxState)
GATEWAY_KEY = web.AppKey("sandbox_ws_gateway", WsGateway)
# Set on a request whose answer is to be lost (faults.lose_answers): the HTTP status sent instead.
LOST_ANSWER_KEY = web.RequestKey("sandbox_lost_answer", int)


def create_sandbox_app(
    config: SandboxConfig,
    *,
    clock: Callable[[], float] = time.monotonic,
    ws_client_config: ClientConfig | None = None,
) -> web.Application:
    """An aiohttp application emulating the Feishu Open API calls the service makes."""
    app = web.Application(client_max_size=16 * 1024 * 1024, middlewares=[_lose_answers, _dated])
    app[STATE_KEY] = SandboxState(config, clock)
    gateway = WsGateway(config.app_id, config.app_secret, ws_client_config)
    app[GATEWAY_KEY] = gateway
    app.router.add_routes(gateway.routes())
    app.on_shutdown.append(gateway.close)
    app.router.add_post("/open-apis/auth/v3/tenant_access_token/internal", _token)
    app.router.add_post("/open-apis/im/v1/messages", _send)
    app.router.add_post("/open-apis/im/v1/messages/{message_id}/reply", _reply)
    app.router.add_patch("/open-apis/im/v1/messages/{message_id}", _patch)
    app.router.add_post("/open-apis/im/v1/images", _image)
    app.router.add_post("/open-apis/cardkit/v1/cards", _card_create)
    app.router.add_put("/open-apis/cardkit/v1/cards/{card_id}", _card_update)
    app.router.add_patch("/open-apis/cardkit/v1/cards/{card_id}/settings", _card_settings)
    app.router.add_put("/open-apis/cardkit/v1/cards/{card_id}/elements/{element_id}/content", _card_content)
    if config.test_endpoints:
        app.router.add_get("/_sandbox/stats", _stats)
        app.router.add_post("/_sandbox/reset", _reset)
        app.router.add_get("/_sandbox/messages", _messages)
        app.router.add_get("/_sandbox/messages/{message_id}", _message)
    app.on_shutdown.append(_release_hangs)
    return app


@dataclass(frozen=True, slots=True)
class RunningSandbox:
    """A served sandbox: where it listens and what it knows."""

    base_url: str
    state: SandboxState
    app: web.Application

    @property
    def gateway(self) -> WsGateway:
        """The long-connection gateway: push clicks, drop connections, count them."""
        return self.app[GATEWAY_KEY]


@asynccontextmanager
async def run_sandbox(
    config: SandboxConfig | None = None,
    *,
    host: str = "127.0.0.1",
    port: int = 0,
    clock: Callable[[], float] = time.monotonic,
    ws_client_config: ClientConfig | None = None,
) -> AsyncIterator[RunningSandbox]:
    """Serve a sandbox on ``host:port`` (0 = a free port) for the duration of the block."""
    app = create_sandbox_app(config or SandboxConfig(), clock=clock, ws_client_config=ws_client_config)
    async with serving(app, host, port, shutdown_timeout=1.0) as base_url:
        try:
            yield RunningSandbox(base_url, app[STATE_KEY], app)
        finally:
            app[STATE_KEY].faults.release_hangs()  # a held request must not hold the shutdown


async def _release_hangs(app: web.Application) -> None:
    app[STATE_KEY].faults.release_hangs()


# --- handlers -------------------------------------------------------------------------------------


async def _token(request: web.Request) -> web.StreamResponse:
    state, early = await _admit(request, "token", needs_token=False)
    if early is not None:
        return early
    body = await _json_body(request)
    answer = state.issue_token(str(body.get("app_id", "")), str(body.get("app_secret", "")))
    return _respond(state, answer)


async def _send(request: web.Request) -> web.StreamResponse:
    state, early = await _admit(request, "send")
    if early is not None:
        return early
    answer = state.send(request.query.get("receive_id_type"), await _json_body(request))
    return _respond(state, answer)


async def _reply(request: web.Request) -> web.StreamResponse:
    state, early = await _admit(request, "reply")
    if early is not None:
        return early
    message_id = request.match_info["message_id"]
    return _respond(state, state.reply(message_id, await _json_body(request)), message_id)


async def _patch(request: web.Request) -> web.StreamResponse:
    message_id = request.match_info["message_id"]

    async def handle() -> web.StreamResponse:
        state, early = await _admit(request, "patch")
        if early is not None:
            # A refusal before the rules (injected fault, bad token, storm) still shows on the message.
            state.note_refusal(message_id, _code_of(early))
            return early
        return _respond(state, state.patch(message_id, await _json_body(request)), message_id)

    return await _logged_update(request, "patch", message_id, handle)


async def _image(request: web.Request) -> web.StreamResponse:
    state, early = await _admit(request, "image")
    if early is not None:
        return early
    image_type: str | None = None
    data: bytes | None = None
    form = await request.post()
    raw_type = form.get("image_type")
    image_type = raw_type if isinstance(raw_type, str) else None
    image = form.get("image")
    if isinstance(image, web.FileField):
        data = image.file.read()
    return _respond(state, state.upload_image(image_type, data))


async def _card_create(request: web.Request) -> web.StreamResponse:
    state, early = await _admit(request, "card_create")
    if early is not None:
        return early
    return _respond(state, state.cardkit.create(await _json_body(request)))


async def _card_update(request: web.Request) -> web.StreamResponse:
    return await _card_call(request, "card_update", lambda kit, card_id, body: kit.update(card_id, body))


async def _card_settings(request: web.Request) -> web.StreamResponse:
    return await _card_call(request, "card_settings", lambda kit, card_id, body: kit.settings(card_id, body))


async def _card_content(request: web.Request) -> web.StreamResponse:
    element_id = request.match_info["element_id"]
    return await _card_call(
        request, "card_content", lambda kit, card_id, body: kit.content(card_id, element_id, body)
    )


async def _card_call(
    request: web.Request,
    endpoint: str,
    operate: Callable[[CardKit, str, Mapping[str, Any]], Answer],
) -> web.StreamResponse:
    """An update of one card entity; the message showing it is notified whatever the answer."""
    card_id = request.match_info["card_id"]

    async def handle() -> web.StreamResponse:
        state, response = await _admit(request, endpoint)
        if response is None:
            answer = operate(state.cardkit, card_id, await _json_body(request))
            response = _respond(state, answer, state.cardkit.message_id_of(card_id))
        state.cardkit.notify(card_id)
        return response

    return await _logged_update(request, endpoint, card_id, handle)


async def _logged_update(
    request: web.Request,
    endpoint: str,
    target: str,
    handle: Callable[[], Awaitable[web.StreamResponse]],
) -> web.StreamResponse:
    """Run an update handler inside the update log: arrival, what was in flight, answer (updates.py)."""
    state = request.app[STATE_KEY]
    record = state.updates.begin(target, endpoint, request.headers.get(INSTANCE_HEADER))
    response: web.StreamResponse | None = None
    try:
        response = await handle()
        return response
    finally:
        code = None if response is None else _code_of(response)
        status = None if response is None else response.status
        message = state.messages.get(state.cardkit.message_id_of(target) or target)
        version = len(message.history) - 1 if code == 0 and message is not None else None
        state.updates.finish(record, code, status, version)


async def _stats(request: web.Request) -> web.StreamResponse:
    state = request.app[STATE_KEY]
    return web.json_response(
        {
            "peers": len(state.peers),
            "connections": state.connections,
            "requests": dict(state.requests),
            "responses": {str(code): count for code, count in state.responses.items()},
            "messages": len(state.messages),
            "token_fetches": state.token_fetches,
            "cardkit": state.cardkit.stats(),
            "ws_connections": request.app[GATEWAY_KEY].connection_count,
            "rate_limited": state.rate_limited(),
            "instances": dict(state.updates.by_instance),  # requests by X-FP-Instance ("" without one)
        }
    )


async def _reset(request: web.Request) -> web.StreamResponse:
    request.app[STATE_KEY].reset_stats()
    return web.json_response({"ok": True})


async def _messages(request: web.Request) -> web.StreamResponse:
    """Test-only: every message with its update log (``?history=1``: and every card it showed)."""
    state = request.app[STATE_KEY]
    with_history = request.query.get("history", "") in {"1", "true"}
    shown = {message.card_id for message in state.messages.values() if message.card_id}
    unsent = {
        target: [record.as_json() for record in state.updates.records([target])]
        for target in state.cardkit.cards
        if target not in shown and target in state.updates.by_target
    }
    return web.json_response(
        {
            "now": state.updates.now(),
            "rate_limited": state.rate_limited(),
            "responses": {str(code): count for code, count in state.responses.items()},
            "instances": dict(state.updates.by_instance),
            "messages": [_message_json(state, message, with_history) for message in state.messages.values()],
            "unsent_cards": unsent,
        }
    )


async def _message(request: web.Request) -> web.StreamResponse:
    """Test-only: one message with its update log and every card it showed."""
    state = request.app[STATE_KEY]
    message = state.messages.get(request.match_info["message_id"])
    if message is None:
        return web.json_response({"error": "no such message"}, status=404)
    return web.json_response(_message_json(state, message, with_history=True))


def _message_json(state: SandboxState, message: SandboxMessage, with_history: bool) -> dict[str, Any]:
    """A message as the update log sees it: its updates and its card's, merged by arrival."""
    targets = [message.message_id, *([message.card_id] if message.card_id else [])]
    records = state.updates.records(targets)
    found: dict[str, Any] = {
        "message_id": message.message_id,
        "card_id": message.card_id,
        "chat_id": message.chat_id,
        "parent_id": message.parent_id,
        "versions": len(message.history),
        "overlaps": overlaps(records),
        "responses": {str(code): count for code, count in message.responses.items()},
        "updates": [record.as_json() for record in records],
        "card": message.card,
    }
    if with_history:
        found["history"] = [{"sandbox_time": at, "card": card} for at, card in message.history]
    return found


# --- plumbing -------------------------------------------------------------------------------------


async def _admit(
    request: web.Request, endpoint: str, *, needs_token: bool = True
) -> tuple[SandboxState, web.StreamResponse | None]:
    """Count the request, apply injected faults, check the bearer token."""
    state = request.app[STATE_KEY]
    state.requests[endpoint] += 1
    state.updates.note_request(request.headers.get(INSTANCE_HEADER))
    transport = request.transport
    if transport is not None:
        state.note_connection(transport)
        peer = transport.get_extra_info("peername")
        if peer:
            state.peers.add((str(peer[0]), int(peer[1])))
    delay = state.faults.delay_for(endpoint)
    if delay:
        await asyncio.sleep(delay)
    fault = state.faults.decide(endpoint)
    if fault is not None and fault.kind is FaultKind.LOST_ANSWER:
        request[LOST_ANSWER_KEY] = fault.status  # carried out below, answered by _lose_answers
    elif fault is not None:
        return state, await _inject(state, fault)
    if needs_token:
        refused = state.check_token(request.headers.get("Authorization"))
        if refused is not None:
            return state, _respond(state, refused)
    return state, None


async def _inject(state: SandboxState, fault: Fault) -> web.StreamResponse:
    if fault.kind is FaultKind.HANG:
        await state.faults.wait_released(state.config.hang_cap_seconds)
    if fault.kind is FaultKind.STORM:
        return _respond(state, state.gateway_limited(fault.retry_after))
    return _failure(state, fault.status)


def _failure(state: SandboxState, status: int) -> web.Response:
    state.responses[status] += 1
    # Real gateways answer 5xx with HTML, not Feishu JSON: the client must cope with both.
    return web.Response(status=status, text="<html>injected failure</html>", content_type="text/html")


@web.middleware
async def _lose_answers(request: web.Request, handler: Handler) -> web.StreamResponse:
    """The request was carried out; its sender is told it failed (faults.lose_answers)."""
    response = await handler(request)
    status = request.get(LOST_ANSWER_KEY)
    if status is None:
        return response
    return _failure(request.app[STATE_KEY], status)


@web.middleware
async def _dated(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Every answer carries a ``Date`` header on the sandbox's wall clock (config.clock_offset_seconds)."""
    response = await handler(request)
    offset = request.app[STATE_KEY].config.clock_offset_seconds
    if offset and not response.prepared:
        response.headers["Date"] = formatdate(time.time() + offset, usegmt=True)
    return response


async def _json_body(request: web.Request) -> dict[str, Any]:
    try:
        body = await request.json(loads=json.loads)
    except ValueError:
        return {}
    return body if isinstance(body, dict) else {}


def _code_of(response: web.StreamResponse) -> int:
    """The Feishu code of an answer we built, or its HTTP status when the body is not Feishu JSON."""
    body = response.body if isinstance(response, web.Response) else None
    if isinstance(body, bytes) and response.content_type == "application/json":
        try:
            code = json.loads(body).get("code")
        except (ValueError, AttributeError):
            code = None
        if isinstance(code, int):
            return code
    return response.status


def _respond(state: SandboxState, answer: Answer, message_id: str | None = None) -> web.Response:
    state.record(answer, message_id)
    log_id = f"sandbox-{sum(state.responses.values())}"
    body = answer.body
    if answer.code != 0:
        body = {**body, "error": {**body.get("error", {}), "log_id": log_id}}
    return web.json_response(body, status=answer.status, headers={"x-tt-logid": log_id, **answer.headers})


__all__ = ["GATEWAY_KEY", "STATE_KEY", "RunningSandbox", "create_sandbox_app", "run_sandbox"]
