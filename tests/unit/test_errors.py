"""Stable error codes and messages: a runbook contract, pinned word for word."""

from __future__ import annotations

import errno

import pytest

from npu_protocol import AEE, ErrorCode, aee_name, describe_result, format_message
from npu_protocol.errors import template
from npud.fastrpc.kernel import abi
from npud.fastrpc.kernel.errors import (
    INVOKE_ERRNOS,
    DriverCall,
    InterruptedCallError,
    RpcError,
    ShellVerifyError,
    dsp_result_in_errno_range,
    translate_os_error,
)
from tests.protocol.published_templates import CORRECTED, PUBLISHED

# Numbers never change and are never reused.
PINNED_NUMBERS = {
    "FASTRPC": 100,
    "OPEN_FAILED": 101,
    "INVOKE_FAILED": 102,
    "MMAP_FAILED": 103,
    "DSP_RESTARTED": 104,
    "NO_FREE_SESSION": 105,
    "UNSUPPORTED": 106,
    "DEVICE_NOT_FOUND": 107,
    "DEVICE_ERROR": 108,
    "UNKNOWN_HANDLE": 109,
    "SESSION_CLOSED": 110,
    "DMA_BUF_ALLOC": 200,
    "DMA_SIZE_OVERFLOW": 201,
    "DMA_EXCEEDS_MAX_SIZE": 202,
    "INVALID_FD": 203,
    "SLICE_OUT_OF_RANGE": 204,
    "UNKNOWN_BUFFER": 205,
    "INVALID_ARGUMENT": 206,
    "QNN": 300,
    "MODEL_NOT_LOADED": 301,
    "INVALID_TENSOR_INDEX": 302,
    "SESSION_BUSY": 400,
    "SHELL_VERIFY": 401,
}


@pytest.mark.parametrize(("name", "number"), PINNED_NUMBERS.items())
def test_error_numbers_are_stable(name: str, number: int) -> None:
    assert ErrorCode[name] == number


def test_error_numbers_are_unique() -> None:
    # Iterating an IntEnum skips aliases, so count the members by name: two
    # names with one number would be one member and an alias.
    members = ErrorCode.__members__
    assert len({int(code) for code in members.values()}) == len(members)
    assert all(name == code.name for name, code in members.items())


@pytest.mark.parametrize(
    ("code", "fields", "message"),
    [
        (
            ErrorCode.FASTRPC,
            {"rc": 0x8000040E},
            "FastRPC call failed with DSP result 0x8000040E (AEE_EBADPARM)",
        ),
        (
            ErrorCode.OPEN_FAILED,
            {"uri": "file:///libx_skel.so?x", "code": 0x8000043E, "detail": "no such file"},
            "cannot open remote module 'file:///libx_skel.so?x': 0x8000043E (AEE_ENOSUCHMOD): no such file",
        ),
        (
            ErrorCode.INVOKE_FAILED,
            {"code": 0x80000414},
            "remote invoke failed with DSP result 0x80000414 (AEE_EUNSUPPORTED)",
        ),
        (
            ErrorCode.MMAP_FAILED,
            {"code": 0x12345678},
            "mapping buffer into the DSP failed: 0x12345678",
        ),
        (
            ErrorCode.DSP_RESTARTED,
            {},
            "the DSP restarted (subsystem restart, EPIPE): every DSP handle and mapping is gone; "
            "reopen the session (or the client's DSP process alone ended: it crashed, or a call "
            "hung past the watchdog)",
        ),
        (
            ErrorCode.NO_FREE_SESSION,
            {"device": "/dev/fastrpc-cdsp"},
            "no free FastRPC session on /dev/fastrpc-cdsp (EBUSY): every compute context bank is in use",
        ),
        (ErrorCode.DMA_BUF_ALLOC, {"msg": "ENOMEM"}, "DMA-BUF allocation failed: ENOMEM"),
        (
            ErrorCode.DMA_SIZE_OVERFLOW,
            {"size": 2**64 - 1},
            f"DMA buffer size {2**64 - 1} overflows when rounded up to a page",
        ),
        (
            ErrorCode.DMA_EXCEEDS_MAX_SIZE,
            {"size": 4294967297, "limit": 4294967296},
            "DMA buffer size 4294967297 exceeds the maximum of 4294967296 bytes",
        ),
        (ErrorCode.QNN, {"msg": "graph finalize failed"}, "QNN error: graph finalize failed"),
        (ErrorCode.MODEL_NOT_LOADED, {"model": 3}, "no model is loaded: model 3"),
        (ErrorCode.INVALID_TENSOR_INDEX, {"index": 7}, "invalid tensor index 7"),
        (
            ErrorCode.MODEL_SLOTS_FULL,
            {"detail": "all 4 model slots of this handle are in use"},
            "no free model slot: all 4 model slots of this handle are in use",
        ),
        (
            ErrorCode.TENSOR_MISMATCH,
            {"detail": "input 'a' takes float32 [3]"},
            "tensor mismatch: input 'a' takes float32 [3]",
        ),
        (ErrorCode.INPUT_NOT_SET, {"detail": "input 'b'"}, "input not set: input 'b'"),
        (
            ErrorCode.MODEL_FILE_UNREADABLE,
            {"detail": "the model file is empty"},
            "unreadable model file: the model file is empty",
        ),
        (
            ErrorCode.MODEL_FORMAT,
            {"detail": "the emulator backend takes ONNX models"},
            "wrong model format: the emulator backend takes ONNX models",
        ),
        (ErrorCode.MODEL_MALFORMED, {"detail": "truncated"}, "malformed model: truncated"),
        (ErrorCode.MODEL_REJECTED, {"detail": "rank 9"}, "model rejected: rank 9"),
        (ErrorCode.NO_OUTPUTS, {"detail": "run it first"}, "no outputs: run it first"),
        (ErrorCode.SESSION_BUSY, {}, "the NPU session is busy"),
        (
            ErrorCode.SHELL_VERIFY,
            {"reason": "bad signature"},
            "DSP shell verification failed: bad signature",
        ),
        (ErrorCode.INVALID_FD, {"fd": -3}, "invalid file descriptor -3"),
        (ErrorCode.UNKNOWN_HANDLE, {"handle": 9}, "unknown remote handle 9"),
        (
            ErrorCode.SLICE_OUT_OF_RANGE,
            {"offset": 10, "length": 20, "buffer": 3, "size": 16},
            "slice offset 10 length 20 is outside buffer 3 of 16 bytes",
        ),
    ],
)
def test_messages_are_pinned(code: ErrorCode, fields: dict[str, object], message: str) -> None:
    assert format_message(code, **fields) == message
    assert str(RpcError(code, **fields)) == message


def test_every_code_has_a_template() -> None:
    for code in ErrorCode:
        from npu_protocol.errors import template

        assert template(code)


def test_missing_or_surplus_fields_are_a_programming_error() -> None:
    with pytest.raises(TypeError, match="DMA_EXCEEDS_MAX_SIZE needs fields"):
        format_message(ErrorCode.DMA_EXCEEDS_MAX_SIZE)
    with pytest.raises(TypeError, match="needs fields"):
        format_message(ErrorCode.SESSION_BUSY, extra=1)


def test_aee_names() -> None:
    assert aee_name(0x8000040E) == "AEE_EBADPARM"
    assert aee_name(14) == "AEE_EBADPARM"
    assert aee_name(0x80000600) == "AEE_ERPC"
    assert aee_name(46) == "AEE_EINTERRUPTED"
    assert aee_name(0x7777) is None
    assert AEE.EBADSTATE.dsp == 0x8000040D
    assert describe_result(-0x7FFFFBF2) == "0x8000040E (AEE_EBADPARM)"  # the signed form
    assert describe_result(0x1234) == "0x00001234"


def test_shell_verify_error_keeps_its_reason() -> None:
    exc = ShellVerifyError("digest mismatch")
    assert exc.code is ErrorCode.SHELL_VERIFY
    assert exc.reason == "digest mismatch"


@pytest.mark.parametrize(
    ("err", "call", "code"),
    [
        (errno.EPIPE, abi.FASTRPC_IOCTL_INVOKE, ErrorCode.DSP_RESTARTED),
        (errno.EPIPE, DriverCall.OPEN, ErrorCode.DSP_RESTARTED),
        (errno.EBUSY, DriverCall.OPEN, ErrorCode.NO_FREE_SESSION),
        (errno.ENOENT, DriverCall.OPEN, ErrorCode.DEVICE_NOT_FOUND),
        (errno.ENOTTY, abi.FASTRPC_IOCTL_FREE_DMA_BUFF, ErrorCode.UNSUPPORTED),
        (errno.EOPNOTSUPP, abi.FASTRPC_IOCTL_GET_DSP_INFO, ErrorCode.UNSUPPORTED),
        (errno.ENOMEM, abi.FASTRPC_IOCTL_ALLOC_DMA_BUFF, ErrorCode.DMA_BUF_ALLOC),
        (errno.ENOMEM, DriverCall.MMAP, ErrorCode.DMA_BUF_ALLOC),
        (errno.EINVAL, abi.FASTRPC_IOCTL_MEM_MAP, ErrorCode.MMAP_FAILED),
        (errno.EINVAL, abi.FASTRPC_IOCTL_INVOKE, ErrorCode.DEVICE_ERROR),
        (errno.EBUSY, abi.FASTRPC_IOCTL_INVOKE, ErrorCode.DEVICE_ERROR),
        (errno.EBUSY, 0x12345678, ErrorCode.DEVICE_ERROR),
    ],
)
def test_os_errors_translate_in_one_place(
    err: int, call: int | DriverCall, code: ErrorCode
) -> None:
    translated = translate_os_error(OSError(err, "x"), call, device="/dev/fastrpc-cdsp")
    assert translated.code is code


def test_an_unknown_ioctl_is_named_by_its_number() -> None:
    exc = translate_os_error(OSError(errno.EIO, "x"), 0x12345678)
    assert str(exc) == ("ioctl 0x12345678 failed on the FastRPC device: EIO (Input/output error)")


def test_translated_device_error_names_the_errno() -> None:
    exc = translate_os_error(
        OSError(errno.EINVAL, "x"), abi.FASTRPC_IOCTL_INVOKE, device="/dev/fastrpc-cdsp"
    )
    assert (
        str(exc)
        == "INVOKE on /dev/fastrpc-cdsp failed on the FastRPC device: EINVAL (Invalid argument)"
    )


# --- errors a real device produces ------------------------------------------------------


def test_eintr_is_an_interrupted_call_that_says_the_dsp_may_run_it() -> None:
    error = translate_os_error(OSError(errno.EINTR, "x"), abi.FASTRPC_IOCTL_INVOKE, device="/dev/x")
    assert isinstance(error, InterruptedCallError)
    assert error.code is ErrorCode.DEVICE_ERROR
    assert str(error) == (
        "INVOKE on /dev/x failed on the FastRPC device: EINTR (Interrupted system call): "
        "a signal or a system suspend interrupted the wait; the DSP may still run the call, "
        "which npud does not repeat"
    )


@pytest.mark.parametrize(
    "call", [abi.FASTRPC_IOCTL_MEM_MAP, abi.FASTRPC_IOCTL_INIT_CREATE, abi.FASTRPC_IOCTL_MMAP]
)
def test_etimedout_is_a_timeout_of_the_kernels_10_seconds(call: int) -> None:
    error = translate_os_error(OSError(errno.ETIMEDOUT, "x"), call)
    assert error.code is ErrorCode.TIMEOUT
    assert str(error).endswith("did not finish within 10000 ms")
    assert not isinstance(error, InterruptedCallError)


@pytest.mark.parametrize(
    ("err", "result"),
    [(errno.ENOENT, 0xFFFFFFFE), (errno.EIO, 0xFFFFFFFB), (4095, 0xFFFFF001)],
)
def test_an_invoke_errno_the_kernel_never_returns_is_the_dsps_result(err: int, result: int) -> None:
    assert dsp_result_in_errno_range(OSError(err, "x"), abi.FASTRPC_IOCTL_INVOKE) == result


def test_ecanceled_is_among_the_kernels_errnos() -> None:
    # issue 21: a cancelled context comes back as ECANCELED; it is the kernel's answer,
    # not a DSP result of -125.
    assert errno.ECANCELED in INVOKE_ERRNOS
    assert (
        dsp_result_in_errno_range(OSError(errno.ECANCELED, "x"), abi.FASTRPC_IOCTL_INVOKE) is None
    )


@pytest.mark.parametrize("err", sorted(INVOKE_ERRNOS))
def test_kernel_errnos_stay_the_kernels(err: int) -> None:
    assert dsp_result_in_errno_range(OSError(err, "x"), abi.FASTRPC_IOCTL_INVOKE) is None


def test_other_calls_never_carry_a_dsp_result_as_errno() -> None:
    assert dsp_result_in_errno_range(OSError(errno.ENOENT, "x"), abi.FASTRPC_IOCTL_MEM_MAP) is None
    assert dsp_result_in_errno_range(OSError(errno.ENOENT, "x"), DriverCall.OPEN) is None
    assert dsp_result_in_errno_range(OSError(None, "x"), abi.FASTRPC_IOCTL_INVOKE) is None


def test_templates_only_gain_detail_at_their_end() -> None:
    """PROTOCOL.md section 11 against the last published table: no code is gone, no
    template changed but by detail added at its end (or to its recorded correction), no
    code added unpublished."""
    current = {int(code): template(code) for code in ErrorCode}
    assert set(current) == set(PUBLISHED), "publish new codes in published_templates.py"
    assert set(CORRECTED) <= set(PUBLISHED)
    published = PUBLISHED | CORRECTED
    broken = {
        code: (published[code], text)
        for code, text in current.items()
        if not text.startswith(published[code])
    }
    assert not broken, broken
