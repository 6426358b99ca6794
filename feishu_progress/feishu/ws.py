"""Long-connection receiver (``FP_FEISHU__MODE=ws``): card callbacks over lark-oapi's ``ws.Client``.

The SDK's client runs in its own daemon thread with its own event loop. Each card action is converted
with the same ``event_from_payload`` as the webhook and answered by the same ``CallbackPipeline``
(dedupe, the action handler within 2.5 s, Feishu's reply body), run on the service's loop with
``asyncio.run_coroutine_threadsafe``. Over the long connection Feishu itself is the peer: there is no
signature, token or encryption to check, and ``operator.user_id`` may be absent.

``LongConnection`` owns the thread: ``start()``, ``stop()`` (the SDK has none: we cancel every task on
its loop), and ``problem()`` for ``/readyz`` — whether the websocket is up and the gateway still
speaks (any frame, e.g. the pong to the client's ping, within three ping intervals).

Caveats of lark-oapi's ``ws.Client`` (docs/feishu-platform.md §9, measured on 1.7.5):

* ``import lark_oapi`` costs ~4-5 s and ~170 MB, so it happens lazily, inside the ws thread only.
* ``lark_oapi.ws.client`` binds a module-level event loop at import time (whatever loop is current,
  possibly the service's). We give the thread a fresh loop and put it in that module global while the
  thread runs (the displaced loop is put back after); hence one ``LongConnection`` per process at a time.
* Connection state is observed by overriding three private methods of the client (``_connect``,
  ``_disconnect``, ``_handle_message``); ``tests/test_ws_mode.py`` runs them against the sandbox gateway.
* Handlers run synchronously on the ws loop: clicks are answered one after the other.
* Frames of type ``CARD`` are dropped by the SDK (``_handle_data_frame`` returns early; issue #126,
  users then see error 200340). ``card.action.trigger`` is reported to arrive as ``EVENT`` frames,
  which are handled — the sandbox gateway sends those — but this is unconfirmed on a real tenant.
* The endpoint-discovery POST has no timeout (#169): a hanging Feishu stalls a reconnect, and
  ``stop()`` cannot interrupt it (the thread is a daemon and ends with the process).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import dataclasses
import importlib.util
import json
import logging
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from feishu_progress.errors import CallbackRejected, ConfigError
from feishu_progress.feishu.callback import CardActionEvent, event_from_payload
from feishu_progress.feishu.pipeline import CallbackPipeline

THREAD_NAME = "feishu-ws"
SILENT_PING_INTERVALS = 3  # no frame for this many ping intervals: the connection is presumed dead
_STOP_POLL_SECONDS = 0.1

log = logging.getLogger(__name__)
_active_lock = threading.Lock()
_active: LongConnection | None = None  # the SDK's module-global loop allows one client per process


def trigger_payload(trigger: Any) -> dict[str, Any]:
    """The JSON body behind a lark-oapi ``P2CardActionTrigger`` (its attributes, nulls dropped)."""
    from lark_oapi.core.json import JSON

    payload = json.loads(JSON.marshal(trigger) or "null")
    if not isinstance(payload, dict):
        raise CallbackRejected(400, "card action trigger is not an object")
    return payload


def card_action_event(trigger: Any) -> CardActionEvent:
    """Convert a lark-oapi ``P2CardActionTrigger`` into the same event the webhook produces."""
    return event_from_payload(trigger_payload(trigger))


class WsCallbackBridge:
    """Called on the ws thread; answers each click through the pipeline on the service's loop."""

    def __init__(
        self,
        pipeline: CallbackPipeline,
        loop: asyncio.AbstractEventLoop,
        *,
        observe: Callable[[float], None] | None = None,
        grace: float = 0.4,
        clock: Callable[[], float] = time.monotonic,
        app: str | None = None,
    ) -> None:
        self._pipeline = pipeline
        self._app = app  # the app whose connection this is: its clicks count for its cards only
        self._loop = loop
        self._observe = observe
        # The pipeline answers within its own deadline; the grace only covers a service loop too
        # busy to run it (the answer must still leave before Feishu's 3 s).
        self._wait = pipeline.reply_timeout + grace
        self._clock = clock

    def on_card_action(self, trigger: Any) -> Any:
        """The function registered with ``register_p2_card_action_trigger``; returns the SDK response."""
        from lark_oapi.event.callback.model.p2_card_action_trigger import P2CardActionTriggerResponse

        try:
            payload = trigger_payload(trigger)
        except CallbackRejected:
            payload = {}  # respond() rejects it with an error toast and a log line
        return P2CardActionTriggerResponse(self.respond(payload))

    def respond(self, payload: Mapping[str, Any]) -> dict[str, Any]:
        """Feishu's response body for one ``card.action.trigger`` payload (blocks this thread)."""
        started = self._clock()
        try:
            return self._answer(payload)
        finally:
            if self._observe is not None:
                self._observe(self._clock() - started)

    def _answer(self, payload: Mapping[str, Any]) -> dict[str, Any]:
        try:
            event = dataclasses.replace(event_from_payload(payload), app=self._app)
        except CallbackRejected as rejected:
            log.warning("ws card action rejected: %r", rejected.reason)
            return self._pipeline.error_body()
        answer = self._pipeline.answer(event)
        try:
            future = asyncio.run_coroutine_threadsafe(answer, self._loop)
        except RuntimeError:  # the service loop is closed: shutting down
            answer.close()
            log.error("card action %r arrived after the service loop closed", event.event_id)
            return self._pipeline.error_body()
        try:
            return future.result(timeout=self._wait)
        except concurrent.futures.TimeoutError:
            log.error("service loop did not answer card action %r within %.1f s", event.event_id, self._wait)
        except Exception:  # the pipeline never raises; a cancelled hand-over does
            log.exception("card action %r could not be answered on the service loop", event.event_id)
        return self._pipeline.error_body()


class ConnectionState:
    """Whether the websocket is up and when the gateway last spoke; written by the ws thread."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._connected = False
        self._changed_at: float | None = None  # None: never connected
        self._last_frame = 0.0
        self._ping_interval = 120.0

    def connected(self, ping_interval: float) -> None:
        with self._lock:
            now = self._clock()
            self._connected, self._changed_at, self._last_frame = True, now, now
            self._ping_interval = ping_interval
        log.info("feishu long connection is up")

    def disconnected(self, *, stopping: bool = False) -> None:
        with self._lock:
            if not self._connected:
                return
            self._connected, self._changed_at = False, self._clock()
        log.log(logging.INFO if stopping else logging.WARNING, "feishu long connection is down")

    def frame_received(self, ping_interval: float) -> None:
        with self._lock:
            self._last_frame = self._clock()
            self._ping_interval = ping_interval

    def problem(self) -> str | None:
        """None while connected and the gateway spoke recently, else why not."""
        with self._lock:
            now = self._clock()
            if self._changed_at is None:
                return "long connection not established yet"
            if not self._connected:
                return f"long connection down for {now - self._changed_at:.0f} s (reconnecting)"
            silent = now - self._last_frame
            if silent > SILENT_PING_INTERVALS * self._ping_interval:
                return f"no frame from the gateway for {silent:.0f} s (pings every {self._ping_interval:g} s)"
            return None


class LongConnection:
    """lark-oapi's ``ws.Client`` in a daemon thread, with a stop and a readiness view."""

    def __init__(
        self,
        app_id: str,
        app_secret: str,
        domain: str,
        bridge: WsCallbackBridge,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if importlib.util.find_spec("lark_oapi") is None:
            raise ConfigError('FP_FEISHU__MODE=ws needs lark-oapi: pip install "feishu-progress[lark]"')
        self._credentials = (app_id, app_secret, domain)
        self._bridge = bridge
        self.state = ConnectionState(clock)
        self._thread = threading.Thread(target=self._run, name=THREAD_NAME, daemon=True)
        self._lock = threading.Lock()
        self._stopping = False
        self._closing = False  # only touched on the ws thread
        self._loop: asyncio.AbstractEventLoop | None = None
        self._client: Any = None
        self._restore_sdk_loop: Callable[[], None] = lambda: None

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def start(self) -> None:
        """Start the thread; at most one long connection runs in a process at a time."""
        global _active  # noqa: PLW0603 - the SDK's own global forces one client per process
        with _active_lock:
            if _active is not None and _active.alive:
                raise ConfigError("a feishu long connection is already running in this process")
            _active = self
        self._thread.start()

    def problem(self) -> str | None:
        """For ``/readyz``: None when the connection is up and alive, else why not."""
        if not self._thread.is_alive():
            return "long-connection receiver thread is not running"
        return self.state.problem()

    def stop(self, timeout: float = 5.0) -> bool:
        """Stop the client and join the thread; True if it ended within ``timeout`` s."""
        with self._lock:
            self._stopping = True
        deadline = time.monotonic() + timeout
        while self._thread.is_alive() and time.monotonic() < deadline:
            # Repeated: a cancel that lands before start() created its first task would miss it.
            self._cancel_on_loop()
            self._thread.join(_STOP_POLL_SECONDS)
        return not self._thread.is_alive()

    def _cancel_on_loop(self) -> None:
        with self._lock:
            loop = self._loop
        if loop is None:
            return
        with contextlib.suppress(RuntimeError):  # the loop closed meanwhile: the thread is ending
            loop.call_soon_threadsafe(self._cancel_client_tasks)

    def _cancel_client_tasks(self) -> None:
        """On the ws loop: no reconnect after this, and every task (start()'s included) is cancelled."""
        if self._closing:
            return  # _close_loop is winding down; a late cancel must not interrupt it
        if self._client is not None:
            self._client._auto_reconnect = False
        for task in asyncio.all_tasks():
            task.cancel()

    def _run(self) -> None:
        loop = asyncio.new_event_loop()
        asyncio.set_event_loop(loop)
        client: Any = None
        try:
            client = self._build_client(loop)
            with self._lock:
                if self._stopping:
                    return
                self._loop, self._client = loop, client
            client.start()
        except asyncio.CancelledError:
            log.info("feishu long connection stopped")
        except Exception:
            log.exception("feishu long connection failed")
        finally:
            self._closing = True
            self.state.disconnected(stopping=self._stopping)
            _close_loop(loop, client)
            self._restore_sdk_loop()

    def _build_client(self, loop: asyncio.AbstractEventLoop) -> Any:
        import lark_oapi as lark
        import lark_oapi.ws.client as sdk_ws_client

        # See the module docstring: the SDK's import-time loop may be the service's. It is not ours to
        # close, so it is given back when this thread ends (dropping it would leak it unclosed).
        displaced = sdk_ws_client.loop
        sdk_ws_client.loop = loop

        def restore() -> None:
            if sdk_ws_client.loop is loop:
                sdk_ws_client.loop = displaced

        self._restore_sdk_loop = restore
        dispatcher = (
            lark.EventDispatcherHandler.builder("", "")
            .register_p2_card_action_trigger(self._bridge.on_card_action)
            .build()
        )
        app_id, app_secret, domain = self._credentials
        client_class = _observed_client_class(sdk_ws_client.Client, self.state)
        return client_class(app_id, app_secret, event_handler=dispatcher, domain=domain)


def _observed_client_class(base: Any, state: ConnectionState) -> Any:
    """A subclass of the SDK's client that reports connects, disconnects and inbound frames."""

    class ObservedClient(base):  # type: ignore[misc]  # lark-oapi is untyped
        async def _connect(self) -> None:
            await super()._connect()
            if self._conn is not None:
                state.connected(float(self._ping_interval))

        async def _disconnect(self) -> None:
            state.disconnected()
            await super()._disconnect()

        async def _handle_message(self, msg: bytes) -> None:
            state.frame_received(float(self._ping_interval))
            await super()._handle_message(msg)

    return ObservedClient


def _close_loop(loop: asyncio.AbstractEventLoop, client: Any) -> None:
    """Let cancelled tasks finish, close the websocket, close the loop (no 'task destroyed' noise)."""
    try:
        pending = asyncio.all_tasks(loop)
        for task in pending:
            task.cancel()
        if pending:
            loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
        conn = getattr(client, "_conn", None)
        if conn is not None:
            with contextlib.suppress(Exception):
                loop.run_until_complete(asyncio.wait_for(conn.close(), 1.0))
        loop.run_until_complete(loop.shutdown_asyncgens())
    except Exception:
        log.exception("closing the long connection's loop failed")
    finally:
        loop.close()


def long_connection(
    app_id: str | None, app_secret: str | None, domain: str, bridge: WsCallbackBridge
) -> LongConnection:
    """Build the receiver, not started yet; ConfigError without app credentials or without lark-oapi."""
    if not app_id or not app_secret:
        raise ConfigError("FP_FEISHU__MODE=ws needs FP_FEISHU__APP_ID and FP_FEISHU__APP_SECRET")
    return LongConnection(app_id, app_secret, domain, bridge)


def start_long_connection(
    app_id: str | None, app_secret: str | None, domain: str, bridge: WsCallbackBridge
) -> LongConnection:
    """Build and start the receiver; ConfigError without app credentials or without lark-oapi."""
    connection = long_connection(app_id, app_secret, domain, bridge)
    connection.start()
    return connection
