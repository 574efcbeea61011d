"""The leak scanner itself: it must catch what it is there to catch."""

from __future__ import annotations

import npu_protocol as p
from npu_protocol import ErrorCode, format_message
from tests.error_scan import leaked_numbers


def scan(request: p.Request, error: ErrorCode, /, **fields: object) -> list[str]:
    return leaked_numbers(request, error, fields, format_message(error, **fields))


INVOKE = p.InvokeRequest(
    id=7,
    handle=4,
    method=2,
    inputs=(p.BufferSlice(buffer=1, offset=5000, length=8),),
)


def test_the_requests_own_ids_pass() -> None:
    assert scan(INVOKE, ErrorCode.UNKNOWN_HANDLE, handle=4) == []
    assert scan(INVOKE, ErrorCode.UNKNOWN_BUFFER, buffer=1) == []
    assert (
        scan(INVOKE, ErrorCode.SLICE_OUT_OF_RANGE, offset=5000, length=8, buffer=1, size=8192) == []
    )
    assert scan(INVOKE, ErrorCode.INVOKE_FAILED, code=0x8000040E) == []
    assert scan(INVOKE, ErrorCode.QUOTA_EXCEEDED, resource="calls in flight", limit=16) == []


def test_a_dsp_handle_is_caught() -> None:
    problems = scan(INVOKE, ErrorCode.UNKNOWN_HANDLE, handle=33554528)
    assert problems
    assert "33554528" in problems[0]


def test_another_tables_id_is_caught() -> None:
    assert scan(INVOKE, ErrorCode.UNKNOWN_BUFFER, buffer=13)


def test_a_number_hidden_in_free_text_is_caught() -> None:
    assert scan(INVOKE, ErrorCode.INVALID_ARGUMENT, detail="fd 9 is closed")
    assert scan(INVOKE, ErrorCode.INVALID_ARGUMENT, detail="buffer id 1 is not mapped") == []


def test_numbers_of_the_template_and_of_the_limits_pass() -> None:
    alloc = p.AllocRequest(id=1, size=(256 << 20) + 1)
    assert scan(alloc, ErrorCode.DMA_EXCEEDS_MAX_SIZE, size=(256 << 20) + 1, limit=256 << 20) == []
    limits = p.ClientLimits(priority=p.Priority.NORMAL, max_timeout_ms=600_000)
    detail = "timeout_ms 700000 exceeds max_timeout_ms 600000"
    message = format_message(ErrorCode.INVALID_ARGUMENT, detail=detail)
    patient = p.InvokeRequest(id=1, handle=1, method=0, timeout_ms=700_000)
    assert leaked_numbers(patient, ErrorCode.INVALID_ARGUMENT, {"detail": detail}, message) != []
    assert (
        leaked_numbers(patient, ErrorCode.INVALID_ARGUMENT, {"detail": detail}, message, limits)
        == []
    )
