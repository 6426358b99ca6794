"""Cluster mode (issue 12): three ``feishu-progress serve`` instances on one MariaDB database and one
Redis, against one sandbox process, behind a random load balancer (tests/cluster_harness.py).

What every test asserts, from the sandbox's log of what reached "Feishu" (tests/cluster_checks.py):
no rate-limit answer; never two updates of one message in flight at once; no card changes after its
final status; every final delivered; every event applied once and in order. Per scenario: clicks and
events spread over all instances, each action recorded once; ``kill -9`` of an owner (its cards taken
over within 10 s); SIGSTOP of an owner for 14 s (taken over within 10 s, and once resumed it never
writes a card it lost, and clicks on its cards are answered by the others within 3 s); SIGTERM of an
owner (cards handed over within 2 s, exit 0); a Redis restart mid-run, and one during such a pause.
While a writer is dead or paused, no batch is answered 503: the others store them in the event log.

The sandbox's app budget is set low (10/s, 400/min per API) and so is the instances' (FP_RATE__*), so
a dozen streaming cards ask for several times what the app may spend: three instances that did not
share one budget would draw 429s. Takeover times are measured from the kill to the first update of a
victim's card by another instance; a card is only updated when something changed, so the streamer's
longest gap between two events of a task (``TAKEOVER_SLACK``) is allowed on top.

Skipped until cluster mode lands (``feishu_progress.cluster.mode``); written against the issue's
contract so they run unchanged then.
"""

from __future__ import annotations

import asyncio
import importlib.util
import math
import os
import time
from collections.abc import AsyncIterator, Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
import redis
from prometheus_client.parser import text_string_to_metric_families

from feishu_progress.domain import TaskStatus
from tests.cluster_checks import (
    card_status,
    last_writers,
    out_of_order_events,
    overlapping_updates,
    rate_limit_answers,
    regressions_after_final,
    takeover_seconds,
    writes_by,
)
from tests.cluster_harness import Cluster, ClusterOptions, TaskRun, Workload, eventually
from tests.conftest import fresh_mysql_database
from tests.redis_server import OwnRedis, own_redis_server

pytestmark = [
    pytest.mark.cluster,
    pytest.mark.mysql,
    pytest.mark.slow,
    pytest.mark.skipif(
        importlib.util.find_spec("feishu_progress.cluster.mode") is None,
        reason="cluster mode not implemented yet",
    ),
]

INSTANCES = 3
DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/7"  # this suite's own database on the shared test Redis
APP_PER_SECOND, APP_PER_MINUTE = 10, 400
SANDBOX_ARGS = (
    "--latency-ms",
    "30",  # Feishu takes time to answer: two writers of one card would overlap in flight
    "--app-per-second",
    str(APP_PER_SECOND),
    "--app-per-minute",
    str(APP_PER_MINUTE),
)
INSTANCE_ENV = {
    "FP_RATE__APP_PER_SECOND": str(APP_PER_SECOND),
    "FP_RATE__APP_PER_MINUTE": str(APP_PER_MINUTE),
    "FP_CARDKIT__APP_PER_SECOND": str(APP_PER_SECOND),
    "FP_CARDKIT__APP_PER_MINUTE": str(APP_PER_MINUTE),
}
EVENT_INTERVAL = 0.3  # a task's events come every 0.15-0.45 s (Workload.stream)
TAKEOVER_SLACK = 0.5
KILL_TAKEOVER_SECONDS = 10.0
# SIGSTOP this long: past the lease and a takeover, under the harness's 15 s request timeout (a batch
# the paused instance had already received is answered once it runs again).
PAUSE_SECONDS = 14.0
# The 10 s promise holds with Redis down during the takeover too (each instance then spends its local
# share of the budget): measured worst card 6.35, 5.45 and 6.30 s (was 7.1, 9.6 and 12.8 s before the
# scan stopped waiting on catch-ups and urgent calls went first at the gate; issue 26 item 3).
REDIS_DOWN_TAKEOVER_SECONDS = KILL_TAKEOVER_SECONDS
SIGTERM_TAKEOVER_SECONDS = 2.0
CALLBACK_DEADLINE_SECONDS = 3.0  # Feishu's
FINALS = (TaskStatus.COMPLETED, TaskStatus.FAILED, TaskStatus.CANCELLED)
INSTANCE_IDS = frozenset(f"fp-{index}" for index in range(INSTANCES))


def cluster_redis_url() -> str:
    return os.environ.get("FP_TEST_CLUSTER_REDIS_URL", DEFAULT_REDIS_URL)


@pytest.fixture
def shared_redis() -> Iterator[str]:
    """Database 7 of the shared test Redis, emptied first; skipped without Redis (fails under CI=true)."""
    url = cluster_redis_url()
    client = redis.Redis.from_url(url, socket_connect_timeout=2, socket_timeout=2)
    try:
        client.flushdb()
    except redis.RedisError as exc:
        message = f"Redis at FP_TEST_CLUSTER_REDIS_URL={url} is unreachable ({exc})"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(message + "; CI=true requires it", pytrace=False)
        pytest.skip(message)
    finally:
        client.close()
    yield url


@pytest.fixture
def private_redis() -> Iterator[OwnRedis]:
    with own_redis_server() as server:
        yield server


@pytest.fixture
def database_url() -> str:
    return fresh_mysql_database("cluster")


@pytest.fixture
async def cluster(tmp_path: Path) -> AsyncIterator[Cluster]:
    async with Cluster(tmp_path) as running:
        yield running


async def start(cluster: Cluster, database_url: str, redis_url: str) -> None:
    await cluster.start_sandbox(*SANDBOX_ARGS)
    await cluster.start(INSTANCES, ClusterOptions(database_url, redis_url, dict(INSTANCE_ENV)))


def assert_the_invariants(log: Mapping[str, Any], workload: Workload) -> None:
    """What must hold after every scenario (module docstring)."""
    messages = log["messages"]
    assert len(messages) == len(workload.tasks), "one card per task, never a second one"
    assert rate_limit_answers(messages) == [] and log["rate_limited"] == 0
    assert overlapping_updates(messages) == []
    assert regressions_after_final(messages) == []
    assert out_of_order_events(messages, workload.expected_marks()) == []
    senders = {update["instance"] for message in messages for update in message["updates"]}
    assert senders <= INSTANCE_IDS, f"every update names its instance (X-FP-Instance): {senders}"


def busiest_writer(log: Mapping[str, Any], at: float) -> tuple[str, set[str]]:
    """The instance that wrote the most cards last before ``at``, and those cards."""
    writers = last_writers(log["messages"], at)
    victim = max(INSTANCE_IDS, key=lambda who: sum(1 for w in writers.values() if w == who))
    owned = {message_id for message_id, who in writers.items() if who == victim}
    assert owned, f"nobody wrote any card before {at}: {writers}"
    return victim, owned


async def batches_logged(cluster: Cluster, *skipped: str) -> float:
    """Event batches the instances (but ``skipped``) stored in the event log for an absent writer."""
    live = [index for index in range(INSTANCES) if f"fp-{index}" not in skipped]
    texts = await asyncio.gather(*(cluster.metrics(index) for index in live))
    return sum(metric(text, "fp_events_logged_total") for text in texts)


def seconds_summary(taken: Mapping[str, float]) -> str:
    ordered = sorted(taken.values())
    return f"at most {ordered[-1]:.2f} s, p50 {ordered[len(ordered) // 2]:.2f} s"


def index_of(instance_id: str) -> int:
    return int(instance_id.removeprefix("fp-"))


def metric(text: str, name: str, labels: Mapping[str, str] | None = None) -> float:
    """The sum of the samples of ``name`` whose labels include ``labels``."""
    wanted = dict(labels or {})
    return sum(
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == name and wanted.items() <= sample.labels.items()
    )


async def card_shows(cluster: Cluster, message_id: str, status: TaskStatus) -> None:
    async def shown() -> bool | None:
        log = await cluster.sandbox_log()
        card = next(m["card"] for m in log["messages"] if m["message_id"] == message_id)
        return True if card_status(card) is status else None

    await eventually(shown, 15, f"{message_id} to show {status}")


async def click(cluster: Cluster, task: TaskRun, value: Mapping[str, Any], **form: Any) -> None:
    """One click delivered twice (Feishu redelivers), each time to a random instance: answered in time."""
    payload = cluster.click_payload(task.message_id, value, form=form or None)
    first = await cluster.deliver(payload)
    assert first.status == 200, first.body
    assert first.body["toast"]["type"] == "success", first.body
    assert first.seconds < CALLBACK_DEADLINE_SECONDS, f"answered in {first.seconds:.2f} s"
    again = await cluster.deliver(payload)
    assert again.status == 200 and again.seconds < CALLBACK_DEADLINE_SECONDS, again


def api() -> dict[str, str]:
    return Cluster.api_headers()


def dislike(task: TaskRun) -> dict[str, Any]:
    return {"v": 1, "action": "dislike", "session_id": task.session_id}


# --- the scenarios ----------------------------------------------------------------------------------


async def test_three_instances_share_events_clicks_and_one_budget(
    cluster: Cluster, database_url: str, shared_redis: str
) -> None:
    await start(cluster, database_url, shared_redis)
    for index in range(INSTANCES):
        ready = await cluster.readyz(index)
        assert ready.status == 200, ready.body
        checks = " ".join(ready.body["checks"])
        assert "redis" in checks and "lease" in checks, f"/readyz reports Redis and the lease: {ready.body}"
    workload = Workload(cluster)
    tasks = await workload.create(12)
    clicked = tasks[:3]

    async def clicks() -> None:
        for _ in range(3):  # three dislikes per task (a toggle: it ends disliked), each delivered twice
            await asyncio.sleep(1.0)
            await asyncio.gather(*(click(cluster, task, dislike(task)) for task in clicked))

    async def owners() -> list[dict[str, Any]]:
        await asyncio.sleep(4)
        listed = await asyncio.gather(*(cluster.admin_cards(index) for index in range(INSTANCES)))
        return [card for cards in listed for card in cards]

    _, _, admin = await asyncio.gather(workload.stream(seconds=8), clicks(), owners())
    owner_of = {card["session_id"]: card.get("owner") for card in admin}
    assert {task.session_id for task in tasks} <= owner_of.keys(), "/admin/cards lists every live card"
    assert set(owner_of.values()) <= INSTANCE_IDS, owner_of

    asker = tasks[3]  # a question answered through whichever instance the click reaches
    ask = {"type": "ask", "ask_id": "a1", "questions": [{"question": "继续吗?", "options": ["继续", "停止"]}]}
    await workload.send(asker, ask)
    await card_shows(cluster, asker.message_id, TaskStatus.WAITING)
    answer = {"v": 1, "action": "answers", "session_id": asker.session_id, "ask_id": "a1"}
    await click(cluster, asker, answer, q0_0="0")

    await workload.finish(FINALS)
    log = await workload.settled()
    assert_the_invariants(log, workload)
    writers = {update["instance"] for message in log["messages"] for update in message["updates"]}
    assert len(writers) >= 2, f"the cards were spread over the instances: {writers}"

    for task in clicked:
        actions = (await cluster.actions(task.session_id))["actions"]
        assert [action["kind"] for action in actions] == ["dislike"] * 3, actions
    (answered,) = (await cluster.actions(asker.session_id))["actions"]
    assert answered["kind"] == "answers"
    for index in range(INSTANCES):  # any instance answers for any task
        for task in clicked:
            view = (await cluster.request(index, "GET", f"/v1/tasks/{task.session_id}", headers=api())).body
            assert (view["status"], view["disliked"]) == (task.final.value if task.final else None, True)

    await assert_one_shared_budget(cluster, log)


async def assert_one_shared_budget(cluster: Cluster, log: Mapping[str, Any]) -> None:
    """Each instance's /metrics: on the shared budget, which granted every update the sandbox saw."""
    texts = await asyncio.gather(*(cluster.metrics(index) for index in range(INSTANCES)))
    for text in texts:
        assert metric(text, "fp_budget_mode", {"mode": "shared"}) == 1
    updates = sum(len(message["updates"]) for message in log["messages"])
    grants = sum(metric(text, "fp_budget_grants_total") for text in texts)
    assert grants >= updates, f"every update went through the shared budget: {grants} grants, {updates}"
    print(f"\n3 instances: {updates} updates, {grants:.0f} grants")


async def test_kill9_of_an_owner_its_cards_are_taken_over_within_10_s(
    cluster: Cluster, database_url: str, shared_redis: str
) -> None:
    await start(cluster, database_url, shared_redis)
    workload = Workload(cluster)
    await workload.create(9)
    streaming = asyncio.create_task(workload.stream(seconds=18, interval=EVENT_INTERVAL))
    try:
        await asyncio.sleep(5)
        victim, owned = busiest_writer(await cluster.sandbox_log(), at=float("inf"))
        killed_at = await cluster.kill9(index_of(victim))
        await streaming
    finally:
        streaming.cancel()
    await workload.finish(FINALS)
    log = await workload.settled()

    assert_the_invariants(log, workload)
    # The live instances stored what the dead writer could not take: not one batch answered 503.
    assert workload.retried == 0, f"{workload.retried} batches answered 503 after {victim} was killed"
    logged = await batches_logged(cluster, victim)
    assert logged > 0, "the dead writer's batches went through the event log"
    taken = takeover_seconds(log["messages"], victim, killed_at)
    assert owned <= taken.keys()
    print(
        f"\nkill -9 {victim}: {len(taken)} cards taken over in {seconds_summary(taken)}; {logged:.0f} logged"
    )
    slow = {m: s for m, s in taken.items() if s > KILL_TAKEOVER_SECONDS + TAKEOVER_SLACK}
    assert not slow, f"{victim} killed: cards taken over too late (s): {slow}"


async def test_a_paused_owner_loses_its_cards_and_never_writes_them_after_it_resumes(
    cluster: Cluster, database_url: str, shared_redis: str
) -> None:
    await start(cluster, database_url, shared_redis)
    await pause_an_owner(cluster, redis=None)


async def test_a_paused_owner_and_a_redis_restart_meanwhile_still_hand_over_within_10_s(
    cluster: Cluster, database_url: str, private_redis: OwnRedis
) -> None:
    """Issue 26's chaos run: Redis is down for 6 s of the pause (no nudges, each budget ÷ instances)."""
    await start(cluster, database_url, private_redis.url)
    await pause_an_owner(cluster, redis=private_redis, takeover_within=REDIS_DOWN_TAKEOVER_SECONDS)


async def pause_an_owner(
    cluster: Cluster, redis: OwnRedis | None, takeover_within: float = KILL_TAKEOVER_SECONDS
) -> None:
    """SIGSTOP the busiest writer for PAUSE_SECONDS while 9 cards stream (and Redis restarts 2 s in)."""
    workload = Workload(cluster)
    tasks = await workload.create(9)
    streaming = asyncio.create_task(workload.stream(seconds=26, interval=EVENT_INTERVAL))
    try:
        await asyncio.sleep(5)
        victim, owned = busiest_writer(await cluster.sandbox_log(), at=float("inf"))
        stopped_at = cluster.sigstop(index_of(victim))
        if redis is not None:
            await asyncio.sleep(2)
            redis.stop()
        await asyncio.sleep(3)
        # Clicks on the paused owner's cards: another instance answers, in Feishu's 3 s.
        victims = [task for task in tasks if task.message_id in owned]
        await asyncio.gather(*(click(cluster, task, dislike(task)) for task in victims))
        if redis is not None:
            await asyncio.sleep(max(0.0, 8 - (time.monotonic() - stopped_at)))
            redis.start()  # down 6 s, back empty
        await asyncio.sleep(max(0.0, PAUSE_SECONDS - (time.monotonic() - stopped_at)))
        resumed_at = cluster.sigcont(index_of(victim))
        await streaming
    finally:
        streaming.cancel()
    await workload.finish(FINALS)
    log = await workload.settled()

    assert_the_invariants(log, workload)
    # The others stored what the paused writer could not take: not one batch answered 503.
    assert workload.retried == 0, f"{workload.retried} batches answered 503 while {victim} was paused"
    assert await batches_logged(cluster) > 0, "the paused writer's batches went through the event log"
    taken = takeover_seconds(log["messages"], victim, stopped_at)
    print(f"\nSIGSTOP {victim}: {len(taken)} cards taken over in {seconds_summary(taken)}")
    slow = {m: s for m, s in taken.items() if s > takeover_within + TAKEOVER_SLACK}
    assert not slow, f"{victim} paused: cards taken over too late (s): {slow}"
    # Its lease expired while it was paused: once running again it must not write a card it lost
    # (nobody died after that, so no card is orphaned for it to take back).
    assert writes_by(log["messages"], victim, since=resumed_at, message_ids=taken) == []
    for task in victims:
        actions = (await cluster.actions(task.session_id))["actions"]
        assert [action["kind"] for action in actions] == ["dislike"], actions


async def test_sigterm_of_an_owner_hands_its_cards_over_within_2_s(
    cluster: Cluster, database_url: str, shared_redis: str
) -> None:
    await start(cluster, database_url, shared_redis)
    workload = Workload(cluster)
    await workload.create(9)
    streaming = asyncio.create_task(workload.stream(seconds=12, interval=EVENT_INTERVAL))
    try:
        await asyncio.sleep(5)
        victim, owned = busiest_writer(await cluster.sandbox_log(), at=float("inf"))
        stopped = await cluster.sigterm(index_of(victim))
        await streaming
    finally:
        streaming.cancel()
    await workload.finish(FINALS)
    log = await workload.settled()

    assert stopped.code == 0, f"{victim} exited {stopped.code} after SIGTERM"
    assert_the_invariants(log, workload)
    taken = takeover_seconds(log["messages"], victim, stopped.signalled_at)
    assert owned <= taken.keys()
    slow = {m: s for m, s in taken.items() if s > SIGTERM_TAKEOVER_SECONDS + TAKEOVER_SLACK}
    assert not slow, f"{victim} stopped: cards handed over too late (s): {slow}"


async def test_a_redis_restart_mid_run_loses_nothing_and_draws_no_429(
    cluster: Cluster, database_url: str, private_redis: OwnRedis
) -> None:
    await start(cluster, database_url, private_redis.url)
    workload = Workload(cluster)
    await workload.create(9)
    streaming = asyncio.create_task(workload.stream(seconds=16, interval=EVENT_INTERVAL))
    try:
        await asyncio.sleep(4)
        private_redis.stop()  # every instance spends budget ÷ live instances on its own meanwhile
        await asyncio.sleep(2)
        while_down = await cluster.readyz(0)
        assert "redis" in str(while_down.body), while_down.body  # /readyz reports Redis
        await asyncio.sleep(2)
        private_redis.start()  # same port, empty
        await streaming
    finally:
        streaming.cancel()
    await workload.finish(FINALS)
    log = await workload.settled()
    assert_the_invariants(log, workload)

    async def shared_again() -> bool | None:
        texts = await asyncio.gather(*(cluster.metrics(index) for index in range(INSTANCES)))
        modes = [metric(text, "fp_budget_mode", {"mode": "shared"}) for text in texts]
        return True if all(math.isclose(mode, 1) for mode in modes) else None

    await eventually(shared_again, 20, "every instance back on the shared budget")
