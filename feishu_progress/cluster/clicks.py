"""Cluster mode's clicks: a click is applied by the instance that writes its card, or only recorded.

Any instance may receive a click (Feishu picks one). ``CardActions`` answers it when this instance writes
the card; when another live instance does (``OwnedElsewhere``), the click is handed to it over
``/internal/v1/clicks`` and its answer (with the new card) goes back to Feishu. When that writer is out of
reach, or this instance's lease lapsed (``NotWritableHere``), the click is only recorded in the action log:
whoever holds the task applies it (a nudge, the 1 s backstops, a takeover's replay). A click a peer
forwarded here is never forwarded again: recorded at worst, so two instances cannot pass it back and forth.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any, Protocol

from feishu_progress.errors import ForwardFailed, NotWritableHere, OwnedElsewhere
from feishu_progress.feishu.callback import CallbackReply, CardActionEvent
from feishu_progress.runtime.card_actions import (
    CardActions,
    StateLookup,
    decide,
    on_this_card,
    parse_click,
    same_app,
    toast,
)

log = logging.getLogger(__name__)


class RemoteClicks(Protocol):
    """Hands a click to the instance that writes its card (``ClusterMode.click``, cluster/forward.py)."""

    async def click(self, address: str, event: CardActionEvent) -> Mapping[str, Any]: ...


class ClusterClicks:
    """The ActionHandler of cluster mode: here, at the card's writer, or recorded for whoever holds it."""

    def __init__(self, here: CardActions, remote: RemoteClicks, saved_state: StateLookup) -> None:
        self._here = here
        self._remote = remote
        self._saved_state = saved_state

    async def handle(self, event: CardActionEvent) -> CallbackReply:
        try:
            return await self._here.handle(event)
        except OwnedElsewhere as elsewhere:
            if elsewhere.address is None:
                return await record_only(self._here, self._saved_state, event)
            return await self._at_writer(elsewhere.address, event)
        except NotWritableHere:
            return await record_only(self._here, self._saved_state, event)

    async def _at_writer(self, address: str, event: CardActionEvent) -> CallbackReply:
        try:
            return CallbackReply(rendered=await self._remote.click(address, event))
        except ForwardFailed as exc:  # the writer is paused or dying: this instance records the click
            log.warning("the writer at %s did not take a click (%r)", address, exc)
            return await record_only(self._here, self._saved_state, event)


async def forwarded_click(
    here: CardActions, saved_state: StateLookup, event: CardActionEvent
) -> CallbackReply:
    """A click a peer forwarded: applied if this instance writes the card, else recorded (never sent on)."""
    try:
        return await here.handle(event)
    except (OwnedElsewhere, NotWritableHere):
        return await record_only(here, saved_state, event)


async def record_only(here: CardActions, saved_state: StateLookup, event: CardActionEvent) -> CallbackReply:
    """The card's writer out of reach: log the click; whoever holds the task applies it.

    Judged against the task's saved state, with the same checks as a click applied here. The answer is a
    toast only: this instance does not write the card, so it sends no card either.
    """
    click = parse_click(event.value)
    if click is None:
        return toast("error", "card.toast.invalid_action")
    state = await saved_state(click.session_id)
    if state is None or not same_app(state, event):
        return toast("error", "card.toast.unknown_task")
    if not on_this_card(state, event):
        return toast("error", "card.toast.expired")
    if not here.may_act(state, event):
        return toast("error", "card.toast.not_requester")
    decision = decide(state, click, event)
    if decision.kind is not None:
        try:
            await here.record(state.session_id, decision, event)
        except Exception as exc:
            log.warning("click %r on task %s not recorded: %r", click.action, click.session_id, exc)
            return toast("error", "card.toast.error")
    return toast(decision.toast_type, decision.toast_key)
