"""A DSP-bound call's timing is an object its handler holds (issue 32, item 4):
``handler.timing``, made at arrival; the data path reads it."""

from __future__ import annotations

import time

import pytest

import npu_protocol as p
from npu_protocol import CodedError, ErrorCode
from npud.requests.clients import Client
from npud.requests.handler import CallTiming
from npud.runtime.scheduler import Account


def _limits(
    *, max_in_flight: int = 64, max_timeout_ms: int = 600_000, default_timeout_ms: int | None = None
) -> p.ClientLimits:
    return p.ClientLimits(
        priority=p.Priority.NORMAL,
        max_in_flight=max_in_flight,
        max_timeout_ms=max_timeout_ms,
        default_timeout_ms=default_timeout_ms,
    )


def _client() -> Client:
    client = Client(pid=1, uid=1000, gid=1000)
    client.account = Account(name="test", klass=1)
    return client


def test_a_timing_holds_the_call_s_timeout_deadline_and_account() -> None:
    client = _client()
    before = time.monotonic()
    timing = CallTiming(client, _limits(), 250, 1_000)
    assert (timing.timeout_ms, timing.timeout) == (250, 0.25)
    assert timing.deadline_ms == 1_000
    assert timing.deadline is not None
    assert before + 1.0 <= timing.deadline <= time.monotonic() + 1.0
    assert timing.account is client.account


def test_without_a_timeout_the_client_s_default_applies_and_no_deadline() -> None:
    timing = CallTiming(_client(), _limits(default_timeout_ms=5_000), None, None)
    assert (timing.timeout_ms, timing.timeout) == (5_000, 5.0)
    assert (timing.deadline_ms, timing.deadline) == (None, None)
    untimed = CallTiming(_client(), _limits(), None, None)
    assert (untimed.timeout_ms, untimed.timeout) == (None, None)


def test_a_timeout_past_the_client_s_maximum_is_refused() -> None:
    with pytest.raises(CodedError) as refused:
        CallTiming(_client(), _limits(max_timeout_ms=1_000), 1_001, None)
    assert refused.value.code is ErrorCode.INVALID_ARGUMENT
    assert "max_timeout_ms 1000" in str(refused.value)


def test_the_in_flight_count_is_taken_by_begin_and_given_back_once() -> None:
    client = _client()
    timing = CallTiming(client, _limits(max_in_flight=1), None, None)
    timing.end()  # not begun: nothing to give back
    assert client.calls_in_flight == 0
    timing.begin()
    assert client.calls_in_flight == 1
    timing.end()
    timing.end()
    assert (client.calls_in_flight, client.calls_done) == (0, 1)


def test_a_call_past_max_in_flight_is_refused_and_gives_nothing_back() -> None:
    client = _client()
    first = CallTiming(client, _limits(max_in_flight=1), None, None)
    first.begin()
    second = CallTiming(client, _limits(max_in_flight=1), None, None)
    with pytest.raises(CodedError) as refused:
        second.begin()
    assert refused.value.code is ErrorCode.QUOTA_EXCEEDED
    second.end()  # the handler's end after the refusal
    assert client.calls_in_flight == 1
