"""Requests for a card another instance writes go to that instance, over its public listener.

Events for one task must be applied in order by one writer: the instance that writes the card. A request
that reaches another instance is forwarded as it came (method, path, body, the runtime's bearer token)
with ``X-FP-Forwarded-By``; an instance never forwards a forwarded request again (no loops while
ownership moves). An event batch the writer does not take in time (paused, dead, slow) goes to the
event log instead (cluster/http.py), where the writer or its successor applies it in order. Clicks
are forwarded as the verified event, to ``/internal/v1/clicks``, within Feishu's 3-second window,
signed with the cluster secret (``cluster/trust.py``): the runtime token would let any runtime forge one.
"""

from __future__ import annotations

import json
import logging
from dataclasses import asdict
from typing import Any

import aiohttp
from aiohttp import web

from feishu_progress.cluster.trust import signed_headers
from feishu_progress.errors import ForwardFailed
from feishu_progress.feishu.callback import CardActionEvent

log = logging.getLogger(__name__)

FORWARDED_HEADER = "X-FP-Forwarded-By"
INTERNAL_CLICKS_PATH = "/internal/v1/clicks"
# traceparent/tracestate: the writer's span of a forwarded batch joins the runtime's trace (tracing.py).
_PASSED_HEADERS = ("Authorization", "Content-Type", "Idempotency-Key", "traceparent", "tracestate")


def event_to_json(event: CardActionEvent) -> dict[str, Any]:
    data = asdict(event)
    data["options"] = list(event.options)
    return data


_TEXT = ("event_id", "token", "open_id", "message_id")
_OPTIONAL_TEXT = ("union_id", "user_id", "chat_id", "tag", "name", "input_value", "option", "tenant_key")


def event_from_json(data: Any) -> CardActionEvent:
    """The event ``event_to_json`` sent (ValueError naming what is wrong otherwise)."""
    if not isinstance(data, dict):
        raise ValueError("a forwarded click is a JSON object")
    fields = dict(data)
    unknown = set(fields) - set(CardActionEvent.__dataclass_fields__)
    if unknown:
        raise ValueError(f"unknown field {sorted(unknown)[0]!r}")
    for name in _TEXT:
        if not isinstance(fields.get(name), str):
            raise ValueError(f"field {name!r} must be a string")
    for name in _OPTIONAL_TEXT:
        if fields.get(name) is not None and not isinstance(fields[name], str):
            raise ValueError(f"field {name!r} must be a string or null")
    for name in ("value", "form_value"):
        if not isinstance(fields.setdefault(name, {}), dict):
            raise ValueError(f"field {name!r} must be an object")
    options = fields.get("options") or []
    if not isinstance(options, list) or not all(isinstance(option, str) for option in options):
        raise ValueError("field 'options' must be a list of strings")
    fields["options"] = tuple(options)
    _check_scalars(fields)
    return CardActionEvent(**fields)


def _check_scalars(fields: dict[str, Any]) -> None:
    checked, created = fields.get("checked"), fields.get("create_time")
    if checked is not None and not isinstance(checked, bool):
        raise ValueError("field 'checked' must be a boolean or null")
    if created is not None and (isinstance(created, bool) or not isinstance(created, int | float)):
        raise ValueError("field 'create_time' must be a number or null")


class Forwarder:
    def __init__(self, instance_id: str, *, request_timeout: float, click_timeout: float) -> None:
        self._me = instance_id
        self._request_timeout = request_timeout
        self._click_timeout = click_timeout
        self._session: aiohttp.ClientSession | None = None

    async def open(self) -> None:
        self._session = aiohttp.ClientSession()

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()

    async def request(
        self,
        request: web.Request,
        address: str,
        *,
        body: bytes | None = None,
        idempotency_key: str | None = None,
        timeout: float | None = None,
    ) -> web.Response:
        """Send ``request`` to the instance at ``address`` and answer with what it answered.

        ``body``: what the caller already read of the request (its JSON, encoded again).
        ``idempotency_key`` replaces the request's own (an event batch names the key it is logged
        under if the owner does not answer); ``timeout`` the default (the lease) for this request.
        """
        assert self._session is not None
        headers = {name: request.headers[name] for name in _PASSED_HEADERS if name in request.headers}
        headers[FORWARDED_HEADER] = self._me
        if idempotency_key is not None:
            headers["Idempotency-Key"] = idempotency_key
        if body is None:
            body = await request.read()
        try:
            async with self._session.request(
                request.method,
                address + request.path_qs,
                data=body or None,
                headers=headers,
                timeout=aiohttp.ClientTimeout(total=timeout or self._request_timeout),
            ) as answer:
                payload = await answer.read()
                kept = {k: v for k, v in answer.headers.items() if k in ("Content-Type", "Retry-After")}
                return web.Response(status=answer.status, body=payload, headers=kept)
        except (TimeoutError, aiohttp.ClientError) as exc:
            raise ForwardFailed(f"{address}: {type(exc).__name__}") from exc

    async def click(self, address: str, event: CardActionEvent, secret: str, now: float) -> dict[str, Any]:
        """Have the owner handle a verified click, signed with the cluster secret; its rendered answer
        (toast and card) comes back."""
        assert self._session is not None
        body = json.dumps(event_to_json(event)).encode()
        headers = {FORWARDED_HEADER: self._me, "Content-Type": "application/json"}
        headers.update(signed_headers(secret, "POST", INTERNAL_CLICKS_PATH, body, now))
        try:
            async with self._session.post(
                address + INTERNAL_CLICKS_PATH,
                data=body,
                headers=headers,
                timeout=aiohttp.ClientTimeout(total=self._click_timeout),
            ) as answer:
                if answer.status != 200:
                    raise ForwardFailed(f"{address} answered {answer.status}")
                answered: dict[str, Any] = await answer.json()
                return answered
        except (TimeoutError, aiohttp.ClientError, ValueError) as exc:
            raise ForwardFailed(f"{address}: {type(exc).__name__}") from exc
