"""The sandbox's CardKit endpoints enforce Feishu's rules with its codes, over real HTTP (raw aiohttp)."""

from __future__ import annotations

import json
import logging
import math
from collections.abc import AsyncIterator, Callable
from typing import Any

import aiohttp
import pytest

from feishu_progress.sandbox import RunningSandbox, SandboxConfig, SandboxMessage
from tests.fakes import FakeClock

CARDS = "/open-apis/cardkit/v1/cards"


def entity_card(answer: str = "", *, streaming: bool = True, elements: int = 0) -> dict[str, Any]:
    """A card with a streamable markdown ("answer"), a plain_text ("status") and an hr ("rule")."""
    return {
        "schema": "2.0",
        "config": {"update_multi": True, "streaming_mode": streaming},
        "body": {
            "elements": [
                {"tag": "markdown", "content": answer, "element_id": "answer"},
                {"tag": "div", "text": {"tag": "plain_text", "content": "", "element_id": "status"}},
                {"tag": "hr", "element_id": "rule"},
                *({"tag": "markdown", "content": f"filler {i}"} for i in range(elements)),
            ]
        },
    }


class Api:
    """A bare Open API caller: answers are (HTTP status, JSON body, headers), nothing is interpreted."""

    def __init__(self, session: aiohttp.ClientSession, base_url: str) -> None:
        self._session = session
        self._base = base_url
        self._token = ""

    async def login(self) -> None:
        _, body, _ = await self.call("POST", "/open-apis/auth/v3/tenant_access_token/internal", {})
        self._token = body["tenant_access_token"]

    async def call(
        self, method: str, path: str, body: dict[str, Any]
    ) -> tuple[int, dict[str, Any], dict[str, str]]:
        headers = {"Authorization": f"Bearer {self._token}"} if self._token else {}
        async with self._session.request(method, self._base + path, json=body, headers=headers) as response:
            text = await response.text()
            parsed = json.loads(text) if response.content_type == "application/json" else {"html": text}
            return response.status, parsed, dict(response.headers)

    async def code(self, method: str, path: str, body: dict[str, Any]) -> int:
        status, answer, _ = await self.call(method, path, body)
        return int(answer.get("code", status))

    # --- the calls ------------------------------------------------------------------------------

    async def create(self, card: dict[str, Any] | None = None) -> str:
        status, answer, _ = await self.call("POST", CARDS, create_body(card or entity_card()))
        assert (status, answer["code"]) == (200, 0), answer
        return str(answer["data"]["card_id"])

    async def send(self, card_id: str, uuid: str = "") -> tuple[int, dict[str, Any]]:
        body = {
            "receive_id": "ou_user",
            "msg_type": "interactive",
            "content": reference(card_id),
            "uuid": uuid,
        }
        status, answer, _ = await self.call("POST", "/open-apis/im/v1/messages?receive_id_type=open_id", body)
        return status, answer

    async def sent(self, card_id: str) -> str:
        status, answer = await self.send(card_id)
        assert (status, answer["code"]) == (200, 0), answer
        return str(answer["data"]["message_id"])

    async def content(
        self, card_id: str, text: str, sequence: int, uuid: str = "", element: str = "answer"
    ) -> int:
        body = {"content": text, "sequence": sequence, "uuid": uuid}
        return await self.code("PUT", f"{CARDS}/{card_id}/elements/{element}/content", body)

    async def update(self, card_id: str, card: dict[str, Any], sequence: int, uuid: str = "") -> int:
        body = {"card": create_body(card), "sequence": sequence, "uuid": uuid}
        return await self.code("PUT", f"{CARDS}/{card_id}", body)

    async def settings(self, card_id: str, settings: dict[str, Any], sequence: int, uuid: str = "") -> int:
        body = {"settings": json.dumps(settings), "sequence": sequence, "uuid": uuid}
        return await self.code("PATCH", f"{CARDS}/{card_id}/settings", body)


def create_body(card: dict[str, Any]) -> dict[str, Any]:
    return {"type": "card_json", "data": json.dumps(card, ensure_ascii=False)}


def reference(card_id: str) -> str:
    return json.dumps({"type": "card", "data": {"card_id": card_id}})


def streaming_off() -> dict[str, Any]:
    return {"config": {"streaming_mode": False}}


def streaming_on() -> dict[str, Any]:
    return {"config": {"streaming_mode": True}}


def answer_text(card: dict[str, Any]) -> str:
    return str(card["body"]["elements"][0]["content"])


@pytest.fixture
def sandbox_config() -> SandboxConfig:
    return SandboxConfig()  # any app: a login with no id or secret gets a token


@pytest.fixture
def sandbox_clock(clock: FakeClock) -> Callable[[], float]:
    return clock.monotonic  # streaming windows and entity lifetimes move only when a test advances


@pytest.fixture
async def api(sandbox: RunningSandbox) -> AsyncIterator[Api]:
    async with aiohttp.ClientSession() as session:
        caller = Api(session, sandbox.base_url)
        await caller.login()
        yield caller


def message_of(sandbox: RunningSandbox, message_id: str) -> SandboxMessage:
    return sandbox.state.messages[message_id]


# --- the happy path ------------------------------------------------------------------------------


async def test_create_send_stream_update_and_close(api: Api, sandbox: RunningSandbox) -> None:
    card_id = await api.create()
    assert card_id == "7sandbox000001"
    message_id = await api.sent(card_id)
    message = message_of(sandbox, message_id)
    assert message.card_id == card_id
    assert message.card == entity_card()
    for sequence, text in enumerate(["Hel", "Hello", "Hello, world"], start=1):
        assert await api.content(card_id, text, sequence) == 0
        assert answer_text(message.card) == text
    assert await api.content(card_id, "working", 4, element="status") == 0
    assert message.card["body"]["elements"][1]["text"]["content"] == "working"
    assert await api.update(card_id, entity_card("Final answer"), 5) == 0
    assert message.card == entity_card("Final answer")  # a full update replaces streamed texts too
    assert await api.settings(card_id, streaming_off(), 6) == 0
    assert message.card == entity_card("Final answer", streaming=False)
    record = message.cardkit
    assert record is not None
    assert dict(record.updates) == {"content": 4, "full": 1, "settings": 1}
    assert record.last_error is None
    assert len(message.history) == 1 + 6
    assert [answer_text(card) for _, card in message.history[:4]] == ["", "Hel", "Hello", "Hello, world"]


async def test_streamed_updates_record_prefix_or_rewrite(api: Api, sandbox: RunningSandbox) -> None:
    card_id = await api.create()
    message = message_of(sandbox, await api.sent(card_id))
    for sequence, text in enumerate(["ab", "abcd", "xyz", "xyz!"], start=1):
        assert await api.content(card_id, text, sequence) == 0
    assert message.cardkit is not None
    assert [(u.prefix, u.chars, u.sequence) for u in message.cardkit.streams] == [
        (True, 2, 1),
        (True, 4, 2),
        (False, 3, 3),
        (True, 4, 4),
    ]


async def test_updates_before_sending_show_in_the_sent_message(api: Api, sandbox: RunningSandbox) -> None:
    card_id = await api.create()
    assert await api.content(card_id, "early text", 1) == 0
    message = message_of(sandbox, await api.sent(card_id))
    assert answer_text(message.card) == "early text"
    assert message.cardkit is not None
    assert message.cardkit.updates["content"] == 1


async def test_reply_by_reference_shows_the_entity(api: Api, sandbox: RunningSandbox) -> None:
    parent = await api.sent(await api.create())
    card_id = await api.create(entity_card("in the thread"))
    body = {"msg_type": "interactive", "content": reference(card_id), "reply_in_thread": True}
    status, answer, _ = await api.call("POST", f"/open-apis/im/v1/messages/{parent}/reply", body)
    assert (status, answer["code"]) == (200, 0)
    reply = message_of(sandbox, answer["data"]["message_id"])
    assert (reply.parent_id, reply.card_id, answer_text(reply.card)) == (parent, card_id, "in the thread")


async def test_stats_count_cardkit_work(api: Api) -> None:
    card_id = await api.create()
    await api.sent(card_id)
    assert await api.content(card_id, "a", 1) == 0
    assert await api.content(card_id, "b", 2) == 0
    assert await api.settings(card_id, streaming_off(), 3) == 0
    assert await api.content(card_id, "late", 4) == 300309
    _, stats, _ = await api.call("GET", "/_sandbox/stats", {})
    assert stats["cardkit"] == {
        "cards": 1,
        "created": 1,
        "sent": 1,
        "full": 0,
        "settings": 1,
        "content": 2,
        "prefix": 1,
        "rewrite": 1,
        "dropped": 0,
        "windows_closed": 0,
    }
    assert stats["requests"]["card_content"] == 3
    assert stats["responses"]["300309"] == 1


# --- cards refused -------------------------------------------------------------------------------


def _with(card: dict[str, Any], **changes: Any) -> dict[str, Any]:
    return {**card, **changes}


REFUSED_CARDS = [
    pytest.param(_with(entity_card(), schema="1.0"), 300303, id="schema-not-2.0"),
    pytest.param(_with(entity_card(), config={"update_multi": False}), 300302, id="update_multi-false"),
    pytest.param(entity_card("x" * 31 * 1024), 200860, id="over-30KB"),
    pytest.param(entity_card(elements=197), 300305, id="over-200-elements"),
    pytest.param(
        _with(
            entity_card(),
            body={"elements": [{"tag": "hr", "element_id": "a"}, {"tag": "hr", "element_id": "a"}]},
        ),
        300301,
        id="duplicate-element_id",
    ),
    pytest.param(_with(entity_card(), body={"elements": [{"tag": "note"}]}), 230099, id="invalid-tag"),
]


@pytest.mark.parametrize(("card", "code"), REFUSED_CARDS)
async def test_create_refuses_with_cardkit_codes(
    api: Api, sandbox: RunningSandbox, card: dict[str, Any], code: int
) -> None:
    assert await api.code("POST", CARDS, create_body(card)) == code
    assert sandbox.state.cardkit.cards == {}


async def test_create_accepts_exactly_200_elements_and_needs_card_json(api: Api) -> None:
    assert await api.code("POST", CARDS, create_body(entity_card(elements=196))) == 0
    assert await api.code("POST", CARDS, {"type": "template", "data": json.dumps(entity_card())}) == 99992402
    assert await api.code("POST", CARDS, {"type": "card_json", "data": "{not json"}) == 230099


@pytest.mark.parametrize(("card", "code"), REFUSED_CARDS)
async def test_full_update_refuses_like_create_and_changes_nothing(
    api: Api, sandbox: RunningSandbox, card: dict[str, Any], code: int
) -> None:
    card_id = await api.create()
    message = message_of(sandbox, await api.sent(card_id))
    assert await api.update(card_id, card, 1) == code
    assert message.card == entity_card()
    assert len(message.history) == 1
    assert message.cardkit is not None
    assert message.cardkit.last_error == code
    assert await api.update(card_id, entity_card("fine"), 1) == 0  # the refused call used no sequence


# --- send by reference ---------------------------------------------------------------------------


async def test_unknown_card_id_is_200740(api: Api, sandbox: RunningSandbox) -> None:
    status, answer = await api.send("7sandbox999999")
    assert (status, answer["code"]) == (400, 200740)
    assert sandbox.state.messages == {}
    assert await api.content("7sandbox999999", "x", 1) == 200740


async def test_an_entity_is_sent_only_once(api: Api, sandbox: RunningSandbox) -> None:
    card_id = await api.create()
    first = await api.sent(card_id)
    status, answer = await api.send(card_id)
    assert (status, answer["code"]) == (400, 230099)
    assert "sent only once" in answer["msg"]
    assert list(sandbox.state.messages) == [first]


async def test_a_retried_send_with_the_same_uuid_is_the_same_message(
    api: Api, sandbox: RunningSandbox
) -> None:
    card_id = await api.create()
    _, first = await api.send(card_id, uuid="send-1")
    _, again = await api.send(card_id, uuid="send-1")
    assert again["code"] == 0
    assert again["data"]["message_id"] == first["data"]["message_id"]
    assert len(sandbox.state.messages) == 1


# --- streamed text ---------------------------------------------------------------------------------


async def test_content_needs_a_streamable_known_element(api: Api) -> None:
    card_id = await api.create()
    assert await api.content(card_id, "x", 1, element="rule") == 300310
    assert await api.content(card_id, "x", 2, element="nope") == 300313
    assert await api.content(card_id, "x", 3) == 0


async def test_content_is_limited_to_100000_characters(api: Api, sandbox: RunningSandbox) -> None:
    card_id = await api.create()
    assert await api.content(card_id, "y" * 100_001, 1) == 99992402
    assert await api.content(card_id, "y" * 100_000, 2) == 0
    assert answer_text(sandbox.state.cardkit.cards[card_id].card) == "y" * 100_000


async def test_content_needs_streaming_mode(api: Api, sandbox: RunningSandbox) -> None:
    card_id = await api.create(entity_card(streaming=False))
    message = message_of(sandbox, await api.sent(card_id))
    assert await api.content(card_id, "x", 1) == 300309
    assert await api.settings(card_id, streaming_on(), 2) == 0
    assert message.card["config"]["streaming_mode"] is True
    assert await api.content(card_id, "x", 3) == 0


async def test_settings_change_only_what_they_name(api: Api, sandbox: RunningSandbox) -> None:
    card_id = await api.create()
    message = message_of(sandbox, await api.sent(card_id))
    link = {"url": "https://example.com/task/1"}
    config = {"streaming_config": {"print_frequency_ms": {"default": 30}}}
    assert await api.settings(card_id, {"config": config, "card_link": link}, 1) == 0
    assert message.card["config"] == {**entity_card()["config"], **config}
    assert message.card["card_link"] == link
    assert message.card["body"] == entity_card()["body"]
    assert await api.settings(card_id, {"header": {}}, 2) == 99992402
    assert await api.settings(card_id, {"config": {"update_multi": False}}, 3) == 300302


# --- sequence --------------------------------------------------------------------------------------


async def test_sequence_must_rise_across_all_card_calls(api: Api) -> None:
    card_id = await api.create()
    assert await api.content(card_id, "a", 5) == 0
    assert await api.content(card_id, "ab", 5) == 300317
    assert await api.content(card_id, "ab", 4) == 300317
    assert await api.settings(card_id, streaming_on(), 5) == 300317
    assert await api.update(card_id, entity_card(), 5) == 300317
    assert await api.content(card_id, "ab", 9) == 0  # gaps are accepted
    assert await api.update(card_id, entity_card("c"), 10) == 0
    assert await api.settings(card_id, streaming_on(), 11) == 0


async def test_sequence_must_be_an_int32(api: Api) -> None:
    card_id = await api.create()
    for bad in (2**31, "3", 1.5, None, True):
        body = {"content": "x", "sequence": bad}
        assert await api.code("PUT", f"{CARDS}/{card_id}/elements/answer/content", body) == 99992402
    assert await api.content(card_id, "x", 2**31 - 1) == 0


@pytest.mark.parametrize("sandbox_config", [SandboxConfig(cardkit_sequence_gaps=False)])
async def test_sequence_gaps_can_be_refused(api: Api) -> None:
    card_id = await api.create()
    assert await api.content(card_id, "a", 1 << 20) == 0  # the first sequence may start anywhere
    assert await api.content(card_id, "ab", (1 << 20) + 2) == 300317
    assert await api.content(card_id, "ab", (1 << 20) + 1) == 0


# --- uuid --------------------------------------------------------------------------------------------


async def test_a_repeated_uuid_answers_as_the_first_time(api: Api, sandbox: RunningSandbox) -> None:
    card_id = await api.create()
    message = message_of(sandbox, await api.sent(card_id))
    assert await api.content(card_id, "once", 1, uuid="u-1") == 0
    assert await api.content(card_id, "once", 1, uuid="u-1") == 0  # not 300317: the same request
    assert len(message.history) == 2
    assert message.cardkit is not None
    assert message.cardkit.updates["content"] == 1
    assert await api.content(card_id, "other", 2, uuid="u-1") == 200770
    assert await api.settings(card_id, streaming_off(), 2, uuid="u-1") == 200770
    assert await api.content(card_id, "other", 2, uuid="u-2") == 0


async def test_a_refused_call_does_not_claim_its_uuid(api: Api) -> None:
    card_id = await api.create()
    assert await api.content(card_id, "x", 1, uuid="u-1", element="rule") == 300310
    assert await api.content(card_id, "x", 1, uuid="u-1") == 0


async def test_uuids_are_remembered_for_an_hour(api: Api, clock: FakeClock) -> None:
    card_id = await api.create(entity_card(streaming=False))
    assert await api.update(card_id, entity_card("v1", streaming=False), 1, uuid="u-1") == 0
    await clock.advance(3599)
    assert await api.update(card_id, entity_card("v1", streaming=False), 1, uuid="u-1") == 0
    await clock.advance(2)
    # Forgotten: the same request is now new, and its sequence is no longer greater.
    assert await api.update(card_id, entity_card("v1", streaming=False), 1, uuid="u-1") == 300317


# --- the streaming window --------------------------------------------------------------------------


async def test_streaming_closes_10_minutes_after_it_opened(
    api: Api, sandbox: RunningSandbox, clock: FakeClock
) -> None:
    card_id = await api.create()
    message = message_of(sandbox, await api.sent(card_id))
    await clock.advance(599)
    assert await api.content(card_id, "still open", 1) == 0
    await clock.advance(1)
    assert await api.content(card_id, "too late", 2) == 200850
    assert message.card["config"]["streaming_mode"] is False
    assert answer_text(message.card) == "still open"
    assert await api.content(card_id, "too late", 3) == 300309
    assert message.cardkit is not None
    assert message.cardkit.last_error == 300309
    assert await api.settings(card_id, streaming_on(), 4) == 0
    assert await api.content(card_id, "re-opened", 5) == 0
    assert answer_text(message.card) == "re-opened"


async def test_reopening_restarts_the_window(api: Api, clock: FakeClock) -> None:
    card_id = await api.create()
    await clock.advance(500)
    assert await api.settings(card_id, streaming_on(), 1) == 0
    await clock.advance(500)  # 1000 s after create, 500 s after re-opening
    assert await api.content(card_id, "open", 2) == 0
    await clock.advance(100)
    assert await api.content(card_id, "closed", 3) == 200850


async def test_a_full_update_keeps_an_open_window_and_opens_a_closed_one(api: Api, clock: FakeClock) -> None:
    card_id = await api.create()
    await clock.advance(300)
    assert await api.update(card_id, entity_card("panel"), 1) == 0  # still streaming: same window
    await clock.advance(300)
    assert await api.content(card_id, "late", 2) == 200850
    assert await api.update(card_id, entity_card("panel"), 3) == 0  # streaming true again: opens it
    assert await api.content(card_id, "streams again", 4) == 0


@pytest.mark.parametrize("sandbox_config", [SandboxConfig(time_scale=60)])
async def test_the_window_runs_on_scaled_sandbox_time(api: Api, clock: FakeClock) -> None:
    card_id = await api.create()
    await clock.advance(9.9)  # 594 sandbox seconds
    assert await api.content(card_id, "open", 1) == 0
    await clock.advance(0.2)
    assert await api.content(card_id, "closed", 2) == 200850


async def test_silently_dropped_updates_after_the_window(
    api: Api, sandbox: RunningSandbox, clock: FakeClock
) -> None:
    sandbox.state.faults.drop_expired_streams()
    card_id = await api.create()
    message = message_of(sandbox, await api.sent(card_id))
    assert await api.content(card_id, "shown", 1) == 0
    await clock.advance(600)
    assert await api.content(card_id, "lost", 2) == 0
    assert await api.content(card_id, "lost too", 3) == 0
    assert answer_text(message.card) == "shown"
    assert message.cardkit is not None
    assert (message.cardkit.dropped, message.cardkit.updates["content"]) == (2, 1)
    sandbox.state.faults.clear()
    assert await api.content(card_id, "now refused", 4) == 200850


# --- rates and budgets -------------------------------------------------------------------------------


async def test_ten_operations_per_second_per_card(api: Api, clock: FakeClock) -> None:
    card_id, other = await api.create(), await api.create()
    for sequence in range(1, 10):
        assert await api.content(card_id, "x" * sequence, sequence) == 0
    assert await api.settings(card_id, streaming_on(), 10) == 0  # every kind counts
    assert await api.content(card_id, "refused", 11) == 230020
    assert await api.content(other, "another card has its own", 1) == 0
    await clock.advance(1.0)
    assert await api.content(card_id, "next second", 11) == 0


@pytest.mark.parametrize("sandbox_config", [SandboxConfig(app_per_second=3, cardkit_per_card_qps=math.inf)])
async def test_each_cardkit_api_has_its_own_app_budget(api: Api, clock: FakeClock) -> None:
    card_id = await api.create()
    for sequence in range(1, 4):
        assert await api.content(card_id, "x" * sequence, sequence) == 0
    status, answer, headers = await api.call(
        "PUT", f"{CARDS}/{card_id}/elements/answer/content", {"content": "over", "sequence": 4}
    )
    assert (status, answer["code"], headers["x-ogw-ratelimit-reset"]) == (429, 99991400, "1")
    assert await api.settings(card_id, streaming_on(), 4) == 0  # settings: another budget
    assert await api.update(card_id, entity_card(), 5) == 0
    await clock.advance(1.0)
    assert await api.content(card_id, "again", 6) == 0


@pytest.mark.parametrize("sandbox_config", [SandboxConfig(app_per_second=math.inf, app_per_minute=2)])
async def test_create_has_a_per_minute_budget(api: Api) -> None:
    await api.create()
    await api.create()
    status, answer, _ = await api.call("POST", CARDS, create_body(entity_card()))
    assert (status, answer["code"]) == (429, 99991400)


@pytest.mark.parametrize("sandbox_config", [SandboxConfig(cardkit_scope=False)])
async def test_missing_scope_refuses_every_cardkit_call(api: Api) -> None:
    status, answer, _ = await api.call("POST", CARDS, create_body(entity_card()))
    assert (status, answer["code"]) == (400, 99991672)
    assert "cardkit:card:write" in answer["msg"]
    assert await api.content("7sandbox000001", "x", 1) == 99991672
    assert await api.settings("7sandbox000001", streaming_off(), 1) == 99991672
    assert await api.update("7sandbox000001", entity_card(), 1) == 99991672


async def test_entities_expire_14_days_after_create(api: Api, sandbox: RunningSandbox) -> None:
    sent, unsent = await api.create(), await api.create()
    await api.sent(sent)
    sandbox.state.cardkit.age_card(sent, 13.9)
    assert await api.update(sent, entity_card(), 1) == 0
    sandbox.state.cardkit.age_card(sent, 0.2)
    assert await api.update(sent, entity_card(), 2) == 200750
    sandbox.state.cardkit.age_card(unsent, 14.1)
    status, answer = await api.send(unsent)
    assert (status, answer["code"]) == (400, 200750)


# --- faults ------------------------------------------------------------------------------------------


async def test_faults_reach_the_cardkit_endpoints(
    api: Api, sandbox: RunningSandbox, clock: FakeClock
) -> None:
    card_id = await api.create()
    sandbox.state.faults.fail(1.0, status=503, endpoints=("card_content",))
    status, answer, _ = await api.call("PUT", f"{CARDS}/{card_id}/elements/answer/content", {"sequence": 1})
    assert status == 503
    assert "html" in answer
    assert await api.settings(card_id, streaming_on(), 1) == 0
    sandbox.state.faults.clear()
    sandbox.state.faults.storm_429(2.0)
    assert await api.code("POST", CARDS, create_body(entity_card())) == 99991400
    await clock.advance(2.1)
    assert await api.content(card_id, "calm", 2) == 0


# --- notifications -----------------------------------------------------------------------------------


async def test_listeners_hear_accepted_and_refused_calls_on_sent_cards(
    api: Api, sandbox: RunningSandbox, caplog: pytest.LogCaptureFixture
) -> None:
    heard: list[tuple[str, int]] = []

    def broken(message: SandboxMessage) -> None:
        raise RuntimeError("listener bug")

    def listen(message: SandboxMessage) -> None:
        heard.append((message.message_id, len(message.history)))

    sandbox.state.listeners.extend([broken, listen])
    unsent = await api.create()
    assert await api.content(unsent, "nobody shows this card", 1) == 0
    card_id = await api.create()
    message_id = await api.sent(card_id)
    heard.clear()  # sending is not a CardKit call; what follows is
    caplog.clear()
    with caplog.at_level(logging.ERROR, logger="feishu_progress.sandbox.state"):
        assert await api.content(card_id, "accepted", 1) == 0
        assert await api.content(card_id, "refused", 1) == 300317
        assert await api.settings(card_id, streaming_off(), 2) == 0
    assert heard == [(message_id, 2), (message_id, 2), (message_id, 3)]
    assert (
        sum("sandbox listener" in r.getMessage() and "failed" in r.getMessage() for r in caplog.records) == 3
    )
