"""How instances of one cluster know a request came from a peer: an HMAC with ``FP_CLUSTER__SECRET``.

Runtimes hold the runtime API token, so that token cannot tell an instance from a runtime: with it, any
runtime could post a "verified" click to ``/internal/v1/clicks`` and approve as anyone. Instances sign
what they send each other with a secret no runtime holds — over the method, the path, a timestamp and
the raw body — and the receiver refuses a signature that does not match or a timestamp more than
``MAX_SKEW_SECONDS`` away from its own clock (a captured request cannot be replayed later; one replayed
within the window is caught by the receiver's dedupe).
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Mapping

TIMESTAMP_HEADER = "X-FP-Cluster-Timestamp"
SIGNATURE_HEADER = "X-FP-Cluster-Signature"
MAX_SKEW_SECONDS = 30.0
_DOMAIN = b"feishu-progress cluster v1\n"  # a signature for this purpose is valid for no other


def signature(secret: str, method: str, path: str, timestamp: str, body: bytes) -> str:
    """The hex HMAC-SHA256 of one request between instances."""
    mac = hmac.new(secret.encode(), _DOMAIN, hashlib.sha256)
    mac.update(f"{method.upper()}\n{path}\n{timestamp}\n".encode("utf-8", "surrogateescape"))
    mac.update(body)
    return mac.hexdigest()


def signed_headers(secret: str, method: str, path: str, body: bytes, now: float) -> dict[str, str]:
    """The headers that make ``body`` a request from a peer."""
    timestamp = str(int(now))
    return {TIMESTAMP_HEADER: timestamp, SIGNATURE_HEADER: signature(secret, method, path, timestamp, body)}


def from_peer(
    secret: str, method: str, path: str, headers: Mapping[str, str], body: bytes, *, now: float
) -> bool:
    """Whether the request carries a fresh, matching peer signature (constant-time compare)."""
    timestamp = headers.get(TIMESTAMP_HEADER, "")
    presented = headers.get(SIGNATURE_HEADER, "")
    if not timestamp.isascii() or not timestamp.isdigit() or len(timestamp) > 12:
        return False
    if abs(now - int(timestamp)) > MAX_SKEW_SECONDS:
        return False
    expected = signature(secret, method, path, timestamp, body)
    return hmac.compare_digest(expected.encode(), presented.encode("utf-8", "surrogateescape"))
