"""A session id in a URL is read one way by the runtime API and by cluster forwarding.

They once disagreed (≤ 19 digits vs ≤ 18): a 19-digit id — one a runtime may choose in attach mode,
where a task's session id is the agent's own — was served by the API but never forwarded to its card's
writer, so every request for it at another instance was a permanent 503.
"""

from __future__ import annotations

import pytest
from aiohttp.test_utils import make_mocked_request
from aiohttp.web_urldispatcher import UrlMappingMatchInfo

from feishu_progress.cluster.http import _routed_session
from feishu_progress.web.http import MAX_ID, parse_id


def _request(path: str, session_id: str) -> object:
    request = make_mocked_request("POST", path)
    request._match_info = UrlMappingMatchInfo({"session_id": session_id}, None)  # type: ignore[arg-type]
    return request


@pytest.mark.parametrize("raw", ["1", "42", "1234567890123456789", str(MAX_ID)])
def test_every_id_the_api_serves_is_forwarded_to_its_writer(raw: str) -> None:
    assert parse_id(raw) == int(raw)
    assert _routed_session(_request(f"/v1/tasks/{raw}/events", raw)) == int(raw)  # type: ignore[arg-type]


@pytest.mark.parametrize("raw", ["", "-1", "1e3", "²", "١٢", str(MAX_ID + 1), "0" * 20])
def test_an_id_that_names_nothing_is_neither_served_nor_forwarded(raw: str) -> None:
    assert parse_id(raw) is None
    assert _routed_session(_request("/v1/tasks/x/events", raw)) is None  # type: ignore[arg-type]


def test_the_action_log_is_answered_where_it_is_asked() -> None:
    assert _routed_session(_request("/v1/tasks/5/actions", "5")) is None  # type: ignore[arg-type]
