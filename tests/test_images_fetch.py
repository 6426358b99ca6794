"""image_url fetching: the address policy, and real HTTP against a local aiohttp server.

The server listens on 127.0.0.1, which the default policy refuses; tests that need an "allowed" server
open 127.0.0.1/32 through FP_IMAGES__ALLOWED_NETWORKS, as an operator would for an internal CDN.
"""

from __future__ import annotations

import asyncio
import gzip
import ipaddress
import socket
import time
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from feishu_progress.config import ImagesSettings
from feishu_progress.errors import ImageRefused
from feishu_progress.images import AddressPolicy, ImageFetcher
from feishu_progress.images.fetch import VettingResolver

PNG = b"\x89PNG\r\n\x1a\n" + b"pixels" * 20
LIMIT = 1000
LOOPBACK_ONLY = ("127.0.0.1/32",)


# --- the policy ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "address",
    [
        "127.0.0.1",
        "127.8.9.10",
        "::1",
        "169.254.169.254",  # cloud metadata
        "fe80::1",
        "10.0.0.1",
        "172.16.5.4",
        "192.168.1.1",
        "fc00::1",
        "fd12:3456::1",
        "100.64.0.1",  # CGNAT
        "100.127.255.254",
        "0.0.0.0",
        "::",
        "224.0.0.1",
        "239.255.255.250",
        "ff02::1",
        "240.0.0.1",
        "255.255.255.255",
        "fec0::1",  # site-local
        "::ffff:127.0.0.1",  # IPv4-mapped
        "::ffff:169.254.169.254",
        "::ffff:10.0.0.1",
        "::127.0.0.1",  # IPv4-compatible
        "::10.0.0.1",
        "2002:7f00:1::",  # 6to4 of 127.0.0.1
        "2002:a9fe:a9fe::1",  # 6to4 of 169.254.169.254
        "64:ff9b::a00:1",  # NAT64 of 10.0.0.1
        "64:ff9b::7f00:1",
    ],
)
def test_the_default_policy_refuses_special_addresses(address: str) -> None:
    assert not AddressPolicy().permits(ipaddress.ip_address(address))


@pytest.mark.parametrize(
    "address",
    ["93.184.216.34", "8.8.8.8", "2606:2800:220:1:248:1893:25c8:1946", "::ffff:8.8.8.8"],
)
def test_the_default_policy_permits_public_addresses(address: str) -> None:
    assert AddressPolicy().permits(ipaddress.ip_address(address))


def test_allowed_networks_open_exactly_those_networks() -> None:
    policy = AddressPolicy.from_settings(ImagesSettings(allowed_networks=("10.20.0.0/16", "fd00:1::/64")))
    assert policy.permits(ipaddress.ip_address("10.20.3.4"))
    assert policy.permits(ipaddress.ip_address("::ffff:10.20.3.4"))
    assert policy.permits(ipaddress.ip_address("fd00:1::5"))
    assert not policy.permits(ipaddress.ip_address("10.21.0.1"))
    assert not policy.permits(ipaddress.ip_address("fd00:2::5"))
    assert not policy.permits(ipaddress.ip_address("169.254.169.254"))


def test_nat64_is_opened_by_allowing_its_prefix_and_still_checks_the_embedded_address() -> None:
    nat64_of_public, nat64_of_private = (
        ipaddress.ip_address("64:ff9b::808:808"),
        ipaddress.ip_address("64:ff9b::a00:1"),
    )
    assert not AddressPolicy().permits(nat64_of_public)  # 64:ff9b::/96 is reserved space
    policy = AddressPolicy.from_settings(ImagesSettings(allowed_networks=("64:ff9b::/96",)))
    assert policy.permits(nat64_of_public)
    assert not policy.permits(nat64_of_private)


def test_allow_private_urls_opens_everything() -> None:
    policy = AddressPolicy.from_settings(ImagesSettings(allow_private_urls=True))
    assert policy.permits(ipaddress.ip_address("127.0.0.1"))
    assert policy.permits(ipaddress.ip_address("169.254.169.254"))


def test_allowed_networks_come_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    from feishu_progress.config import Settings

    monkeypatch.setenv("FP_IMAGES__ALLOWED_NETWORKS", "10.20.0.0/16, fd00:1::/64")
    monkeypatch.setenv("FP_IMAGES__ROOT", "")
    settings = Settings(_env_file=None)  # type: ignore[call-arg]
    assert [str(net) for net in settings.images.allowed_networks] == ["10.20.0.0/16", "fd00:1::/64"]
    assert settings.images.root is None


async def test_the_resolver_hands_over_only_vetted_addresses() -> None:
    async def lookup(host: str, port: int) -> list[str]:
        return ["127.0.0.1", "127.0.0.1", "::1"]

    policy = AddressPolicy(
        allowed_networks=[ipaddress.ip_network("127.0.0.0/8"), ipaddress.ip_network("::1/128")]
    )
    resolved = await VettingResolver(policy, lookup).resolve("cdn.test", 8080, socket.AF_UNSPEC)
    assert [(r["host"], r["port"], r["hostname"]) for r in resolved] == [
        ("127.0.0.1", 8080, "cdn.test"),
        ("::1", 8080, "cdn.test"),
    ]
    only_v4 = await VettingResolver(policy, lookup).resolve("cdn.test", 8080, socket.AF_INET)
    assert [r["host"] for r in only_v4] == ["127.0.0.1"]


# --- real HTTP -----------------------------------------------------------------------------------


@dataclass
class ImageServer:
    server: TestServer
    hits: Counter[str] = field(default_factory=Counter)
    hosts: list[str] = field(default_factory=list)
    release: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def port(self) -> int:
        assert self.server.port is not None
        return self.server.port

    def url(self, path: str, host: str = "127.0.0.1") -> str:
        return f"http://{host}:{self.port}{path}"


def _image_app(state: ImageServer) -> web.Application:
    async def counted(request: web.Request) -> web.StreamResponse:
        state.hits[request.path] += 1
        state.hosts.append(request.headers.get("Host", ""))
        return await ROUTES[request.path](request, state)

    app = web.Application()
    for path in ROUTES:
        app.router.add_get(path, counted)
    return app


async def _cat(request: web.Request, state: ImageServer) -> web.StreamResponse:
    return web.Response(body=PNG, content_type="image/png")


async def _big(request: web.Request, state: ImageServer) -> web.StreamResponse:
    return web.Response(body=PNG + b"x" * LIMIT)  # Content-Length says it all


async def _chunked_big(request: web.Request, state: ImageServer) -> web.StreamResponse:
    response = web.StreamResponse()
    response.enable_chunked_encoding()  # no Content-Length: the cap must be counted
    await response.prepare(request)
    for _ in range(10):
        await response.write(PNG + b"x" * 200)
    await response.write_eof()
    return response


async def _text(request: web.Request, state: ImageServer) -> web.StreamResponse:
    return web.Response(text="FP_FEISHU__APP_SECRET=s3cret", content_type="image/png")


async def _gzip_bomb(request: web.Request, state: ImageServer) -> web.StreamResponse:
    body = gzip.compress(PNG + b"\x00" * (50 * LIMIT))  # small on the wire, 50x the cap inflated
    return web.Response(body=body, headers={"Content-Encoding": "gzip", "Content-Type": "image/png"})


async def _redirect(request: web.Request, state: ImageServer) -> web.StreamResponse:
    raise web.HTTPFound(request.query["to"])


async def _loop(request: web.Request, state: ImageServer) -> web.StreamResponse:
    raise web.HTTPTemporaryRedirect("/loop")


async def _missing(request: web.Request, state: ImageServer) -> web.StreamResponse:
    raise web.HTTPNotFound()


async def _slow(request: web.Request, state: ImageServer) -> web.StreamResponse:
    await state.release.wait()  # set when the test ends, so the server can shut down
    return web.Response(body=PNG)


async def _trickle(request: web.Request, state: ImageServer) -> web.StreamResponse:
    """The head at once, then a byte every 20 ms (50 B/s) until the test ends."""
    response = web.StreamResponse(headers={"Content-Type": "image/png"})
    await response.prepare(request)
    await response.write(PNG[:8])
    while not state.release.is_set():
        await response.write(b"x")
        await asyncio.sleep(0.02)
    return response


async def _dribble(request: web.Request, state: ImageServer) -> web.StreamResponse:
    """A whole image in 20 writes 20 ms apart (~850 B/s): slow, but steady."""
    response = web.StreamResponse(headers={"Content-Type": "image/png"})
    await response.prepare(request)
    for _ in range(20):
        await response.write(PNG[:16])
        await asyncio.sleep(0.02)
    await response.write_eof()
    return response


ROUTES: dict[str, Any] = {
    "/cat.png": _cat,
    "/big": _big,
    "/chunked-big": _chunked_big,
    "/text": _text,
    "/gzip": _gzip_bomb,
    "/redirect": _redirect,
    "/loop": _loop,
    "/missing": _missing,
    "/slow": _slow,
    "/trickle": _trickle,
    "/dribble": _dribble,
}


@pytest.fixture
async def images_server() -> AsyncIterator[ImageServer]:
    state = ImageServer(server=TestServer(web.Application(), host="127.0.0.1"))
    state.server = TestServer(_image_app(state), host="127.0.0.1")
    await state.server.start_server()
    try:
        yield state
    finally:
        state.release.set()
        await state.server.close()


class FakeDns:
    """An injected lookup: names the tests control, recording what was asked."""

    def __init__(self, answers: dict[str, list[str]]) -> None:
        self.answers = answers
        self.asked: list[tuple[str, int]] = []

    async def __call__(self, host: str, port: int) -> list[str]:
        self.asked.append((host, port))
        if host not in self.answers:
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        return self.answers[host]


DNS = {
    "images.test": ["127.0.0.1"],
    "cdn.example": ["10.0.0.7"],
    "mixed.example": ["127.0.0.1", "10.0.0.7"],
}


async def open_fetcher(dns: FakeDns | None = None, rate_grace: float = 2.0, **settings: Any) -> ImageFetcher:
    settings.setdefault("max_bytes", LIMIT + len(PNG) // 2)
    fetcher = ImageFetcher(ImagesSettings(**settings), lookup=dns or FakeDns(DNS), rate_grace=rate_grace)
    await fetcher.open()
    return fetcher


@pytest.fixture
async def allowed() -> AsyncIterator[ImageFetcher]:
    """A fetcher whose operator allowed 127.0.0.1/32, and whose DNS answers from DNS."""
    fetcher = await open_fetcher(allowed_networks=LOOPBACK_ONLY)
    try:
        yield fetcher
    finally:
        await fetcher.close()


@pytest.fixture
async def default() -> AsyncIterator[ImageFetcher]:
    """A fetcher with the default policy."""
    fetcher = await open_fetcher()
    try:
        yield fetcher
    finally:
        await fetcher.close()


async def refused(fetcher: ImageFetcher, url: str) -> str:
    with pytest.raises(ImageRefused) as caught:
        await fetcher.fetch(url)
    assert url not in str(caught.value)
    return caught.value.reason


async def test_an_allowed_server_is_fetched(allowed: ImageFetcher, images_server: ImageServer) -> None:
    assert await allowed.fetch(images_server.url("/cat.png")) == PNG


async def test_the_default_policy_refuses_loopback_before_connecting(
    default: ImageFetcher, images_server: ImageServer
) -> None:
    assert await refused(default, images_server.url("/cat.png")) == "private_address"
    assert await refused(default, images_server.url("/cat.png", host="[::1]")) == "private_address"
    assert (
        await refused(default, images_server.url("/cat.png", host="[::ffff:127.0.0.1]")) == "private_address"
    )
    assert images_server.hits["/cat.png"] == 0


@pytest.mark.parametrize(
    "url",
    [
        "http://169.254.169.254/latest/meta-data/iam/security-credentials/",
        "http://10.0.0.1/cat.png",
        "http://[fd00::1]/cat.png",
        "http://100.64.0.1/cat.png",
        "http://0.0.0.0/cat.png",
        "https://192.168.0.1/cat.png",
    ],
)
async def test_the_default_policy_refuses_private_literals(default: ImageFetcher, url: str) -> None:
    assert await refused(default, url) == "private_address"


async def test_a_name_resolving_to_a_private_address_is_refused() -> None:
    dns = FakeDns(DNS)
    fetcher = await open_fetcher(dns)
    try:
        assert await refused(fetcher, "http://cdn.example/cat.png") == "private_address"
    finally:
        await fetcher.close()
    assert dns.asked == [("cdn.example", 80)]  # resolved first, then refused


async def test_a_name_with_any_refused_address_is_refused(
    allowed: ImageFetcher, images_server: ImageServer
) -> None:
    assert await refused(allowed, images_server.url("/cat.png", host="mixed.example")) == "private_address"
    assert images_server.hits["/cat.png"] == 0


async def test_the_connection_goes_to_the_vetted_address(
    allowed: ImageFetcher, images_server: ImageServer
) -> None:
    # "images.test" exists only in the injected DNS: aiohttp resolving it again would fail.
    assert await allowed.fetch(images_server.url("/cat.png", host="images.test")) == PNG
    assert images_server.hosts == [f"images.test:{images_server.port}"]


async def test_an_unresolvable_name_is_refused(allowed: ImageFetcher) -> None:
    assert await refused(allowed, "http://nowhere.test/cat.png") == "unresolvable"


async def test_allow_private_urls_reaches_loopback(images_server: ImageServer) -> None:
    fetcher = await open_fetcher(allow_private_urls=True)
    try:
        assert await fetcher.fetch(images_server.url("/cat.png")) == PNG
    finally:
        await fetcher.close()


async def test_a_redirect_within_policy_is_followed(
    allowed: ImageFetcher, images_server: ImageServer
) -> None:
    url = images_server.url("/redirect?to=/cat.png")
    assert await allowed.fetch(url) == PNG
    assert images_server.hits == Counter({"/redirect": 1, "/cat.png": 1})


@pytest.mark.parametrize(
    ("target", "reason"),
    [
        ("http://169.254.169.254/latest/meta-data/", "private_address"),
        ("http://[::1]:{port}/cat.png", "private_address"),
        ("http://10.0.0.1/cat.png", "private_address"),
        ("http://cdn.example/cat.png", "private_address"),
        ("file:///etc/passwd", "scheme"),
        ("gopher://127.0.0.1:6379/_FLUSHALL", "scheme"),
    ],
)
async def test_a_redirect_to_a_refused_target_is_refused(
    allowed: ImageFetcher, images_server: ImageServer, target: str, reason: str
) -> None:
    url = images_server.url("/redirect?to=" + target.format(port=images_server.port))
    assert await refused(allowed, url) == reason
    assert images_server.hits["/redirect"] == 1
    assert images_server.hits["/cat.png"] == 0


async def test_redirects_are_followed_a_few_times_only(images_server: ImageServer) -> None:
    fetcher = await open_fetcher(allowed_networks=LOOPBACK_ONLY, max_redirects=2)
    try:
        assert await refused(fetcher, images_server.url("/loop")) == "too_many_redirects"
    finally:
        await fetcher.close()
    assert images_server.hits["/loop"] == 3


@pytest.mark.parametrize(
    ("path", "reason"),
    [
        ("/big", "too_large"),
        ("/chunked-big", "too_large"),
        ("/text", "not_an_image"),
        ("/gzip", "not_an_image"),
        ("/missing", "http_status"),
    ],
)
async def test_bodies_off_limits_are_refused(
    allowed: ImageFetcher, images_server: ImageServer, path: str, reason: str
) -> None:
    assert await refused(allowed, images_server.url(path)) == reason
    assert images_server.hits[path] == 1


async def test_a_slow_server_times_out(images_server: ImageServer) -> None:
    fetcher = await open_fetcher(allowed_networks=LOOPBACK_ONLY, fetch_timeout_seconds=0.05)
    try:
        assert await refused(fetcher, images_server.url("/slow")) == "timeout"
    finally:
        await fetcher.close()


async def test_a_server_that_sends_no_head_is_given_up_on_at_the_first_byte_timeout(
    images_server: ImageServer,
) -> None:
    fetcher = await open_fetcher(
        allowed_networks=LOOPBACK_ONLY, fetch_first_byte_seconds=0.1, fetch_timeout_seconds=30
    )
    try:
        started = time.monotonic()
        assert await refused(fetcher, images_server.url("/slow")) == "first_byte_timeout"
        assert time.monotonic() - started < 10, "waited for the total timeout, not the first byte"
    finally:
        await fetcher.close()


async def test_a_body_below_the_minimum_rate_is_given_up_on(images_server: ImageServer) -> None:
    fetcher = await open_fetcher(
        rate_grace=0.1,
        allowed_networks=LOOPBACK_ONLY,
        fetch_min_bytes_per_second=1000,  # the server trickles 50 B/s
        fetch_timeout_seconds=30,
    )
    try:
        started = time.monotonic()
        assert await refused(fetcher, images_server.url("/trickle")) == "too_slow"
        assert time.monotonic() - started < 10, "waited for the total timeout, not the rate"
    finally:
        await fetcher.close()


async def test_a_body_above_the_minimum_rate_is_fetched(images_server: ImageServer) -> None:
    fetcher = await open_fetcher(
        rate_grace=0.1, allowed_networks=LOOPBACK_ONLY, fetch_min_bytes_per_second=100
    )
    try:
        assert await fetcher.fetch(images_server.url("/dribble")) == PNG[:16] * 20
    finally:
        await fetcher.close()


@pytest.mark.parametrize(
    ("url", "reason"),
    [
        ("ftp://example.com/cat.png", "scheme"),
        ("file:///etc/shadow", "scheme"),
        ("data:image/png;base64,iVBORw0KGgo=", "scheme"),
        ("/etc/shadow", "scheme"),
        ("http:///cat.png", "bad_url"),
    ],
)
async def test_only_http_and_https_urls_with_a_host_are_fetched(
    default: ImageFetcher, url: str, reason: str
) -> None:
    assert await refused(default, url) == reason


async def test_a_closed_fetcher_refuses(images_server: ImageServer) -> None:
    fetcher = ImageFetcher(ImagesSettings(allowed_networks=LOOPBACK_ONLY))
    assert await refused(fetcher, images_server.url("/cat.png")) == "fetcher_closed"
    await fetcher.open()
    await fetcher.close()
    assert await refused(fetcher, images_server.url("/cat.png")) == "fetcher_closed"
