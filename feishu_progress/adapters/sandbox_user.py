"""A user clicking on cards in the sandbox: what the offline examples (``--auto-answer``) and the adapter
tests use to approve, deny, answer and cancel from the card itself.

Every click goes through the sandbox preview's ``POST /sandbox/api/click``: the service signs and
encrypts it as Feishu would and posts it to its own callback endpoint, so the click is authorised
exactly as a real one (the task's requester by default; ``operator`` clicks as someone else). Only a
service in sandbox mode has that endpoint.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import aiohttp

Card = dict[str, Any]
POLL_SECONDS = 0.1
TERMINAL_TEMPLATES = frozenset({"green", "red", "grey"})  # the header colours of a finished card


def walk(node: Any) -> Iterator[dict[str, Any]]:
    """Every object in a card, depth first."""
    if isinstance(node, dict):
        yield node
        for value in node.values():
            yield from walk(value)
    elif isinstance(node, list):
        for item in node:
            yield from walk(item)


def buttons(card: Mapping[str, Any], action: str) -> list[dict[str, Any]]:
    """The callback values of the card's buttons for ``action`` (approve, deny, answers, cancel...)."""
    found = []
    for element in walk(card):
        if element.get("tag") != "button":
            continue
        for behavior in element.get("behaviors") or []:
            value = behavior.get("value")
            if isinstance(value, dict) and value.get("action") == action:
                found.append(value)
    return found


def first_choices(card: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]] | None:
    """What a user submits on the card's form: each select's first option, and the submit button."""
    form: dict[str, Any] = {}
    submit: dict[str, Any] | None = None
    for element in walk(card):
        options = element.get("options")
        if element.get("tag") == "select_static" and options:
            form[element["name"]] = options[0]["value"]
        elif element.get("tag") == "multi_select_static" and options:
            form[element["name"]] = [options[0]["value"]]
        elif element.get("tag") == "button" and element.get("form_action_type") == "submit":
            submit = {"value": element["behaviors"][0]["value"], "button_name": element.get("name")}
    return None if submit is None else (form, submit)


@dataclass
class SandboxUser:
    """Reads the sandbox's cards and clicks on them; use inside an open ``aiohttp.ClientSession``."""

    http: aiohttp.ClientSession
    base_url: str
    token: str | None = None

    def _headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"} if self.token else {}

    async def card(self, message_id: str) -> Card:
        """The card as the sandbox holds it now (its latest send or update)."""
        url = f"{self.base_url}/sandbox/api/messages"
        async with self.http.get(url, headers=self._headers()) as response:
            response.raise_for_status()
            messages = (await response.json())["messages"]
        for message in messages:
            if message["message_id"] == message_id:
                card: Card = message["card"]
                return card
        raise LookupError(f"the sandbox holds no message {message_id}")

    async def wait_for(self, message_id: str, ready: Callable[[Card], bool], timeout: float = 20) -> Card:
        """The card once ``ready(card)`` holds; AssertionError after ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        card: Card = {}
        while time.monotonic() < deadline:
            card = await self.card(message_id)
            if ready(card):
                return card
            await asyncio.sleep(POLL_SECONDS)
        raise AssertionError(f"the card never got there: {card.get('header')}")

    async def click(
        self,
        message_id: str,
        value: Mapping[str, Any],
        *,
        form_value: Mapping[str, Any] | None = None,
        button_name: str | None = None,
        operator: str | None = None,
    ) -> dict[str, Any]:
        """One click; the service's answer (``toast``, ``card``) as Feishu would get it."""
        body: dict[str, Any] = {"message_id": message_id, "value": dict(value)}
        if form_value is not None:
            body["form_value"] = dict(form_value)
        if button_name:
            body["button_name"] = button_name
        if operator:
            body["operator"] = operator
        url = f"{self.base_url}/sandbox/api/click"
        async with self.http.post(url, json=body, headers=self._headers()) as response:
            answer: dict[str, Any] = await response.json()
        if response.status != 200 or answer.get("status") != 200:
            raise RuntimeError(f"the sandbox did not take the click: {response.status} {answer}")
        reply: dict[str, Any] = answer["answer"]
        return reply

    async def press(self, message_id: str, action: str, *, operator: str | None = None) -> dict[str, Any]:
        """Click the card's first ``action`` button (waiting for it to appear)."""
        card = await self.wait_for(message_id, lambda card: bool(buttons(card, action)))
        return await self.click(message_id, buttons(card, action)[0], operator=operator)

    async def answer_first_choices(self, message_id: str, *, operator: str | None = None) -> dict[str, Any]:
        """Submit the card's form with each question's first option (waiting for the form)."""
        card = await self.wait_for(message_id, lambda card: first_choices(card) is not None)
        chosen = first_choices(card)
        assert chosen is not None
        form, submit = chosen
        return await self.click(
            message_id, submit["value"], form_value=form, button_name=submit["button_name"], operator=operator
        )

    async def auto_answer(self, message_id: str, *, approve: bool = True) -> None:
        """Until the task ends: approve (or deny) every approval and answer every form on its card."""
        while True:
            card = await self.card(message_id)
            if card.get("header", {}).get("template") in TERMINAL_TEMPLATES:
                return
            decision = buttons(card, "approve" if approve else "deny")
            chosen = first_choices(card)
            if decision:
                await self.click(message_id, decision[0])
            elif chosen is not None:
                await self.click(message_id, chosen[1]["value"], form_value=chosen[0],
                                 button_name=chosen[1]["button_name"])  # fmt: skip
            await asyncio.sleep(POLL_SECONDS)
