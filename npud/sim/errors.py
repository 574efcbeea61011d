"""How the emulated kernel fails, and the DSP-side conditions that become failures."""

from __future__ import annotations

import os
from typing import Final

from npu_protocol.aee import AEE

ERRNO_MAX: Final = 4095
"""libc treats a syscall result in -4095..-1 as an errno."""


def fault(err: int, detail: str = "") -> OSError:
    """The OSError a failing syscall raises; ``detail`` says which rule was broken."""
    message = os.strerror(err)
    if detail:
        message = f"{message} ({detail})"
    return OSError(err, message)


class SubsystemDownError(Exception):
    """The DSP restarted (SSR) while this call was in flight: the ioctl fails with EPIPE."""


class ProcessExitedError(Exception):
    """The DSP process exited while this call waited for it: AEE_EBADSTATE."""


class ReverseTimeoutError(Exception):
    """No listener answered a reverse-RPC request in time."""

    def __init__(self, picked_up: bool) -> None:
        self.picked_up = picked_up
        what = "did not answer" if picked_up else "never picked the request up"
        super().__init__(f"reverse-RPC listener {what}")


class ListenerInterruptedError(Exception):
    """A next2 call was interrupted (fault injection): it returns AEE_EINTERRUPTED."""


class LoadError(Exception):
    """A failed dlopen on the DSP: remotectl open reports ``code`` and ``message``."""

    def __init__(self, message: str, code: int = AEE.ENOSUCHMOD.dsp) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
