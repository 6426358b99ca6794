"""Fetching ``image_url``s over http(s) without becoming a proxy into the private network (SSRF).

Every hop (the URL and each redirect, followed by hand) is checked the same way: http or https only;
a literal IP must be public; a host name is resolved by our own resolver, which refuses the whole name
if any of its addresses is not public, and hands the connector exactly the addresses it checked, so a
second DNS answer (rebinding) can never be what we connect to. "Public" excludes loopback, private,
link-local (with the cloud metadata address), multicast, reserved, unspecified, CGNAT and the IPv6
forms that embed such an IPv4 address; an operator may open specific networks (an internal CDN) or all
of them. Bodies are never decompressed, capped while streaming, and must sniff as an image.

A server that is merely slow is given up on early, so it cannot hold a fetch slot for the whole
``fetch_timeout_seconds``: the response head must arrive within ``fetch_first_byte_seconds`` of each
request, and the body must keep up ``fetch_min_bytes_per_second`` on average once a short grace has
passed. Fetches take one of the fetcher's own ``FairSlots`` (``slots``), never an upload slot, so a
task's slow URLs neither delay another task's local images nor take all the fetches.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from collections.abc import Awaitable, Callable, Iterable

import aiohttp
from aiohttp.abc import AbstractResolver, ResolveResult
from yarl import URL

from feishu_progress.config import ImagesSettings
from feishu_progress.errors import ImageRefused
from feishu_progress.images.fair import FairSlots
from feishu_progress.images.sniff import require_image

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network
# host, port -> the IP addresses (as text) the name resolves to.
Lookup = Callable[[str, int], Awaitable[list[str]]]

_CGNAT = ipaddress.IPv4Network("100.64.0.0/10")
_NAT64 = (ipaddress.IPv6Network("64:ff9b::/96"), ipaddress.IPv6Network("64:ff9b:1::/48"))
_IPV4_COMPATIBLE = ipaddress.IPv6Network("::/96")
_REDIRECTS = frozenset({301, 302, 303, 307, 308})
_CHUNK_BYTES = 64 * 1024
# The body's first seconds are not held to the minimum rate: a connection's first round trips and TCP's
# slow start make a fine server look slow for a moment.
RATE_GRACE_SECONDS = 2.0
_HEADERS = {"Accept": "image/*", "Accept-Encoding": "identity", "User-Agent": "feishu-progress"}


async def system_lookup(host: str, port: int) -> list[str]:
    """The addresses of ``host`` from the system resolver (getaddrinfo, run by the event loop)."""
    infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return [str(info[4][0]) for info in infos]


def is_public(address: IPAddress) -> bool:
    """Whether ``address`` is an ordinary Internet address (the stdlib flags, plus multicast and CGNAT)."""
    special = (
        address.is_private
        or address.is_loopback
        or address.is_link_local
        or address.is_multicast
        or address.is_reserved
        or address.is_unspecified
        or (isinstance(address, ipaddress.IPv6Address) and address.is_site_local)
        or (isinstance(address, ipaddress.IPv4Address) and address in _CGNAT)
    )
    return address.is_global and not special


def effective_forms(address: IPAddress) -> list[IPAddress]:
    """``address`` and any IPv4 address it embeds; an IPv4-mapped address *is* its IPv4 address."""
    if not isinstance(address, ipaddress.IPv6Address):
        return [address]
    if address.ipv4_mapped is not None:
        return [address.ipv4_mapped]
    embedded = address.sixtofour
    compatible = address in _IPV4_COMPATIBLE and int(address) > 1  # :: and ::1 are themselves
    if embedded is None and (compatible or any(address in net for net in _NAT64)):
        embedded = ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
    return [address] if embedded is None else [address, embedded]


class AddressPolicy:
    """Which addresses an image URL may reach."""

    def __init__(self, *, allow_private: bool = False, allowed_networks: Iterable[IPNetwork] = ()) -> None:
        self.allow_private = allow_private
        self.allowed_networks = tuple(allowed_networks)

    @classmethod
    def from_settings(cls, settings: ImagesSettings) -> AddressPolicy:
        return cls(allow_private=settings.allow_private_urls, allowed_networks=settings.allowed_networks)

    def permits(self, address: IPAddress) -> bool:
        """Public, or (every form of it) inside an allowed network, or private addresses are allowed."""
        if self.allow_private:
            return True
        return all(is_public(form) or self._allowed(form) for form in effective_forms(address))

    def _allowed(self, address: IPAddress) -> bool:
        return any(
            address.version == network.version and address in network for network in self.allowed_networks
        )


class VettingResolver(AbstractResolver):
    """The connector's resolver: a name whose addresses are not all permitted does not resolve."""

    def __init__(self, policy: AddressPolicy, lookup: Lookup = system_lookup) -> None:
        self.policy = policy
        self.lookup = lookup

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        """Only the addresses we checked: the connector connects to these and resolves nothing itself."""
        addresses = await self._addresses(host, port)
        if not all(self.policy.permits(address) for address in addresses):
            raise ImageRefused("private_address")
        return [
            ResolveResult(
                hostname=host,
                host=str(address),
                port=port,
                family=_family_of(address),
                proto=0,
                flags=socket.AI_NUMERICHOST,
            )
            for address in addresses
            if family in (socket.AF_UNSPEC, _family_of(address))
        ]

    async def _addresses(self, host: str, port: int) -> list[IPAddress]:
        try:
            answers = await self.lookup(host, port)
            addresses = list(dict.fromkeys(ipaddress.ip_address(answer) for answer in answers))
        except (OSError, ValueError) as exc:
            raise ImageRefused("unresolvable") from exc
        if not addresses:
            raise ImageRefused("unresolvable")
        return addresses

    async def close(self) -> None:
        """Nothing to release: lookups hold no resources between calls."""


def _family_of(address: IPAddress) -> socket.AddressFamily:
    return socket.AF_INET6 if address.version == 6 else socket.AF_INET


class ImageFetcher:
    """Downloads image URLs through one shared session; ``open()`` with the app, ``close()`` after."""

    def __init__(
        self,
        settings: ImagesSettings,
        *,
        lookup: Lookup = system_lookup,
        rate_grace: float = RATE_GRACE_SECONDS,
    ) -> None:
        self.settings = settings
        self.rate_grace = rate_grace
        self.policy = AddressPolicy.from_settings(settings)
        self.lookup = lookup
        # Taken by the caller around a fetch (and handed over to an upload slot): per task, fairly.
        self.slots = FairSlots(settings.fetch_concurrency, settings.fetch_per_task)
        self._session: aiohttp.ClientSession | None = None

    async def open(self) -> None:
        """Create the session (on the running loop)."""
        connector = aiohttp.TCPConnector(
            resolver=VettingResolver(self.policy, self.lookup),
            use_dns_cache=False,  # every new connection is resolved, and vetted, afresh
            family=socket.AF_UNSPEC,
            limit=self.settings.fetch_concurrency,
        )
        self._session = aiohttp.ClientSession(
            connector=connector,
            timeout=aiohttp.ClientTimeout(total=self.settings.fetch_timeout_seconds),
            auto_decompress=False,  # a 10 KB gzip bomb stays 10 KB; compressed bodies fail the sniff
            cookie_jar=aiohttp.DummyCookieJar(),
            trust_env=False,  # no proxy from the environment: the policy must see the real target
        )

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def fetch(self, url: str) -> bytes:
        """The image at ``url``; ImageRefused (never naming the URL) for anything off-policy or broken."""
        if self._session is None:
            raise ImageRefused("fetcher_closed")
        try:
            async with asyncio.timeout(self.settings.fetch_timeout_seconds):
                data = await self._follow(self._session, checked_url(url))
        except TimeoutError as exc:
            raise ImageRefused("timeout") from exc
        except aiohttp.ClientError as exc:
            raise ImageRefused("unreachable") from exc
        require_image(data)
        return data

    async def _follow(self, session: aiohttp.ClientSession, target: URL) -> bytes:
        for _ in range(self.settings.max_redirects + 1):
            self._check_literal(target)
            head = asyncio.timeout(self.settings.fetch_first_byte_seconds)
            try:
                async with head, session.get(target, allow_redirects=False, headers=_HEADERS) as response:
                    head.reschedule(None)  # the head is in: from here the body is held to the rate
                    if response.status in _REDIRECTS:
                        target = _redirect_target(target, response)
                        continue
                    if response.status != 200:
                        raise ImageRefused("http_status")
                    rate = self.settings.fetch_min_bytes_per_second
                    return await read_capped(response, self.settings.max_bytes, rate, self.rate_grace)
            except TimeoutError:
                if head.expired():
                    raise ImageRefused("first_byte_timeout") from None
                raise
        raise ImageRefused("too_many_redirects")

    def _check_literal(self, target: URL) -> None:
        # A literal IP never reaches the resolver: aiohttp connects to it directly.
        host = target.raw_host or ""
        try:
            address = ipaddress.ip_address(host.split("%", 1)[0])
        except ValueError:
            return  # a name: VettingResolver decides
        if not self.policy.permits(address):
            raise ImageRefused("private_address")


def checked_url(raw: str, base: URL | None = None) -> URL:
    """``raw`` (relative to ``base`` for a redirect) as an absolute http(s) URL with a host."""
    try:
        url = URL(raw)
        if base is not None:
            url = base.join(url)
    except (ValueError, TypeError) as exc:
        raise ImageRefused("bad_url") from exc
    if url.scheme not in ("http", "https"):
        raise ImageRefused("scheme")
    if not url.raw_host:
        raise ImageRefused("bad_url")
    return url


def _redirect_target(current: URL, response: aiohttp.ClientResponse) -> URL:
    location = response.headers.get("Location")
    if not location:
        raise ImageRefused("http_status")
    return checked_url(location, base=current)


async def read_capped(
    response: aiohttp.ClientResponse, max_bytes: int, min_rate: float, grace: float = RATE_GRACE_SECONDS
) -> bytes:
    """The body, refused as soon as it is known to exceed ``max_bytes`` (header first, then counted)
    or to come slower than ``min_rate`` bytes a second on average (after its first ``grace`` seconds)."""
    if response.content_length is not None and response.content_length > max_bytes:
        raise ImageRefused("too_large")
    chunks: list[bytes] = []
    total = 0
    started = asyncio.get_running_loop().time()
    while True:
        try:
            # The moment the average would fall below the rate if nothing more came.
            async with asyncio.timeout_at(started + grace + total / min_rate):
                chunk = await response.content.read(_CHUNK_BYTES)
        except TimeoutError:
            raise ImageRefused("too_slow") from None
        if not chunk:
            break
        total += len(chunk)
        if total > max_bytes:
            raise ImageRefused("too_large")
        chunks.append(chunk)
    if total == 0:
        raise ImageRefused("empty")
    return b"".join(chunks)
