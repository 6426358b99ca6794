"""Several ``feishu-progress serve`` processes against one sandbox process, one MariaDB database and (in
cluster mode) one Redis — the way an operator runs them — with a random load balancer in front and the
signals that break things: ``kill9``, ``sigstop``/``sigcont``, ``sigterm``, ``restart``.

Every process the harness starts (the sandbox included) runs in its own session, writes its output to a
file under the test's tmp_path, and is killed (its whole process group, SIGKILL, which also ends a
stopped process) when the harness closes: ``async with Cluster(...)`` closes it however the block ends,
and an ``atexit`` hook kills anything a crashed run left behind. These tests wait on real time: real
processes, real sockets.

The load balancer routes each call to a random *routable* instance: running, not paused, not being
stopped. Before a kill or a SIGTERM the instance is taken out of rotation and the harness's own calls to
it are let finish first, the way a load balancer drains a backend: a client never sees an ambiguous
failure (was my event applied?) that would make "every event applied once" untestable. The instance
itself is still killed abruptly, with whatever it was doing in flight.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import os
import random
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any, Self

import aiohttp

import feishu_progress
from feishu_progress.domain import TaskStatus
from feishu_progress.sandbox.clicks import card_action_payload, signed_request
from tests.cluster_checks import event_mark, undelivered_finals
from tests.rigs import eventually  # the cluster tests import it from here too

APP_ID, APP_SECRET = "cli_cluster", "cluster-secret"
ENCRYPT_KEY, VERIFICATION_TOKEN = "cluster-encrypt-key", "cluster-verification"
API_TOKEN, ADMIN_TOKEN = "cluster-api-token", "cluster-admin-token"
CLUSTER_SECRET = "cluster-secret-" + "s" * 32  # FP_CLUSTER__SECRET: what the instances sign clicks with
REQUESTER, CHAT = "ou_requester", "oc_cluster"
READY_SECONDS = 45.0
DRAIN_SECONDS = 5.0
REQUEST_SECONDS = 15.0
POLL_SECONDS = 0.1  # its waits read processes and the sandbox's whole log: not more often


_LIVE_CHILDREN: set[subprocess.Popen[bytes]] = set()


def _kill_leftovers() -> None:
    """Last resort when a run dies before its harness closed: no process outlives pytest."""
    for process in list(_LIVE_CHILDREN):
        if process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    _LIVE_CHILDREN.clear()


atexit.register(_kill_leftovers)


def free_port() -> int:
    """A port nobody listens on right now (a small race with other programs, as in the e2e tests)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def child_env(extra: Mapping[str, str]) -> dict[str, str]:
    """The test's environment without any FP_ setting, importing the same package as the test."""
    env = {key: value for key, value in os.environ.items() if not key.startswith("FP_")}
    package_root = str(Path(feishu_progress.__file__).resolve().parent.parent)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [package_root, env.get("PYTHONPATH", "")]))
    env.update(extra)
    return env


class Child:
    """One process the harness started: its own session (process group), its output in a file."""

    def __init__(self, name: str, argv: list[str], env: Mapping[str, str], workdir: Path) -> None:
        self.name = name
        self.argv = argv
        self.env = dict(env)
        self.workdir = workdir
        self.log_path = workdir / f"{name}.log"
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with self.log_path.open("ab") as log:
            # cwd: the test's directory, so a stray .env of the developer's is never read.
            self.process = subprocess.Popen(
                self.argv,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=self.env,
                cwd=self.workdir,
                start_new_session=True,
            )
        _LIVE_CHILDREN.add(self.process)

    @property
    def pid(self) -> int:
        assert self.process is not None, f"{self.name} was never started"
        return self.process.pid

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    @property
    def returncode(self) -> int | None:
        return None if self.process is None else self.process.poll()

    def signal(self, signum: int) -> None:
        """Send ``signum`` to the process group (the process and anything it started)."""
        if self.running:
            os.killpg(self.pid, signum)

    async def wait_exit(self, timeout: float) -> int | None:
        """The exit code, or None if it still runs after ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while self.running and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        return self.returncode

    def kill(self) -> None:
        """SIGKILL the whole group and reap the process; safe to call twice, and on a stopped process."""
        process = self.process
        if process is None:
            return
        if process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
        process.wait()
        _LIVE_CHILDREN.discard(process)

    def output(self, chars: int = 4000) -> str:
        """The end of what the process wrote (for failure reports)."""
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except FileNotFoundError:
            return ""


@dataclass
class Instance:
    """One ``feishu-progress serve`` of the cluster, with fixed ports that survive a restart."""

    index: int
    instance_id: str
    http_port: int
    admin_port: int
    child: Child | None = None
    paused: bool = False
    draining: bool = False
    in_flight: int = 0

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"

    @property
    def admin_url(self) -> str:
        return f"http://127.0.0.1:{self.admin_port}"

    @property
    def running(self) -> bool:
        return self.child is not None and self.child.running

    @property
    def routable(self) -> bool:
        """Would a load balancer send traffic here?"""
        return self.running and not self.paused and not self.draining


@dataclass(frozen=True)
class Reply:
    """One HTTP answer, and which instance gave it in how long."""

    status: int
    body: Any
    instance: int
    seconds: float


@dataclass(frozen=True)
class Exit:
    """How a SIGTERM ended: the exit code (None: still running), when it was sent, how long it took."""

    code: int | None
    signalled_at: float
    seconds: float


@dataclass
class ClusterOptions:
    """What every instance of one run shares."""

    database_url: str
    redis_url: str | None = None  # None: single-instance mode (FP_REDIS_URL unset)
    env: dict[str, str] = field(default_factory=dict)  # extra FP_ settings for every instance


class Cluster:
    """The sandbox process and N service processes; see the module docstring."""

    def __init__(self, workdir: Path, *, seed: int | None = None) -> None:
        self.workdir = workdir
        self.seed = seed if seed is not None else random.randrange(2**32)
        self.rng = random.Random(self.seed)
        self.sandbox: Child | None = None
        self.sandbox_url = ""
        self.instances: list[Instance] = []
        self.options: ClusterOptions | None = None
        self._http: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> Self:
        self._http = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=REQUEST_SECONDS))
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        try:
            self.close()
            if exc is not None:
                print(self.report())  # pytest shows it with the failure
        finally:
            if self._http is not None:
                await self._http.close()

    @property
    def http(self) -> aiohttp.ClientSession:
        assert self._http is not None, "use `async with Cluster(...)`"
        return self._http

    def close(self) -> None:
        """Kill every process the harness started (instances first, then the sandbox)."""
        for instance in self.instances:
            if instance.child is not None:
                instance.child.kill()
        if self.sandbox is not None:
            self.sandbox.kill()

    def report(self) -> str:
        """The seed and the end of every process's output."""
        children = [i.child for i in self.instances if i.child is not None]
        if self.sandbox is not None:
            children.insert(0, self.sandbox)
        parts = [f"--- {child.name} (exit {child.returncode}) ---\n{child.output()}" for child in children]
        return "\n".join([f"cluster harness seed={self.seed}", *parts])

    # --- starting -------------------------------------------------------------------------------

    async def start_sandbox(self, *args: str) -> str:
        """Run ``feishu-progress sandbox`` on a free port; returns its base URL."""
        argv = [sys.executable, "-m", "feishu_progress", "sandbox", "--port", "0"]
        argv += ["--app-id", APP_ID, "--app-secret", APP_SECRET, *args]
        self.sandbox = Child("sandbox", argv, child_env({}), self.workdir)
        self.sandbox.start()
        self.sandbox_url = await eventually(
            self._sandbox_announced, READY_SECONDS, "the sandbox's URL", interval=POLL_SECONDS
        )
        return self.sandbox_url

    async def _sandbox_announced(self) -> str | None:
        assert self.sandbox is not None
        lines = self.sandbox.output(chars=100_000).splitlines()
        url = next((line for line in lines if line.startswith("http://")), None)
        if url is None and not self.sandbox.running:
            raise AssertionError(f"the sandbox exited: {self.sandbox.output()}")
        return url

    async def start(self, count: int, options: ClusterOptions) -> list[Instance]:
        """Migrate the database, then start ``count`` instances and wait until each is ready."""
        if self.sandbox is None:
            await self.start_sandbox()
        self.options = options
        await self.migrate()
        for index in range(count):
            self.instances.append(Instance(index, f"fp-{index}", free_port(), free_port()))
        for instance in self.instances:
            self._spawn(instance)
        await asyncio.gather(*(self.wait_ready(instance.index) for instance in self.instances))
        return self.instances

    def env_for(self, instance: Instance | None) -> dict[str, str]:
        """The FP_ settings of ``instance`` (None: what ``migrate`` needs)."""
        options = self.options
        assert options is not None
        env = {
            "FP_DATABASE_URL": options.database_url,
            "FP_FEISHU__BASE_URL": self.sandbox_url,
            "FP_FEISHU__APP_ID": APP_ID,
            "FP_FEISHU__APP_SECRET": APP_SECRET,
            "FP_FEISHU__ENCRYPT_KEY": ENCRYPT_KEY,
            "FP_FEISHU__VERIFICATION_TOKEN": VERIFICATION_TOKEN,
            "FP_API__TOKEN": API_TOKEN,
            "FP_ADMIN__TOKEN": ADMIN_TOKEN,
            "FP_HTTP__HOST": "127.0.0.1",
            "FP_LOG_LEVEL": "INFO",
        }
        if options.redis_url is not None:
            env["FP_REDIS_URL"] = options.redis_url
            env["FP_CLUSTER__SECRET"] = CLUSTER_SECRET
        if instance is not None:
            env["FP_INSTANCE_ID"] = instance.instance_id
            env["FP_HTTP__PORT"] = str(instance.http_port)
            env["FP_ADMIN__PORT"] = str(instance.admin_port)
        env.update(options.env)
        return child_env(env)

    async def migrate(self) -> None:
        argv = [sys.executable, "-m", "feishu_progress", "migrate"]
        done = await asyncio.to_thread(
            subprocess.run, argv, env=self.env_for(None), cwd=self.workdir, capture_output=True, timeout=120
        )
        assert done.returncode == 0, done.stdout.decode(errors="replace") + done.stderr.decode(
            errors="replace"
        )

    def _spawn(self, instance: Instance) -> None:
        argv = [sys.executable, "-m", "feishu_progress", "serve"]
        instance.child = Child(instance.instance_id, argv, self.env_for(instance), self.workdir)
        instance.paused = instance.draining = False
        instance.child.start()

    async def wait_ready(self, index: int, timeout: float = READY_SECONDS) -> None:
        """Until the instance's /readyz answers 200 (fails at once if the process exits)."""
        instance = self.instances[index]

        async def ready() -> bool | None:
            assert instance.child is not None
            if not instance.child.running:
                raise AssertionError(f"{instance.instance_id} exited: {instance.child.output()}")
            with contextlib.suppress(aiohttp.ClientError, TimeoutError):
                async with self.http.get(f"{instance.admin_url}/readyz") as response:
                    return True if response.status == 200 else None
            return None

        await eventually(ready, timeout, f"{instance.instance_id} to be ready", interval=POLL_SECONDS)

    # --- the load balancer ------------------------------------------------------------------------

    def routable(self) -> list[Instance]:
        return [instance for instance in self.instances if instance.routable]

    async def call(
        self,
        method: str,
        path: str,
        *,
        json: Any = None,
        data: bytes | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> Reply:
        """``method path`` on a random routable instance; a refused connection is retried elsewhere."""
        tried: set[int] = set()
        while True:
            candidates = [i for i in self.routable() if i.index not in tried]
            assert candidates, f"no instance left to take {method} {path}"
            instance = self.rng.choice(candidates)
            tried.add(instance.index)
            try:
                return await self.request(instance.index, method, path, json=json, data=data, headers=headers)
            except aiohttp.ClientConnectorError:
                continue  # not listening (yet, or any more): a load balancer tries the next backend

    async def request(
        self,
        index: int,
        method: str,
        path: str,
        *,
        json: Any = None,
        data: bytes | None = None,
        headers: Mapping[str, str] | None = None,
        admin: bool = False,
    ) -> Reply:
        """``method path`` on instance ``index`` (its admin listener with ``admin``)."""
        instance = self.instances[index]
        base = instance.admin_url if admin else instance.base_url
        started = time.monotonic()
        instance.in_flight += 1
        try:
            async with self.http.request(
                method, base + path, json=json, data=data, headers=dict(headers or {})
            ) as response:
                text = await response.text()
                body: Any = text
                if response.content_type == "application/json":
                    body = await response.json()
                return Reply(response.status, body, index, time.monotonic() - started)
        finally:
            instance.in_flight -= 1

    # --- breaking things --------------------------------------------------------------------------

    async def _drain(self, instance: Instance) -> None:
        """Take the instance out of rotation and let the harness's calls to it finish."""
        instance.draining = True
        deadline = time.monotonic() + DRAIN_SECONDS
        while instance.in_flight and time.monotonic() < deadline:
            await asyncio.sleep(0.01)

    async def kill9(self, index: int) -> float:
        """SIGKILL the instance; returns the moment of the kill (time.monotonic(), the sandbox's clock)."""
        instance = self.instances[index]
        assert instance.child is not None and instance.child.running, f"{instance.instance_id} is not running"
        await self._drain(instance)
        killed_at = time.monotonic()
        instance.child.kill()
        return killed_at

    def sigstop(self, index: int) -> float:
        """Pause the instance (it keeps its sockets, leases and memory; it just stops running)."""
        instance = self.instances[index]
        assert instance.child is not None
        instance.paused = True
        stopped_at = time.monotonic()
        instance.child.signal(signal.SIGSTOP)
        return stopped_at

    def sigcont(self, index: int) -> float:
        """Resume a paused instance and put it back into rotation."""
        instance = self.instances[index]
        assert instance.child is not None
        resumed_at = time.monotonic()
        instance.child.signal(signal.SIGCONT)
        instance.paused = False
        return resumed_at

    async def sigterm(self, index: int, timeout: float = 40.0) -> Exit:
        """Ask the instance to stop and wait (at most ``timeout`` s) until it has."""
        instance = self.instances[index]
        assert instance.child is not None
        await self._drain(instance)
        signalled_at = time.monotonic()
        instance.child.signal(signal.SIGTERM)
        code = await instance.child.wait_exit(timeout)
        return Exit(code, signalled_at, time.monotonic() - signalled_at)

    async def restart(self, index: int) -> None:
        """Start the instance again on the same ports (killing it first if it still runs)."""
        instance = self.instances[index]
        if instance.child is not None and instance.child.running:
            await self.kill9(index)
        self._spawn(instance)
        await self.wait_ready(index)

    # --- looking ----------------------------------------------------------------------------------

    async def sandbox_log(self, *, history: bool = False) -> dict[str, Any]:
        """The sandbox's update log (GET /_sandbox/messages)."""
        query = "?history=1" if history else ""
        async with self.http.get(f"{self.sandbox_url}/_sandbox/messages{query}") as response:
            assert response.status == 200
            log: dict[str, Any] = await response.json()
            return log

    async def readyz(self, index: int) -> Reply:
        return await self.request(index, "GET", "/readyz", admin=True)

    async def admin_cards(self, index: int) -> list[dict[str, Any]]:
        reply = await self.request(
            index, "GET", "/admin/cards", admin=True, headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}
        )
        assert reply.status == 200, reply.body
        cards: list[dict[str, Any]] = reply.body["cards"]
        return cards

    async def metrics(self, index: int) -> str:
        reply = await self.request(index, "GET", "/metrics", admin=True)
        assert reply.status == 200
        return str(reply.body)

    # --- the runtime and the user -----------------------------------------------------------------

    @staticmethod
    def api_headers() -> dict[str, str]:
        return {"Authorization": f"Bearer {API_TOKEN}"}

    async def create_task(self, title: str) -> tuple[int, str]:
        """POST /v1/tasks through the load balancer; (session_id, message_id)."""
        body = {
            "receive_id": CHAT,
            "receive_id_type": "chat_id",
            "requester_open_id": REQUESTER,
            "title": title,
        }
        reply = await self.call("POST", "/v1/tasks", json=body, headers=self.api_headers())
        assert reply.status == 201, reply.body
        return int(reply.body["session_id"]), str(reply.body["message_id"])

    async def post_events(self, session_id: int, *events: Mapping[str, Any], key: str | None = None) -> Reply:
        """One batch of events through the load balancer (``key``: its Idempotency-Key)."""
        path = f"/v1/tasks/{session_id}/events"
        headers = self.api_headers() | ({"Idempotency-Key": key} if key is not None else {})
        return await self.call("POST", path, json={"events": list(events)}, headers=headers)

    async def actions(self, session_id: int, after: int = 0) -> dict[str, Any]:
        """The task's action log, read from a random instance."""
        path = f"/v1/tasks/{session_id}/actions?after={after}&wait=0"
        reply = await self.call("GET", path, headers=self.api_headers())
        assert reply.status == 200, reply.body
        actions: dict[str, Any] = reply.body
        return actions

    async def task(self, session_id: int) -> dict[str, Any]:
        reply = await self.call("GET", f"/v1/tasks/{session_id}", headers=self.api_headers())
        assert reply.status == 200, reply.body
        view: dict[str, Any] = reply.body
        return view

    @staticmethod
    def click_payload(
        message_id: str,
        value: Mapping[str, Any],
        *,
        operator: str = REQUESTER,
        form: Mapping[str, Any] | None = None,
    ) -> dict[str, Any]:
        """One click as Feishu describes it; deliver it (again, to deliver it twice) with ``deliver``."""
        return card_action_payload(
            open_id=operator,
            message_id=message_id,
            chat_id=CHAT,
            value=value,
            form_value=form,
            verification_token=VERIFICATION_TOKEN,
            now=time.time(),
            click_token=f"tok-{random.randrange(2**48):x}",
        )

    async def deliver(self, payload: Mapping[str, Any]) -> Reply:
        """POST the click, encrypted and signed, to a random instance's /feishu/callback."""
        body, headers = signed_request(dict(payload), encrypt_key=ENCRYPT_KEY, now=time.time())
        return await self.call("POST", "/feishu/callback", data=body, headers=headers)


# --- a runtime playing many tasks through the load balancer ---------------------------------------

RETRYABLE_STATUSES = frozenset({503})  # "our side failed, nothing applied": the runtime API's retry signal
RETRY_SECONDS = 15.0  # longer than a takeover after kill -9 may take (10 s)
RETRY_PAUSE_SECONDS = 0.2


@dataclass
class TaskRun:
    """One task the workload plays: how many events it was sent, and how it was ended."""

    session_id: int
    message_id: str
    events: int = 0
    final: TaskStatus | None = None


class Workload:
    """An agent runtime: creates tasks, streams numbered events to each in order, ends them.

    Each event is a ``content_delta`` carrying ``event_mark(n)`` (every fifth also a ``status`` with a
    new round), so the card shows exactly which events were applied, in which order
    (``cluster_checks.out_of_order_events``). Batches of one task are sent one after the other, as a
    runtime does; different tasks in parallel, each batch to a random instance.
    """

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self.tasks: list[TaskRun] = []
        self.retried = 0  # 503s answered and retried (reported, never hidden)

    async def create(self, count: int, title: str = "cluster task") -> list[TaskRun]:
        created = await asyncio.gather(*(self.cluster.create_task(f"{title} {n}") for n in range(count)))
        runs = [TaskRun(session_id, message_id) for session_id, message_id in created]
        self.tasks.extend(runs)
        return runs

    async def send(self, task: TaskRun, *events: Mapping[str, Any]) -> None:
        """One batch, retried while the service answers 503; anything but 202 fails the test.

        A runtime retries a 503 as the API says; while a dead owner's lease runs out (up to the lease,
        then a takeover) its task's events are refused, so the retries last longer than a takeover may.
        """
        deadline = time.monotonic() + RETRY_SECONDS
        key = uuid.uuid4().hex  # one per batch, the same on its retries (as feishu_progress.client does)
        while time.monotonic() < deadline:
            reply = await self.cluster.post_events(task.session_id, *events, key=key)
            if reply.status == 202:
                return
            assert reply.status in RETRYABLE_STATUSES, (task.session_id, reply)
            self.retried += 1
            await asyncio.sleep(RETRY_PAUSE_SECONDS)
        raise AssertionError(f"task {task.session_id}: events refused for {RETRY_SECONDS} s")

    async def step(self, task: TaskRun) -> None:
        """The task's next event."""
        events: list[dict[str, Any]] = [{"type": "content_delta", "text": event_mark(task.events)}]
        if task.events % 5 == 0:
            events.insert(0, {"type": "status", "status": "RUNNING", "round": task.events // 5 + 1})
        await self.send(task, *events)
        task.events += 1

    async def stream(self, seconds: float, interval: float = 0.3) -> None:
        """Every running task gets an event about every ``interval`` seconds, for ``seconds``."""
        deadline = time.monotonic() + seconds

        async def play(task: TaskRun) -> None:
            while time.monotonic() < deadline:
                await self.step(task)
                await asyncio.sleep(interval * self.cluster.rng.uniform(0.5, 1.5))

        await asyncio.gather(*(play(task) for task in self.tasks if task.final is None))

    async def finish(self, statuses: tuple[TaskStatus, ...] = (TaskStatus.COMPLETED,)) -> None:
        """End every running task, cycling through ``statuses``."""
        running = [task for task in self.tasks if task.final is None]

        async def end(task: TaskRun, status: TaskStatus) -> None:
            await self.send(task, {"type": "finished", "status": status.value})
            task.final = status

        await asyncio.gather(*(end(task, statuses[n % len(statuses)]) for n, task in enumerate(running)))

    def expected_marks(self) -> dict[str, int]:
        return {task.message_id: task.events for task in self.tasks}

    def expected_finals(self) -> dict[str, TaskStatus]:
        return {task.message_id: task.final for task in self.tasks if task.final is not None}

    async def settled(self, timeout: float = 30.0) -> dict[str, Any]:
        """The sandbox log (with history) once every ended task's card shows its final status."""

        missing: list[str] = []

        async def done() -> dict[str, Any] | None:
            log = await self.cluster.sandbox_log(history=True)
            missing[:] = undelivered_finals(log["messages"], self.expected_finals())
            return None if missing else log

        try:
            return await eventually(done, timeout, "every final card", interval=POLL_SECONDS)
        except AssertionError as exc:
            raise AssertionError(f"{exc}; still missing: {missing}") from None
