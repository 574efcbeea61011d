"""How portal_qnn's model calls fail, as the daemon reports them: ModelFailure (one
member per stable error), ModelError, and the error for a refused model_load."""

from __future__ import annotations

import enum
from collections.abc import Sequence
from typing import Final

from npu_protocol import AEE, ErrorCode
from npud.fastrpc.kernel.errors import RpcError
from npud.fastrpc.stubs.model_format import Sniffed
from npud.fastrpc.stubs.model_shapes import unsized_outputs_refusal
from npud.fastrpc.stubs.portal_limits import MAX_MODELS
from npud.formats import onnx_proto


class ModelFailure(enum.Enum):
    """What went wrong, one member per stable error the daemon reports for models;
    the value is its ErrorCode (npu_protocol/errors.py)."""

    QNN = (
        ErrorCode.QNN
    )  # the model runtime failed (composing or executing); the QNN code in the text
    NOT_LOADED = ErrorCode.MODEL_NOT_LOADED  # the slot is empty (never loaded, or unloaded)
    BAD_TENSOR = ErrorCode.INVALID_TENSOR_INDEX  # no such tensor (index or name) or graph
    SLOTS_FULL = ErrorCode.MODEL_SLOTS_FULL
    TENSOR_MISMATCH = ErrorCode.TENSOR_MISMATCH  # dtype, shape or size
    INPUT_NOT_SET = ErrorCode.INPUT_NOT_SET
    FILE_UNREADABLE = ErrorCode.MODEL_FILE_UNREADABLE
    FILE_FORMAT = ErrorCode.MODEL_FORMAT  # the wrong kind of file for the backend
    FILE_MALFORMED = ErrorCode.MODEL_MALFORMED  # the right kind, damaged or not loadable
    MODEL_REJECTED = ErrorCode.MODEL_REJECTED  # outside portal_qnn's limits
    NOT_EXECUTED = ErrorCode.NO_OUTPUTS  # get_output before a successful execute
    OUTPUT_TOO_LARGE = ErrorCode.OUTPUT_TOO_LARGE  # an output outgrew its room


FILE_FAILURES: Final = {
    "unreadable": ModelFailure.FILE_UNREADABLE,
    "wrong-format": ModelFailure.FILE_FORMAT,
    "damaged": ModelFailure.FILE_MALFORMED,
    "refused": ModelFailure.MODEL_REJECTED,
}
"""How each way a file fails (ModelFileError.kind) is reported."""


class ModelError(RpcError):
    """A model call failed; ``failure`` says how, ``str()`` is the message."""

    def __init__(self, failure: ModelFailure, message: str) -> None:
        code = failure.value
        if failure is ModelFailure.QNN:
            super().__init__(code, msg=message)
        elif failure is ModelFailure.NOT_LOADED:
            super().__init__(code, model=message)
        elif failure is ModelFailure.BAD_TENSOR:
            super().__init__(code, index=message)
        else:
            super().__init__(code, detail=message)
        self.failure = failure
        self.detail = message


def load_error(
    rc: int, sniffed: Sniffed, unsized: Sequence[onnx_proto.GraphTensor] = (), said: str = ""
) -> RpcError:
    """The error for a model_load that answered ``rc``; ``said`` is the DSP's reason
    (last_error), which replaces the pointer to its log."""
    error = _load_refusal(rc, sniffed, unsized)
    if said and isinstance(error, ModelError):
        log_pointer = "; the DSP's log says which"
        detail = error.detail.removesuffix(log_pointer)
        return ModelError(error.failure, f"{detail}; the DSP says: {said}")
    return error


def _load_refusal(rc: int, sniffed: Sniffed, unsized: Sequence[onnx_proto.GraphTensor]) -> RpcError:
    if rc == AEE.EOUTOFHANDLES.dsp:
        return ModelError(
            ModelFailure.SLOTS_FULL, f"all {MAX_MODELS} model slots of this handle are in use"
        )
    if rc in (AEE.EUNABLETOLOAD.dsp, AEE.ENOSUCHSYMBOL.dsp):
        what = "it is not loadable" if rc == AEE.EUNABLETOLOAD.dsp else "an entry point is missing"
        return ModelError(
            ModelFailure.FILE_MALFORMED,
            f"the DSP could not load the model file ({sniffed.description}): {what}",
        )
    if rc == AEE.EINVALIDFORMAT.dsp:
        limits = (
            "the model is outside portal_qnn's limits: 1..8 graphs, at most 32 inputs and 1..32"
            " outputs each, rank <= 8, names under 128 bytes, known data types, every dimension"
            " fixed (give shapes for free ones); the DSP's log says which"
        )
        if unsized:  # what the DSP could not size is likely these
            return ModelError(
                ModelFailure.MODEL_REJECTED,
                f"{unsized_outputs_refusal(unsized)}; otherwise {limits}",
            )
        return ModelError(ModelFailure.MODEL_REJECTED, limits)
    if rc == AEE.EBADPARM.dsp:
        return ModelError(
            ModelFailure.TENSOR_MISMATCH,
            "the shapes or values given do not fit the model (an unknown tensor, a rank or a"
            " fixed dimension that differs, a value of another kind); the DSP's log says which",
        )
    if rc == AEE.ENOMEMORY.dsp:
        return ModelError(
            ModelFailure.MODEL_REJECTED, "the model's tensors need more than 256 MiB on the DSP"
        )
    return RpcError(ErrorCode.INVOKE_FAILED, code=rc)
