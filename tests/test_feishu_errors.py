"""classify(): every Feishu code the service knows maps to exactly one delivery decision."""

from __future__ import annotations

import pytest

from feishu_progress.errors import FeishuAPIError, FeishuTransportError
from feishu_progress.feishu.errors import classify
from feishu_progress.ports import OutcomeKind

K = OutcomeKind


@pytest.mark.parametrize(
    ("code", "http_status", "kind"),
    [
        (230020, 400, K.RETRY_MESSAGE),
        (99991400, 429, K.PAUSE_APP),
        (99991400, 400, K.PAUSE_APP),
        (0, 429, K.PAUSE_APP),
        (500, 500, K.BACKOFF),
        (502, 502, K.BACKOFF),
        (1069902, 503, K.BACKOFF),
        (230031, 400, K.STOP),
        (230011, 400, K.STOP),
        (230110, 400, K.STOP),
        (230025, 400, K.DEGRADE),
        (19036, 400, K.DEGRADE),
        (230099, 400, K.DEGRADE),
        (300305, 400, K.DEGRADE),
        (11310, 400, K.DEGRADE),
        (99991663, 401, K.BACKOFF),
        (99991661, 400, K.BACKOFF),
        (230001, 400, K.STOP),
        (230002, 400, K.STOP),
        (99992402, 400, K.STOP),
        (403, 403, K.STOP),
    ],
)
def test_every_code_maps_to_its_decision(code: int, http_status: int, kind: OutcomeKind) -> None:
    outcome = classify(FeishuAPIError(code, "msg from feishu", http_status=http_status))
    assert outcome.kind is kind
    assert outcome.code == code


def test_message_limit_retries_after_the_message_interval() -> None:
    outcome = classify(FeishuAPIError(230020, "limited"), message_interval=0.6)
    assert outcome.retry_after == 0.6


def test_gateway_limit_uses_the_reset_header() -> None:
    outcome = classify(FeishuAPIError(99991400, "limited", http_status=429, retry_after=7.0))
    assert outcome.retry_after == 7.0


def test_gateway_limit_without_header_pauses_one_second() -> None:
    outcome = classify(FeishuAPIError(99991400, "limited", http_status=429))
    assert outcome.retry_after == 1.0


@pytest.mark.parametrize(("code", "word"), [(230031, "14 days"), (230011, "recalled"), (230110, "deleted")])
def test_stop_names_the_reason(code: int, word: str) -> None:
    assert word in classify(FeishuAPIError(code, "x")).reason


def test_unknown_code_stops_with_code_and_message_recorded() -> None:
    outcome = classify(FeishuAPIError(234567, "something new"))
    assert outcome.kind is K.STOP
    assert "234567" in outcome.reason
    assert "something new" in outcome.reason


def test_degrade_keeps_feishu_message_for_the_log() -> None:
    outcome = classify(FeishuAPIError(230099, "ErrCode: 200861; unsupported tag note"))
    assert "200861" in outcome.reason


def test_transport_errors_back_off() -> None:
    outcome = classify(FeishuTransportError("timeout"))
    assert outcome.kind is K.BACKOFF
    assert "timeout" in outcome.reason


def test_non_feishu_exception_stops_instead_of_looping() -> None:
    assert classify(ValueError("bug")).kind is K.STOP
