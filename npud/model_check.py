"""A model file's checks, on a thread of the load's own.

Before a model reaches the DSP npud walks its file (its kind, external data, a loop,
its shapes: :meth:`npud.fastrpc.stubs.portal_qnn.PortalQnn.check`). A hostile file can
make that walk long (millions of tiny protobuf fields), so it does not run on the
domain's loader lane, where another user's open or load would wait behind it: each
load's checks run on a thread of their own (a user has at most ``[uid_limits]
max_loads_in_flight`` of them), within ``[daemon] model_check_s``
(:class:`npud.formats.onnx_proto.Budget`: past it the load is refused
MODEL_REJECTED). The walk is linear in the file and bounded in memory
(npud.formats.onnx_proto). The load request waits for :attr:`FileCheck.done` (a gate)
before it goes to the loader lane with the result.

The check reads its own duplicate of the client's fd, closed when the check ends, so
the request may close the client's fd whenever it ends.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Literal

import structlog

from npu_protocol import CodedError, ErrorCode
from npud.clients import Gate

if TYPE_CHECKING:  # loaded with the first model load, not at start-up
    from npud.fastrpc.stubs.portal_qnn import CheckedFile

log = structlog.get_logger("npud.model_check")


class FileCheck:
    """One load's checks on a thread of their own; :attr:`done` opens when they end and
    :meth:`outcome` then says what they found (or raises their refusal)."""

    def __init__(
        self,
        fd: int,
        backend: Literal["kernel", "emulator"],
        shapes: Mapping[str, Sequence[int]],
        seconds: float | None,
    ) -> None:
        self.done = Gate()
        self._backend: Literal["kernel", "emulator"] = backend
        self._shapes = shapes
        self._seconds = seconds
        self._result: CheckedFile | None = None
        self._error: CodedError | None = None
        try:
            self._fd = os.dup(fd)  # the thread's own: closed when the check ends
        except OSError as exc:
            raise CodedError(
                ErrorCode.MODEL_FILE_UNREADABLE, detail=f"cannot check the file: {exc.strerror}"
            ) from None
        self._thread = threading.Thread(target=self._run, name="model-check", daemon=True)
        try:
            self._thread.start()
        except RuntimeError:
            os.close(self._fd)
            raise CodedError(
                ErrorCode.INTERNAL_ERROR, detail="no thread for the model check"
            ) from None

    def _run(self) -> None:
        from npud.fastrpc.stubs.portal_qnn import PortalQnn  # noqa: PLC0415  (see the docstring)
        from npud.formats.onnx_proto import Budget  # noqa: PLC0415

        try:
            self._result = PortalQnn.check(
                self._fd, self._backend, self._shapes, Budget(self._seconds)
            )
        except CodedError as exc:
            self._error = exc
        except Exception as exc:
            log.exception("model check failed")
            self._error = CodedError(ErrorCode.INTERNAL_ERROR, detail=type(exc).__name__)
        finally:
            os.close(self._fd)
            self.done.open()

    def outcome(self) -> CheckedFile:
        """What the checks found (once :attr:`done` is open); their refusal raised."""
        assert self.done.is_open, "the check has not ended"
        if self._error is not None:
            raise self._error
        assert self._result is not None
        return self._result
