"""The emulated portal_qnn skel's limits, as skel/portal_qnn_imp.c has them, and the
QNN numbers it reports: what the skel's parts (npud.sim.portal_qnn) check against."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

from npud.formats import graph_pack, onnx_values

MAX_MODELS: Final = 4
MAX_TENSORS: Final = 32
MAX_RANK: Final = 8
MAX_NAME_BYTES: Final = 128  # with the NUL
MAX_URI_BYTES: Final = 512  # with the NUL
MAX_TENSOR_BYTES: Final = 64 * 1024 * 1024
MAX_MODEL_BYTES: Final = 256 * 1024 * 1024  # all staging buffers of one model
MAX_MODEL_FILE_BYTES: Final = 512 * 1024 * 1024
NO_MODEL: Final = 0xFFFFFFFF
MAX_ERROR_BYTES: Final = 256  # last_error's text with room for a NUL (the C skel's buffer)
BUILTIN_PREFIX: Final = "builtin:"
SHAPE_PREFIX: Final = "shape."
VALUE_PREFIX: Final = "value."
SIZES_PREFIX: Final = "sizes."
VALUE_DTYPES: Final = onnx_values.DTYPES
DEFAULT_INTRA_OP_THREADS: Final = 1
ORT_QUIET: Final = 4  # onnxruntime's FATAL: the skel logs failures itself
ORT_MODEL_FORMAT: Final = "session.load_model_format"  # "ONNX": no ORT-format sniffing
SHARED_SESSION: Final = "model"  # OnnxModel's shared: the session of the model as it is

# QNN error numbers (skel/include/qnn_min.h) for what onnxruntime refuses.
QNN_COMMON_ERROR_NOT_SUPPORTED: Final = 1000
QNN_COMMON_ERROR_GENERAL: Final = 1100
QNN_GRAPH_ERROR_INVALID_ARGUMENT: Final = 6000

# ONNX element type (as onnxruntime names it) -> QNN data type code, numpy dtype.
ONNX_TYPES: Final[Mapping[str, tuple[int, str]]] = {
    "tensor(int8)": (0x0008, "int8"),
    "tensor(int16)": (0x0016, "int16"),
    "tensor(int32)": (0x0032, "int32"),
    "tensor(int64)": (0x0064, "int64"),
    "tensor(uint8)": (0x0108, "uint8"),
    "tensor(uint16)": (0x0116, "uint16"),
    "tensor(uint32)": (0x0132, "uint32"),
    "tensor(uint64)": (0x0164, "uint64"),
    "tensor(float16)": (0x0216, "float16"),
    "tensor(float)": (0x0232, "float32"),
    "tensor(bool)": (0x0508, "bool"),
}
MAX_GRAPHS: Final = graph_pack.MAX_GRAPHS
