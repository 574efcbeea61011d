"""One exception class per stable error code, so callers can ``except QuotaExceeded``.

Every error npud reports carries a number from ``npu_protocol.ErrorCode``; the
client raises the class registered for that number, carrying the code, the
server's rendered message and the template's fields. A number this version
does not know (a newer daemon) raises the base class, :class:`NpuError`.

Each class sits under one of five groups, as callers catch them (:data:`GROUPS`):
:class:`NpuConnectionError` (reconnect), :class:`NpuAccessError` (not allowed, over a
quota), :class:`NpuDspError` (the DSP failed or was late), :class:`NpuModelError` and
:class:`NpuUsageError` (the request was wrong); all under :class:`NpuError`.

The class names are the ErrorCode names in CamelCase (``DSP_RESTARTED`` is
``DspRestarted``), which is why they do not all end in ``Error``. Two codes
name something ``npu_protocol`` also has (its ``ConnectionClosed`` and
``ShuttingDown`` events): their classes add ``Error``, so no name of this
package means something else in the protocol's.
"""

# ruff: noqa: N818  (the names mirror the stable ErrorCode names; see above)

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any, ClassVar, Final

from npu_protocol import ErrorCode, ErrorMessage, ProtocolError, format_message

_REGISTRY: dict[int, type[NpuError]] = {}


class NpuError(Exception):
    """An error reported by npud, or found by the client, with a stable code.

    ``code`` is the number (an ``ErrorCode`` member when this version knows
    it), ``message`` the text for people, ``fields`` the values the message
    was rendered from (DSP result codes as integers).
    """

    error_code: ClassVar[ErrorCode | None] = None
    """The code this class stands for; None on the base class."""

    code: int
    message: str
    fields: Mapping[str, int | str]

    def __init_subclass__(cls, *, code: ErrorCode | None = None, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if code is not None:
            if code in _REGISTRY:
                raise TypeError(f"{code.name} already has {_REGISTRY[code].__name__}")
            cls.error_code = code
            _REGISTRY[code] = cls

    def __init__(
        self,
        message: str,
        *,
        code: int | None = None,
        fields: Mapping[str, int | str] | None = None,
    ) -> None:
        resolved = code if code is not None else self.error_code
        if resolved is None:
            raise TypeError("NpuError needs a code (subclasses carry their own)")
        super().__init__(message)
        self.code = _known(resolved)
        self.message = message
        self.fields = MappingProxyType(dict(fields or {}))

    @property
    def name(self) -> str:
        """The code's name (``QUOTA_EXCEEDED``), or ``ERROR_<n>`` for an unknown number."""
        return self.code.name if isinstance(self.code, ErrorCode) else f"ERROR_{self.code}"

    def __str__(self) -> str:
        return self.message


class NpuConnectionError(NpuError):
    """npud could not be reached, went away, or the wire between broke (5xx, ``CONNECTION_CLOSED``,
    ``SHUTTING_DOWN``): everything made on the connection is gone; connect again."""


class NpuAccessError(NpuError):
    """npud will not do it for this client: not allowed, over a quota, or a budget it
    cannot admit. Retrying the same way fails the same way."""


class NpuDspError(NpuError):
    """The DSP side failed or took too long: a skel's or the DSP's own result, a restart,
    no session, the shell, a timeout or a missed deadline (and npud's own bugs)."""


class NpuModelError(NpuError):
    """A model could not be loaded or run: its file, its shapes, its inputs, the runtime."""


class NpuUsageError(NpuError):
    """The request itself was wrong: an unknown id, a bad argument or size, something
    this npud does not support."""


GROUPS: Final = (NpuConnectionError, NpuAccessError, NpuDspError, NpuModelError, NpuUsageError)
"""The ways callers catch errors; every code's class is in exactly one."""


def _known(code: int) -> int:
    try:
        return ErrorCode(code)
    except ValueError:
        return code


def error_class(code: int) -> type[NpuError]:
    """The exception class for ``code``; :class:`NpuError` for numbers not known here."""
    return _REGISTRY.get(code, NpuError)


def make_error(code: int, message: str, fields: Mapping[str, int | str] | None = None) -> NpuError:
    """An exception of the class registered for ``code``."""
    return error_class(code)(message, code=code, fields=fields)


def error_from_message(error: ErrorMessage) -> NpuError:
    """The exception for an ``error`` the server sent."""
    return make_error(error.code, error.message, error.fields)


def error_from_protocol(exc: ProtocolError) -> NpuError:
    """The exception for a protocol violation (ours or the server's)."""
    fields = {name: _field(value) for name, value in exc.fields.items()}
    return make_error(exc.code, exc.message, fields)


def _field(value: object) -> int | str:
    return value if isinstance(value, int) and not isinstance(value, bool) else str(value)


def code_message(code: ErrorCode, detail: str = "", **fields: Any) -> str:
    """``code``'s template rendered with ``fields``; ``detail`` is appended after a colon
    (templates only ever gain detail at their end, so the start stays greppable)."""
    message = format_message(code, **fields)
    return f"{message}: {detail}" if detail else message


# --- FastRPC and the DSP (1xx) ---------------------------------------------------------


class FastRpcError(NpuDspError, code=ErrorCode.FASTRPC):
    """A FastRPC call failed with a DSP result code (``fields["rc"]``)."""


class OpenFailed(NpuDspError, code=ErrorCode.OPEN_FAILED):
    """The DSP refused to open a skel; ``fields`` has the uri, result code and dlerror text."""


class InvokeFailed(NpuDspError, code=ErrorCode.INVOKE_FAILED):
    """The remote method returned non-zero; ``fields["code"]`` is its 32-bit result."""


class MmapFailed(NpuDspError, code=ErrorCode.MMAP_FAILED):
    """Mapping a buffer into the DSP failed."""


class DspRestarted(NpuDspError, code=ErrorCode.DSP_RESTARTED):
    """The DSP session restarted: handles and mappings of earlier epochs are gone."""


class NoFreeSession(NpuDspError, code=ErrorCode.NO_FREE_SESSION):
    """Every FastRPC compute context bank is in use."""


class Unsupported(NpuUsageError, code=ErrorCode.UNSUPPORTED):
    """The daemon or the DSP does not support what was asked."""


class DeviceNotFound(NpuDspError, code=ErrorCode.DEVICE_NOT_FOUND):
    """No FastRPC device node."""


class DeviceError(NpuDspError, code=ErrorCode.DEVICE_ERROR):
    """An operation on the FastRPC device failed."""


class UnknownHandle(NpuUsageError, code=ErrorCode.UNKNOWN_HANDLE):
    """The handle id is not open on this connection."""


class SessionClosed(NpuDspError, code=ErrorCode.SESSION_CLOSED):
    """The daemon's FastRPC session is closed."""


# --- memory (2xx) ----------------------------------------------------------------------


class DmaBufAllocFailed(NpuDspError, code=ErrorCode.DMA_BUF_ALLOC):
    """The daemon could not allocate the DMA-BUF."""


class DmaSizeOverflow(NpuUsageError, code=ErrorCode.DMA_SIZE_OVERFLOW):
    """The size overflows when rounded up to a page."""


class DmaExceedsMaxSize(NpuUsageError, code=ErrorCode.DMA_EXCEEDS_MAX_SIZE):
    """The size is above the ceiling the message names (``fields["limit"]``; an alloc
    above this connection's ``limits.max_buffer_size`` is refused here, before it is
    sent, and by the daemon as :class:`QuotaExceeded`)."""


class InvalidFd(NpuUsageError, code=ErrorCode.INVALID_FD):
    """A file descriptor was not valid."""


class SliceOutOfRange(NpuUsageError, code=ErrorCode.SLICE_OUT_OF_RANGE):
    """A buffer slice reaches past its buffer."""


class UnknownBuffer(NpuUsageError, code=ErrorCode.UNKNOWN_BUFFER):
    """The buffer id is not live on this connection."""


class InvalidArgument(NpuUsageError, code=ErrorCode.INVALID_ARGUMENT):
    """The daemon rejected an argument."""


# --- models (3xx) ----------------------------------------------------------------------


class QnnError(NpuModelError, code=ErrorCode.QNN):
    """The model runtime failed (composing or running a graph); the QNN error number
    is in the message."""


class ModelNotLoaded(NpuModelError, code=ErrorCode.MODEL_NOT_LOADED):
    """The model was unloaded, or is gone with its connection."""


class InvalidTensorIndex(NpuModelError, code=ErrorCode.INVALID_TENSOR_INDEX):
    """No such tensor: a name (or index) the model does not have."""


class ModelSlotsFull(NpuModelError, code=ErrorCode.MODEL_SLOTS_FULL):
    """The DSP has no free model slot."""


class TensorMismatch(NpuModelError, code=ErrorCode.TENSOR_MISMATCH):
    """A tensor's data type, shape or size is not the model's (or shapes given at
    load do not fit it)."""


class InputNotSet(NpuModelError, code=ErrorCode.INPUT_NOT_SET):
    """A run or execute before every input was given a value."""


class ModelFileUnreadable(NpuModelError, code=ErrorCode.MODEL_FILE_UNREADABLE):
    """The model file cannot be read (not a regular file, empty, I/O error)."""


class ModelFormatError(NpuModelError, code=ErrorCode.MODEL_FORMAT):
    """The model file is of a format this backend does not load; the message says which
    it takes."""


class ModelMalformed(NpuModelError, code=ErrorCode.MODEL_MALFORMED):
    """The model file is of the right format but damaged or not loadable."""


class ModelRejected(NpuModelError, code=ErrorCode.MODEL_REJECTED):
    """The model is outside the NPU's limits (tensor count, rank, size, free dimensions)."""


class NoOutputs(NpuModelError, code=ErrorCode.NO_OUTPUTS):
    """An output was read before a successful run or execute."""


class OutputTooLarge(NpuModelError, code=ErrorCode.OUTPUT_TOO_LARGE):
    """A run produced an output larger than the room its load gave it; the message
    names the tensor, its room and the size the run needed."""


# --- session and shell (4xx) -----------------------------------------------------------


class SessionBusy(NpuDspError, code=ErrorCode.SESSION_BUSY):
    """The NPU session is busy."""


class ShellVerifyFailed(NpuDspError, code=ErrorCode.SHELL_VERIFY):
    """The DSP shell failed verification."""


# --- wire protocol (5xx) ---------------------------------------------------------------


class FrameTooLarge(NpuConnectionError, code=ErrorCode.FRAME_TOO_LARGE):
    """A frame exceeded the frame limit."""


class BadFrameHeader(NpuConnectionError, code=ErrorCode.BAD_FRAME_HEADER):
    """A frame header was malformed."""


class TooManyFds(NpuConnectionError, code=ErrorCode.TOO_MANY_FDS):
    """A frame declared more fds than allowed."""


class MissingFds(NpuConnectionError, code=ErrorCode.MISSING_FDS):
    """A frame's fds did not arrive with it."""


class FdCountMismatch(NpuConnectionError, code=ErrorCode.FD_COUNT_MISMATCH):
    """A frame declared a different number of fds than its message carries."""


class FdsTruncated(NpuConnectionError, code=ErrorCode.FDS_TRUNCATED):
    """The kernel dropped fds (MSG_CTRUNC)."""


class BadMessage(NpuConnectionError, code=ErrorCode.BAD_MESSAGE):
    """A payload was not a valid message."""


class UnexpectedMessage(NpuConnectionError, code=ErrorCode.UNEXPECTED_MESSAGE):
    """A message arrived that the state machine does not allow."""


class UnsupportedVersion(NpuConnectionError, code=ErrorCode.UNSUPPORTED_VERSION):
    """No protocol version both sides speak."""


class DuplicateRequestId(NpuConnectionError, code=ErrorCode.DUPLICATE_REQUEST_ID):
    """A request id was reused while in flight."""


class UnknownRequestId(NpuConnectionError, code=ErrorCode.UNKNOWN_REQUEST_ID):
    """An answer named a request id that is not in flight."""


class TooManyInFlight(NpuConnectionError, code=ErrorCode.TOO_MANY_IN_FLIGHT):
    """More requests in flight than the limit."""


class TruncatedFrame(NpuConnectionError, code=ErrorCode.TRUNCATED_FRAME):
    """The stream ended inside a frame."""


class ConnectionClosedError(NpuConnectionError, code=ErrorCode.CONNECTION_CLOSED):
    """The connection to npud ended (or was closed here) before the answer came."""


class ConnectFailed(ConnectionClosedError):
    """npud could not be reached at ``path``; the message says why and what to do."""

    def __init__(self, message: str, *, path: str) -> None:
        super().__init__(message, fields={"path": path})
        self.path = path


# --- admission and service (6xx) -------------------------------------------------------


class NotPermitted(NpuAccessError, code=ErrorCode.NOT_PERMITTED):
    """The daemon refused this client or this request."""


class QuotaExceeded(NpuAccessError, code=ErrorCode.QUOTA_EXCEEDED):
    """A per-client or global quota would be exceeded; ``fields`` names it and its limit."""


class Timeout(NpuDspError, TimeoutError, code=ErrorCode.TIMEOUT):
    """The daemon gave up waiting (the call may still finish on the DSP).

    A ``TimeoutError``, like the one this side raises when npud does not
    answer in time, so ``except TimeoutError`` catches both.
    """


class ShuttingDownError(NpuConnectionError, code=ErrorCode.SHUTTING_DOWN):
    """npud is shutting down (``npu_protocol.ShuttingDown`` is the event that says so)."""


class InternalError(NpuDspError, code=ErrorCode.INTERNAL_ERROR):
    """A bug in npud; its log has the details."""


class DeadlineExceeded(NpuDspError, code=ErrorCode.DEADLINE_EXCEEDED):
    """The call's deadline passed before a DSP slot was free: it never ran."""


class AdmissionRefused(NpuAccessError, code=ErrorCode.ADMISSION_REFUSED):
    """The realtime budget declared at connect would overcommit the DSP."""


ERROR_CLASSES: Mapping[int, type[NpuError]] = MappingProxyType(_REGISTRY)
"""Every registered class by code number."""
