"""Client library for npud, the daemon that brokers the Hexagon NPU.

>>> import npu_client
>>> with npu_client.connect() as npu, npu.alloc(4096) as buffer:
...     buffer.view()[:5] = b"hello"

``connect()`` gives a blocking client that threads may share;
``open_trio_client()`` (needs the ``trio`` extra) an async one with the same
methods, awaited. Importing this package never imports trio, nor
llama-cpp-python (``Client.load_llm`` does, with the ``llm`` extra).
"""

from __future__ import annotations

import os
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import TYPE_CHECKING

from npu_client._args import InvokeInput, InvokeOutput
from npu_client._blocking import Client, DmaBuffer, Model, RemoteHandle, connect, is_available
from npu_client._chain import Chain, Step
from npu_client._core import ClientStatistics, EventCallback
from npu_client._errors import (
    ERROR_CLASSES,
    GROUPS,
    AdmissionRefused,
    BadFrameHeader,
    BadMessage,
    ConnectFailed,
    ConnectionClosedError,
    DeadlineExceeded,
    DeviceError,
    DeviceNotFound,
    DmaBufAllocFailed,
    DmaExceedsMaxSize,
    DmaSizeOverflow,
    DspRestarted,
    DuplicateRequestId,
    FastRpcError,
    FdCountMismatch,
    FdsTruncated,
    FrameTooLarge,
    InputNotSet,
    InternalError,
    InvalidArgument,
    InvalidFd,
    InvalidTensorIndex,
    InvokeFailed,
    MissingFds,
    MmapFailed,
    ModelFileUnreadable,
    ModelFormatError,
    ModelMalformed,
    ModelNotLoaded,
    ModelRejected,
    ModelSlotsFull,
    NoFreeSession,
    NoOutputs,
    NotPermitted,
    NpuAccessError,
    NpuConnectionError,
    NpuDspError,
    NpuError,
    NpuModelError,
    NpuUsageError,
    OpenFailed,
    OutputTooLarge,
    QnnError,
    QuotaExceeded,
    SessionBusy,
    SessionClosed,
    ShellVerifyFailed,
    ShuttingDownError,
    SliceOutOfRange,
    TensorMismatch,
    Timeout,
    TooManyFds,
    TooManyInFlight,
    TruncatedFrame,
    UnexpectedMessage,
    UnknownBuffer,
    UnknownHandle,
    UnknownRequestId,
    Unsupported,
    UnsupportedVersion,
    error_class,
)
from npu_client._llm import LlmStatistics, LlmUnavailable, locate_libraries
from npu_client._llm_client import Llm
from npu_client._memory import Slice
from npu_client._settings import DEFAULT_SOCKET_PATH, SOCKET_ENV, socket_path
from npu_client._version import __version__ as __version__
from npu_protocol import DaemonStatus, ModelInfo, Priority, TensorInfo

if TYPE_CHECKING:
    from npu_client.trio_client import TrioClient


def llm_libraries() -> Path:
    """The directory ``load_llm`` loads llama.cpp from (``$NPUD_LLAMA_LIB``, else the
    peer build's cache's ``llm/``); :class:`LlmUnavailable` says what is missing there
    and how to build it. Loads nothing."""
    return locate_libraries().directory


def open_trio_client(
    path: str | os.PathLike[str] | None = None,
    *,
    name: str | None = None,
    priority: Priority | str = Priority.NORMAL,
    on_event: EventCallback | None = None,
) -> AbstractAsyncContextManager[TrioClient]:
    """``async with npu_client.open_trio_client() as npu:`` a trio client, closed on exit.

    The arguments are :func:`connect`'s. Needs trio (``pip install npu-client[trio]``);
    trio is imported here, not when ``npu_client`` is.
    """
    from npu_client import trio_client  # noqa: PLC0415  (trio only when asked for)

    return trio_client.open_trio_client(path, name=name, priority=priority, on_event=on_event)


__all__ = [
    "DEFAULT_SOCKET_PATH",
    "ERROR_CLASSES",
    "GROUPS",
    "SOCKET_ENV",
    "AdmissionRefused",
    "BadFrameHeader",
    "BadMessage",
    "Chain",
    "Client",
    "ClientStatistics",
    "ConnectFailed",
    "ConnectionClosedError",
    "DaemonStatus",
    "DeadlineExceeded",
    "DeviceError",
    "DeviceNotFound",
    "DmaBufAllocFailed",
    "DmaBuffer",
    "DmaExceedsMaxSize",
    "DmaSizeOverflow",
    "DspRestarted",
    "DuplicateRequestId",
    "EventCallback",
    "FastRpcError",
    "FdCountMismatch",
    "FdsTruncated",
    "FrameTooLarge",
    "InputNotSet",
    "InternalError",
    "InvalidArgument",
    "InvalidFd",
    "InvalidTensorIndex",
    "InvokeFailed",
    "InvokeInput",
    "InvokeOutput",
    "Llm",
    "LlmStatistics",
    "LlmUnavailable",
    "MissingFds",
    "MmapFailed",
    "Model",
    "ModelFileUnreadable",
    "ModelFormatError",
    "ModelInfo",
    "ModelMalformed",
    "ModelNotLoaded",
    "ModelRejected",
    "ModelSlotsFull",
    "NoFreeSession",
    "NoOutputs",
    "NotPermitted",
    "NpuAccessError",
    "NpuConnectionError",
    "NpuDspError",
    "NpuError",
    "NpuModelError",
    "NpuUsageError",
    "OpenFailed",
    "OutputTooLarge",
    "Priority",
    "QnnError",
    "QuotaExceeded",
    "RemoteHandle",
    "SessionBusy",
    "SessionClosed",
    "ShellVerifyFailed",
    "ShuttingDownError",
    "Slice",
    "SliceOutOfRange",
    "Step",
    "TensorInfo",
    "TensorMismatch",
    "Timeout",
    "TooManyFds",
    "TooManyInFlight",
    "TruncatedFrame",
    "UnexpectedMessage",
    "UnknownBuffer",
    "UnknownHandle",
    "UnknownRequestId",
    "Unsupported",
    "UnsupportedVersion",
    "connect",
    "error_class",
    "is_available",
    "llm_libraries",
    "open_trio_client",
    "socket_path",
]
