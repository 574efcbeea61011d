"""How the emulated portal_qnn skel refuses and fails: the refusals model_load gives as
AEE codes, the model runtime's failures as QNN numbers, and last_error's text of one."""

from __future__ import annotations

import re
from typing import Final

from npu_protocol.aee import AEE
from npud.sim.qnn_limits import MAX_ERROR_BYTES


class RefusedError(Exception):
    """model_load refused with an AEE code (nothing was loaded)."""

    def __init__(self, code: AEE, reason: str) -> None:
        super().__init__(reason)
        self.code = code


class QnnFailureError(Exception):
    """The model runtime failed: a QNN error number for qnn_status."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status = status


_ORT_PREFIX: Final = re.compile(r"\[ONNXRuntimeError\] : \d+ : [A-Z_]+ : ")
_ORT_NODE: Final = re.compile(
    r"Non-zero status code returned while running (\S+) node\. Name:'([^']*)' Status Message: "
)
# An ORT_ENFORCE failure: "<source file>:<line> <C++ signature> <condition> was false. <why>".
_ORT_ENFORCE: Final = re.compile(r"^\S+:\d+ .*? was false\. ")


def failure_text(exc: Exception) -> bytes:
    """What last_error reports for ``exc``: onnxruntime's innermost reason, with the node
    that gave it, in at most MAX_ERROR_BYTES - 1 bytes of UTF-8 (cut at a character)."""
    text = _ORT_PREFIX.sub("", str(exc))
    nodes = list(_ORT_NODE.finditer(text))
    if nodes:
        last = nodes[-1]
        reason = _ORT_ENFORCE.sub("", text[last.end() :])
        named = f" {last.group(2)!r}" if last.group(2) else ""
        text = f"{last.group(1)} node{named}: {reason}"
    else:
        text = _ORT_ENFORCE.sub("", text)
    text = " ".join(text.split())  # no newlines or control characters
    return text.encode("utf-8")[: MAX_ERROR_BYTES - 1].decode("utf-8", "ignore").encode("utf-8")
