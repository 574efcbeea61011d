"""The emulator's portal_qnn skel: ONNX models on onnxruntime, as skel/portal_qnn_imp.c behaves.

Same interface as the C skel (idl/portal_qnn.idl, layouts from the IDL): a
table of 4 model slots per handle, ``model_load`` / ``set_input`` /
``execute`` / ``get_output`` / ``model_unload`` / ``graph_info``, the same AEE
codes for the same mistakes, and QNN error numbers in ``qnn_status`` for what
the model runtime itself refuses. What differs is the model:

* ``model_uri`` names a file that the DSP reads from the host through the
  reverse-RPC listener (apps_std, like a skel library: the daemon lends the
  client's fd under a generated name); the bytes must be an ONNX model. A
  ``builtin:`` name finds nothing (AEE_ERESOURCENOTFOUND): no builtin is
  registered in the emulated process.
* An ONNX model is one graph (graph_index 0), named by its GraphProto's name
  (empty when it has none or a name of 128 bytes or more). A graph pack
  (npud.formats.graph_pack) is 1..8 graphs in that order, each named by the
  pack; each graph is its ONNX model with the pack's shared weights merged
  in (one onnxruntime session per graph, each with its own copy of them). A
  pack of more graphs, or a damaged one, is AEE_EINVALIDFORMAT. The shapes
  of the query below apply to every graph that has a tensor of that name; a
  name no graph has is AEE_EBADPARM. Each graph's tensors must be sized at
  load, as QNN's are: every dimension must be fixed. Free dimensions are
  fixed by the URI's query, ``?shape.<name>=<d0>,<d1>,...`` joined by ``&``
  (names percent-encoded), for inputs and outputs alike; a dimension named
  in the model (``dim_param``) that one given shape fixes is fixed everywhere
  it appears. An output whose shape that leaves free is inferred from the
  inputs' shapes: the model is given to onnxruntime with every input declared
  with its fixed shape (:func:`npud.formats.onnx_proto.with_input_shapes`),
  and onnxruntime's shape inference sizes the outputs; the session runs that
  model. Where onnxruntime cannot load the model so (shape inference fails in
  a branch of an ``If`` that these shapes cannot take, as Silero VAD's 8 kHz
  branch with 16 kHz chunks), the model loads as it is and its outputs need
  their shapes given. An output dimension still free takes the model's own
  bound where the graph shows one (:mod:`npud.sim.onnx_bounds`: durations it
  clips, a ``NonZero``...): the output's room, as a given shape would be.
  An unknown name, a rank or a fixed dimension that disagrees with the model
  is AEE_EBADPARM (a bad model_uri); a dimension left free is
  AEE_EINVALIDFORMAT ("a tensor that cannot be sized").
* ``run`` takes the inputs and gives the outputs as tensor arenas (the
  IDL's layout: tensor i at the sum of the previous sizes, each rounded up
  to 64 bytes): the inputs are fed to onnxruntime as numpy views of the
  caller's buffer, without a copy.
* onnxruntime runs on the CPU with one intra-op thread by default.
* A model that refers to external data files is refused
  (AEE_EINVALIDFORMAT) before onnxruntime sees it: onnxruntime would open the
  path it names, relative to this process's working directory. The check
  runs on the very bytes handed to onnxruntime (the daemon checked the
  client's file before, but the client may rewrite it since), and
  onnxruntime is told the bytes are ONNX, never its own ORT format.

Every refusal is logged (the DSP's FARF) with the reason; the caller sees the
AEE code. A failed execute or run also keeps onnxruntime's reason with the
model, for ``last_error``: the innermost message of its chain ("LSTM node
'...': Input X must have 3 dimensions only ..."), without onnxruntime's
prefix or the source line and C++ signature of a failed check, cut to
:data:`MAX_ERROR_BYTES` - 1 bytes at a character boundary. Calls on one handle
run one at a time, as on the C skel.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import math
import os
import re
import threading
import urllib.parse
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final

# onnxruntime's Linux wheels (1.32) carry a telemetry client that, at import,
# opens an event store under ~/.cache/Microsoft/DeveloperTools and would send it
# to a Microsoft collector. A daemon on a voice pipeline sends nothing anywhere:
# opt out before the import (an operator who sets the variable keeps their value).
os.environ.setdefault("ORT_DISABLE_TELEMETRY", "1")

import numpy as np
import numpy.typing as npt
import onnxruntime as ort
from onnxruntime.capi import onnxruntime_pybind11_state as ort_errors

from npu_protocol.aee import AEE
from npud import idl
from npud.formats import graph_pack, onnx_proto, onnx_values
from npud.formats.onnx_values import Constant
from npud.idl import arena
from npud.sim import onnx_bounds, onnx_fold, portal_chain
from npud.sim.skels import HostFileError, Skel, SkelCall, SkelMethod, idl_methods

log = logging.getLogger(__name__)

PORTAL_IDL: Final = idl.load("portal_qnn")
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

_LOAD: Final = PORTAL_IDL.method("model_load")
_SET_INPUT: Final = PORTAL_IDL.method("set_input")
_EXECUTE: Final = PORTAL_IDL.method("execute")
_GET_OUTPUT: Final = PORTAL_IDL.method("get_output")
_UNLOAD: Final = PORTAL_IDL.method("model_unload")
_GRAPH_INFO: Final = PORTAL_IDL.method("graph_info")
_RUN: Final = PORTAL_IDL.method("run")
_LAST_ERROR: Final = PORTAL_IDL.method("last_error")
_GRAPH_NAME: Final = PORTAL_IDL.method("graph_name")
_OUTPUT_DIMS: Final = PORTAL_IDL.method("output_dims")
_MODEL_REF: Final = PORTAL_IDL.method("model_ref")
_CHAIN: Final = PORTAL_IDL.method("chain")
_RUN_DIMS: Final = PORTAL_IDL.method("run_dims")
OUTPUT_DIMS_STRIDE: Final = 1 + MAX_RANK  # output_dims: rank, then 8 dimensions
MAX_GRAPHS: Final = graph_pack.MAX_GRAPHS
_SPEC_SIZE: Final = _GRAPH_INFO.param("inputs").element_size  # sizeof(portal_qnn_tensor_spec)


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


@dataclasses.dataclass(frozen=True)
class ModelQuery:
    """What a model URI's query asks of the load."""

    shapes: dict[str, tuple[int, ...]] = dataclasses.field(default_factory=dict)
    constants: dict[str, Constant] = dataclasses.field(default_factory=dict)
    sizes: dict[str, tuple[tuple[int, ...], ...]] = dataclasses.field(default_factory=dict)
    """Inputs' several whole shapes: graph i of the model takes the i-th of each."""


def parse_model_uri(uri: str) -> tuple[str, ModelQuery]:
    """The file name and what the query asks; ValueError when malformed."""
    name, _, query = uri.partition("?")
    if not name:
        raise ValueError("no file name")
    asked = ModelQuery()
    if query:
        for item in query.split("&"):
            key, equals, value = item.partition("=")
            prefixes = (SHAPE_PREFIX, VALUE_PREFIX, SIZES_PREFIX)
            prefix = next((p for p in prefixes if key.startswith(p)), None)
            if not equals or prefix is None:
                raise ValueError(
                    f"query item {item!r} is not shape.<name>=<dims>,"
                    " value.<name>=<dtype>:<dims>:<values> or sizes.<name>=<dims>;<dims>..."
                )
            tensor = urllib.parse.unquote(key[len(prefix) :], errors="strict")
            tables: dict[str, Mapping[str, object]] = {
                SHAPE_PREFIX: asked.shapes,
                VALUE_PREFIX: asked.constants,
                SIZES_PREFIX: asked.sizes,
            }
            taken = tables[prefix]
            if not tensor or tensor in taken:
                raise ValueError(f"{prefix[:-1]} for {tensor!r} is empty or given twice")
            if prefix == VALUE_PREFIX:
                asked.constants[tensor] = _parse_value(tensor, value)
            elif prefix == SIZES_PREFIX:
                asked.sizes[tensor] = tuple(_parse_dims(tensor, part) for part in value.split(";"))
            else:
                asked.shapes[tensor] = _parse_dims(tensor, value)
    counts = {len(shapes) for shapes in asked.sizes.values()}
    if len(counts) > 1 or any(not 1 <= n <= MAX_GRAPHS for n in counts):
        raise ValueError(f"sizes give 1..{MAX_GRAPHS} shapes, as many for every tensor")
    if set(asked.sizes) & set(asked.shapes):
        raise ValueError("a tensor has both a shape and sizes")
    return name, asked


def _parse_dims(tensor: str, text: str) -> tuple[int, ...]:
    dims = tuple(int(d) for d in text.split(",")) if text else ()
    if any(d <= 0 for d in dims):
        raise ValueError(f"shape of {tensor!r} has a dimension below 1")
    return dims


def _parse_value(tensor: str, text: str) -> Constant:
    """``<dtype>:<d0>,<d1>...:<v0>,<v1>...`` (no dims: a scalar)."""
    parts = text.split(":")
    if len(parts) != 3 or parts[0] not in VALUE_DTYPES or not parts[2]:
        raise ValueError(f"value of {tensor!r} is not <dtype>:<dims>:<values>")
    dtype, dims_text, values_text = parts
    dims = tuple(int(d) for d in dims_text.split(",")) if dims_text else ()
    if any(d <= 0 for d in dims):
        raise ValueError(f"value of {tensor!r} has a dimension below 1")
    parse = float if dtype.startswith("float") else int
    values = tuple(parse(v) for v in values_text.split(","))
    if len(values) != int(np.prod(dims, dtype=np.int64)):
        raise ValueError(f"value of {tensor!r} has {len(values)} values for shape {list(dims)}")
    return Constant(dtype, dims, values)


@dataclasses.dataclass(frozen=True)
class TensorSpec:
    name: str
    data_type: int
    dtype: np.dtype[Any]
    shape: tuple[int, ...]

    @functools.cached_property
    def nbytes(self) -> int:  # cached: a chain's checks ask for it per step and tensor
        return int(np.prod(self.shape, dtype=np.int64)) * self.dtype.itemsize

    def record(self) -> dict[str, object]:
        return {
            "data_type": self.data_type,
            "rank": len(self.shape),
            "dims": list(self.shape),
            "bytes": self.nbytes,
            "name": self.name,
        }


def arena_offsets(specs: Sequence[TensorSpec]) -> tuple[tuple[int, ...], int]:
    """Each tensor's offset in its arena, and the arena's size (npud.idl.arena)."""
    return arena.arena_layout(spec.nbytes for spec in specs)


def _declared(node: Any) -> tuple[str, str, list[int | str | None]]:
    """name, element type and declared dims of an onnxruntime NodeArg."""
    return str(node.name), str(node.type), list(node.shape)


_Axes = list[tuple[object, object]]
"""Each axis of a tensor as the session and as the model declare it."""


Bounds = Callable[[Mapping[str, tuple[int, ...]]], Mapping[str, tuple[int | None, ...]]]
"""The model's own bounds of its tensors' dimensions, from the inputs' shapes
(npud.sim.onnx_bounds.output_bounds)."""


def _resolve_shapes(
    declared: Sequence[tuple[str, str, list[int | str | None]]],
    given: Mapping[str, tuple[int, ...]],
    outputs: frozenset[str] = frozenset(),
    original: Mapping[str, Sequence[onnx_proto.Dim]] | None = None,
    bounds: Bounds | None = None,
) -> dict[str, tuple[int, ...]]:
    """Every tensor's shape with every dimension fixed; RefusedError otherwise.

    ``declared`` is what the session says (after inference, where it ran on the inputs'
    fixed shapes, which no longer name their dimensions); ``original`` the model's own
    declarations, whose named dimensions a given shape binds wherever they appear. An
    empty or ``?`` dim_param names nothing (onnx_proto.dim_name). An output dimension
    these leave free takes the model's own bound where ``bounds`` finds one (asked once,
    with the inputs' shapes): the output's room."""
    models = original or {}
    names = {name for name, _, _ in declared}
    unknown = sorted(set(given) - names)
    if unknown:
        raise RefusedError(AEE.EBADPARM, f"the model has no tensor {unknown[0]!r}")

    def axes(name: str, dims: Sequence[int | str | None]) -> _Axes:
        model = models.get(name)
        if model is None or len(model) != len(dims):
            return [(dim, None) for dim in dims]
        return list(zip(dims, model, strict=True))

    bound: dict[str, int] = {}  # dim_param -> size, from the given shapes
    for name, _, dims in declared:
        if name in given:
            _bind_given(name, axes(name, dims), given[name], bound)
    shapes: dict[str, tuple[int, ...]] = {}
    found: list[Mapping[str, tuple[int | None, ...]]] = []  # the bounds, once asked
    for name, _, dims in declared:
        if name in given:
            shapes[name] = given[name]
            continue
        sizes: list[int | None] = []
        for dim, model in axes(name, dims):
            size = dim if isinstance(dim, int) and dim > 0 else None
            for label in (_dim_name(dim), _dim_name(model)):
                if size is None and label is not None:
                    size = bound.get(label)
            sizes.append(size)
        if None in sizes and name in outputs and bounds is not None:
            if not found:
                found.append(bounds({n: s for n, s in shapes.items() if n not in outputs}))
            sizes = _bounded(sizes, found[0].get(name))
            if None not in sizes:
                log.info(
                    "portal_qnn: an output sized by the model's own bound",
                    extra={"output": name, "room": sizes},
                )
        if None in sizes:
            raise RefusedError(AEE.EINVALIDFORMAT, _unsized(name, axes(name, dims), sizes, outputs))
        shapes[name] = tuple(size for size in sizes if size is not None)
    return shapes


def _bounded(sizes: list[int | None], limits: tuple[int | None, ...] | None) -> list[int | None]:
    """``sizes`` with each free dimension the model's bound of it (at least 1: a room
    holds something), where the bound is known and of the same rank."""
    if limits is None or len(limits) != len(sizes):
        return sizes
    return [
        size if size is not None else (None if limit is None else max(1, limit))
        for size, limit in zip(sizes, limits, strict=True)
    ]


def _bind_given(name: str, axes: _Axes, shape: tuple[int, ...], bound: dict[str, int]) -> None:
    """Check a given shape against the tensor's axes; bind the names it fixes."""
    if len(shape) != len(axes):
        raise RefusedError(
            AEE.EBADPARM, f"{name} has rank {len(axes)}; the shape given has {len(shape)}"
        )
    for axis, ((want, model), have) in enumerate(zip(axes, shape, strict=True)):
        if isinstance(want, int) and want > 0 and want != have:
            raise RefusedError(
                AEE.EBADPARM, f"{name} dimension {axis} is {want}; the shape given says {have}"
            )
        for label in (_dim_name(want), _dim_name(model)):
            if label is not None and bound.setdefault(label, have) != have:
                raise RefusedError(
                    AEE.EBADPARM, f"dimension {label!r} is given as {bound[label]} and {have}"
                )


def _dim_name(dim: object) -> str | None:
    return onnx_proto.dim_name(dim) if isinstance(dim, str) else None


def _unsized(
    name: str,
    dims: _Axes,
    sizes: Sequence[int | None],
    outputs: frozenset[str],
) -> str:
    """Why ``name`` cannot be sized: every free dimension, by its name where it has one,
    and the shape to give with what is fixed kept."""
    free = []
    for axis, ((dim, model), size) in enumerate(zip(dims, sizes, strict=True)):
        if size is None:
            label = _dim_name(model) or _dim_name(dim)
            free.append(f"{axis} ({label!r})" if label else str(axis))
    what = f"dimension {free[0]} is" if len(free) == 1 else f"dimensions {', '.join(free)} are"
    why = " (not from the inputs' shapes)" if name in outputs else ""
    shape = ",".join("N" if size is None else str(size) for size in sizes)
    return f"{name} {what} free{why}: give its shape, {shape}"


def _with_input_shapes(data: bytes, given: Mapping[str, tuple[int, ...]]) -> bytes | None:
    """The model with every input's shape fixed (given, declared, or bound through a named
    dimension), when an output's shape does not follow from the declarations and the
    given shapes alone; None when nothing is left to infer, or an input is itself free
    (refused later, naming it)."""
    try:
        declared = onnx_proto.graph_io(onnx_proto.BytesSource(data))
    except (onnx_proto.DamagedError, onnx_proto.LimitError):
        return None  # onnxruntime says what is wrong with it
    bound: dict[str, int] = {}
    for tensor in declared:
        shape = given.get(tensor.name)
        if shape is not None and tensor.dims is not None and len(shape) == len(tensor.dims):
            for want, have in zip(tensor.dims, shape, strict=True):
                name = onnx_proto.dim_name(want)
                if name is not None:
                    bound.setdefault(name, have)

    def resolved(tensor: onnx_proto.GraphTensor) -> tuple[int, ...] | None:
        if tensor.name in given:
            return given[tensor.name]
        if tensor.dims is None:
            return None
        dims = [
            bound.get(onnx_proto.dim_name(d) or "") if isinstance(d, str) else d
            for d in tensor.dims
        ]
        return None if any(d is None or d <= 0 for d in dims) else tuple(dims)  # type: ignore[arg-type]

    if all(resolved(t) is not None for t in declared if t.kind == "output"):
        return None
    inputs: dict[str, tuple[int, ...]] = {}
    for tensor in declared:
        if tensor.kind == "input":
            shape = resolved(tensor)
            if shape is None:
                return None
            inputs[tensor.name] = shape
    return onnx_proto.with_input_shapes(onnx_proto.BytesSource(data), inputs)


def _model_bounds(
    data: bytes, inputs: Mapping[str, tuple[int, ...]]
) -> dict[str, tuple[int | None, ...]]:
    """The model's own bounds of its tensors' dimensions (npud.sim.onnx_bounds), none
    that would make a tensor larger than a QNN tensor may be (its room must be given)."""
    bounds = onnx_bounds.output_bounds(data, inputs)
    for name, dims in list(bounds.items()):
        if None not in dims and math.prod(d for d in dims if d is not None) > MAX_TENSOR_BYTES:
            del bounds[name]
    return bounds


def _declarations(data: bytes) -> dict[str, tuple[onnx_proto.Dim, ...]]:
    """The model's own declared dimensions by tensor name ({} when it gives none)."""
    try:
        tensors = onnx_proto.graph_io(onnx_proto.BytesSource(data))
    except onnx_proto.DamagedError:
        return {}  # onnxruntime loaded it: what it says stands
    return {t.name: t.dims for t in tensors if t.dims is not None}


def _spec(name: str, onnx_type: str, shape: tuple[int, ...]) -> TensorSpec:
    if onnx_type not in ONNX_TYPES:
        raise RefusedError(AEE.EINVALIDFORMAT, f"{name} is a {onnx_type}, which QNN cannot hold")
    if len(name.encode("utf-8")) >= MAX_NAME_BYTES:
        raise RefusedError(AEE.EINVALIDFORMAT, f"a tensor name is over {MAX_NAME_BYTES - 1} bytes")
    if len(shape) > MAX_RANK:
        raise RefusedError(AEE.EINVALIDFORMAT, f"{name} has rank {len(shape)} (at most 8)")
    code, dtype = ONNX_TYPES[onnx_type]
    spec = TensorSpec(name, code, np.dtype(dtype), shape)
    if spec.nbytes > MAX_TENSOR_BYTES:
        raise RefusedError(AEE.EINVALIDFORMAT, f"{name} is {spec.nbytes} bytes (at most 64 MiB)")
    return spec


def _check_self_contained(data: bytes) -> None:
    """RefusedError for a model that names external data files (never resolved here)."""
    try:
        external = onnx_proto.find_external_data(onnx_proto.BytesSource(data))
    except onnx_proto.DamagedError as exc:
        raise RefusedError(AEE.EUNABLETOLOAD, f"not an ONNX model: {exc}") from None
    if external is not None:
        raise RefusedError(
            AEE.EINVALIDFORMAT, f"external data is not loaded: {external.describe()}"
        )


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


def _qnn_status(exc: Exception) -> int:
    if isinstance(exc, ort_errors.NotImplemented):
        return QNN_COMMON_ERROR_NOT_SUPPORTED
    if isinstance(exc, ort_errors.InvalidArgument | ort_errors.InvalidGraph):
        return QNN_GRAPH_ERROR_INVALID_ARGUMENT
    return QNN_COMMON_ERROR_GENERAL


def _inferred_session(fixed: bytes, options: ort.SessionOptions) -> ort.InferenceSession | None:
    """Some output's shape is left to inference: onnxruntime's, on the model with its
    inputs' shapes fixed (as a QNN graph has them). None when inference fails that way (a
    branch not taken that cannot take these shapes): the model then loads as it is."""
    try:
        return ort.InferenceSession(fixed, sess_options=options, providers=["CPUExecutionProvider"])
    except MemoryError:
        raise  # past the PD's memory limit: the PD ends (npud.sim.pd_child)
    except Exception as exc:
        log.info("portal_qnn: no inference from the input shapes", extra={"why": str(exc)})
        return None


class OnnxModel:
    """One graph of a loaded model: its session, staging buffers and what the last
    execute produced."""

    def __init__(
        self,
        data: bytes,
        shapes: Mapping[str, tuple[int, ...]],
        threads: int,
        name: str = "",
        weights: bytes = b"",
        shared: dict[str, ort.InferenceSession] | None = None,
    ) -> None:
        """``data`` is the ONNX model; ``weights`` what a graph pack appends to it (its
        shared weights as a second graph field, which protobuf merges into the first).
        ``shared``: the session of ``data`` as it is, made by another graph of the same
        model (several sizes), which this graph runs too when it needs no session of its
        own (one whose inputs' shapes are fixed, for inference): the model's weights
        are then held once, as a QNN context's graphs share theirs, and not thrashed
        through the cache a copy per size."""
        _check_self_contained(data + weights)
        options = ort.SessionOptions()
        options.add_session_config_entry(ORT_MODEL_FORMAT, "ONNX")
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        options.log_severity_level = ORT_QUIET
        session = None
        fixed = _with_input_shapes(data, shapes)
        if fixed is not None:
            fixed += weights
        if fixed is not None:
            session = _inferred_session(fixed, options)
        if session is None and shared is not None:
            session = shared.get(SHARED_SESSION)
        try:
            self._session = (
                session
                if session is not None
                else ort.InferenceSession(
                    data + weights, sess_options=options, providers=["CPUExecutionProvider"]
                )
            )
            if shared is not None and fixed is None:
                shared.setdefault(SHARED_SESSION, self._session)
        except ort_errors.InvalidProtobuf as exc:
            raise RefusedError(AEE.EUNABLETOLOAD, f"not an ONNX model: {exc}") from None
        except MemoryError:
            raise  # past the PD's memory limit: the PD ends (npud.sim.pd_child)
        except Exception as exc:  # onnxruntime's own refusal: a QNN failure to compose
            reason = f"onnxruntime refused the model: {exc}"
            raise QnnFailureError(_qnn_status(exc), reason) from None
        self.name = name or _graph_name(self._session)
        inputs = [_declared(node) for node in self._session.get_inputs()]
        outputs = [_declared(node) for node in self._session.get_outputs()]
        if len(inputs) > MAX_TENSORS or not 1 <= len(outputs) <= MAX_TENSORS:
            raise RefusedError(
                AEE.EINVALIDFORMAT,
                f"{len(inputs)} inputs and {len(outputs)} outputs (at most 32, at least 1 output)",
            )
        names = frozenset(name for name, _, _ in outputs)
        resolved = _resolve_shapes(
            [*inputs, *outputs],
            shapes,
            names,
            _declarations(data),
            lambda fixed: _model_bounds(data, fixed),
        )
        self.inputs = [_spec(name, kind, resolved[name]) for name, kind, _ in inputs]
        self.outputs = [_spec(name, kind, resolved[name]) for name, kind, _ in outputs]
        total = sum(spec.nbytes for spec in [*self.inputs, *self.outputs])
        if total > MAX_MODEL_BYTES:
            raise RefusedError(AEE.ENOMEMORY, f"{total} bytes of staging (at most 256 MiB)")
        self._staged = [np.zeros(spec.shape, spec.dtype) for spec in self.inputs]
        self._set = [False] * len(self.inputs)
        self._produced: list[npt.NDArray[Any]] | None = None
        self._run_options = ort.RunOptions()
        self._run_options.log_severity_level = ORT_QUIET
        self.input_offsets, self.input_arena = arena_offsets(self.inputs)
        self.output_offsets, self.output_arena = arena_offsets(self.outputs)
        self._names = [spec.name for spec in self.inputs]
        # What each run reads the inputs arena as, computed once (a run is per chunk).
        self._views = [
            (spec.dtype, int(np.prod(spec.shape, dtype=np.int64)), offset, spec.shape)
            for spec, offset in zip(self.inputs, self.input_offsets, strict=True)
        ]
        self.last_error = b""
        """Why the last execute or run failed (empty: it succeeded), for last_error."""

    def set_input(self, tensor: int, data: memoryview) -> int:
        if tensor >= len(self.inputs):
            return AEE.EBADPARM.dsp
        staged = self._staged[tensor]
        if len(data) != staged.nbytes:
            return AEE.EBADSIZE.dsp
        staged.reshape(-1).view(np.uint8)[:] = np.frombuffer(data, np.uint8)
        self._set[tensor] = True
        return 0

    def execute(self) -> tuple[int, int]:
        """(AEE result, qnn_status)."""
        if not all(self._set):
            return AEE.ENOTINITIALIZED.dsp, 0
        self._produced = None
        self.last_error = b""
        feeds = {spec.name: staged for spec, staged in zip(self.inputs, self._staged, strict=True)}
        try:
            produced = self._session.run(None, feeds, self._run_options)
        except MemoryError:
            raise  # past the PD's memory limit: the PD ends (npud.sim.pd_child)
        except Exception as exc:  # the runtime failed the graph: a QNN error, like graphExecute
            log.warning("portal_qnn execute failed", extra={"error": str(exc)})
            self.last_error = failure_text(exc)
            return 0, _qnn_status(exc)
        arrays = [np.ascontiguousarray(array) for array in produced]
        for spec, array in zip(self.outputs, arrays, strict=True):
            if not _fits(spec, array):
                self.last_error = _overgrown(spec, array)
                return AEE.EINVALIDFORMAT.dsp, 0
        self._produced = arrays
        return 0, 0

    def run(self, inputs: memoryview, outputs: memoryview) -> tuple[int, int]:
        """set_input of every input from the ``inputs`` arena, execute, and every output
        into the ``outputs`` arena: (AEE result, qnn_status)."""
        if len(inputs) != self.input_arena:
            return AEE.EBADSIZE.dsp, 0
        if len(outputs) < self.output_arena:
            return AEE.EBUFFERTOOSMALL.dsp, 0
        # Views of the caller's arena: onnxruntime reads them in place. The staged copies
        # are filled afterwards only so that a later execute sees these inputs too.
        arrays = [
            np.frombuffer(inputs, dtype, count, offset).reshape(shape)
            for dtype, count, offset, shape in self._views
        ]
        self._produced = None
        self.last_error = b""
        try:
            produced = self._session.run(None, dict(zip(self._names, arrays, strict=True)))
        except MemoryError:
            raise  # past the PD's memory limit: the PD ends (npud.sim.pd_child)
        except Exception as exc:  # the runtime failed the graph: a QNN error, like graphExecute
            log.warning("portal_qnn run failed", extra={"error": str(exc)})
            self.last_error = failure_text(exc)
            self._stage(arrays)
            return 0, _qnn_status(exc)
        self._stage(arrays)
        target = np.frombuffer(outputs, np.uint8)
        contiguous = [np.ascontiguousarray(array) for array in produced]
        for spec, array in zip(self.outputs, contiguous, strict=True):
            if not _fits(spec, array):  # before a byte is written: the outputs stay as they were
                self.last_error = _overgrown(spec, array)
                return AEE.EINVALIDFORMAT.dsp, 0
        end = 0
        for offset, data in zip(self.output_offsets, contiguous, strict=True):
            target[end:offset] = 0
            target[offset : offset + data.nbytes] = data.reshape(-1).view(np.uint8)
            end = offset + data.nbytes
        target[end:] = 0
        self._produced = contiguous
        return 0, 0

    def run_arrays(
        self, feeds: Sequence[npt.NDArray[Any]]
    ) -> tuple[int, int, list[npt.NDArray[Any]]]:
        """A chain's step: the graph on ``feeds`` (one array per input, in order), nothing
        staged or kept but last_error: (AEE result, qnn_status, the outputs)."""
        self.last_error = b""
        try:
            produced = self._session.run(
                None, dict(zip(self._names, feeds, strict=True)), self._run_options
            )
        except MemoryError:
            raise  # past the PD's memory limit: the PD ends (npud.sim.pd_child)
        except Exception as exc:  # the runtime failed the graph: a QNN error, like graphExecute
            log.warning("portal_qnn chain step failed", extra={"error": str(exc)})
            self.last_error = failure_text(exc)
            return 0, _qnn_status(exc), []
        arrays = [np.ascontiguousarray(array) for array in produced]
        for spec, array in zip(self.outputs, arrays, strict=True):
            if not _fits(spec, array):
                self.last_error = _overgrown(spec, array)
                return AEE.EINVALIDFORMAT.dsp, 0, []
        return 0, 0, arrays

    def _stage(self, arrays: Sequence[npt.NDArray[Any]]) -> None:
        for staged, array in zip(self._staged, arrays, strict=True):
            staged[...] = array
        self._set = [True] * len(self.inputs)

    def output_dims(self) -> list[tuple[int, ...]] | None:
        """Each output's shape as the last successful execute or run produced it."""
        if self._produced is None:
            return None
        return [tuple(int(d) for d in array.shape) for array in self._produced]

    def get_output(self, tensor: int, target: memoryview) -> tuple[int, int]:
        """(AEE result, data_len)."""
        if tensor >= len(self.outputs):
            return AEE.EBADPARM.dsp, 0
        if self._produced is None:
            return AEE.ENOTINITIALIZED.dsp, 0
        data = self._produced[tensor].reshape(-1).view(np.uint8)
        if len(target) < data.nbytes:
            return AEE.EBUFFERTOOSMALL.dsp, 0
        target[: data.nbytes] = data.data
        target[data.nbytes :] = bytes(len(target) - data.nbytes)
        return 0, data.nbytes


def _fits(spec: TensorSpec, array: npt.NDArray[Any]) -> bool:
    """An output fits its place when it has the type graph_info gave it and at most its
    bytes: an output whose size the data decides fills the start of its room."""
    return array.dtype == spec.dtype and array.nbytes <= spec.nbytes


def _overgrown(spec: TensorSpec, array: npt.NDArray[Any]) -> bytes:
    """last_error for an output that does not fit its place: the tensor, its room, and
    what the run needed."""
    log.warning(
        "portal_qnn output does not fit its room",
        extra={"output": spec.name, "shape": array.shape, "room": spec.shape},
    )
    room = f"{spec.dtype} {list(spec.shape)} ({spec.nbytes} bytes)"
    needed = f"{array.dtype} {list(array.shape)} ({array.nbytes} bytes)"
    text = f"output {spec.name!r} needs {needed}; its room is {room}"
    return text.encode("utf-8")[: MAX_ERROR_BYTES - 1].decode("utf-8", "ignore").encode("utf-8")


def _dims_entries(shapes: Sequence[tuple[int, ...]]) -> list[int]:
    """output_dims' entries: each shape's rank, then its dimensions padded to MAX_RANK."""
    dims: list[int] = []
    for shape in shapes:
        dims += [len(shape), *shape, *[0] * (MAX_RANK - len(shape))]
    return dims


def _graph_name(session: ort.InferenceSession) -> str:
    """The ONNX graph's own name, or "" when it has none the DSP can report."""
    name = str(session.get_modelmeta().graph_name)
    return name if 0 < len(name.encode("utf-8")) < MAX_NAME_BYTES and "\0" not in name else ""


@dataclasses.dataclass
class LoadedSlot:
    """A model in a slot: its graphs, and why its last execute or run failed."""

    graphs: list[OnnxModel]
    last_error: bytes = b""


def compose(
    data: bytes,
    shapes: Mapping[str, tuple[int, ...]],
    threads: int,
    constants: Mapping[str, Constant] | None = None,
) -> LoadedSlot:
    """The graphs of a model file's bytes: an ONNX model (one graph) or a graph pack.
    ``constants`` fix inputs to values, folded into each graph with such an input."""
    constants = constants or {}
    if not graph_pack.is_pack(data):
        return LoadedSlot([OnnxModel(_folded(data, constants), shapes, threads)])
    source = onnx_proto.BytesSource(data)
    try:
        pack = graph_pack.read_pack(source)
    except graph_pack.PackError as exc:
        what = "a graph pack that" if exc.too_many else "a damaged graph pack:"
        raise RefusedError(AEE.EINVALIDFORMAT, f"{what} {exc}") from None
    weights = graph_pack.shared_suffix(source, pack)
    known: set[str] = set()
    members = []
    for graph in pack.graphs:
        member = source.read(graph.offset, graph.length)
        try:
            names = {t.name for t in onnx_proto.graph_io(onnx_proto.BytesSource(member))}
        except onnx_proto.DamagedError as exc:
            raise RefusedError(AEE.EUNABLETOLOAD, f"not an ONNX model: {exc}") from None
        except onnx_proto.LimitError as exc:
            raise RefusedError(AEE.EINVALIDFORMAT, f"outside portal_qnn's limits: {exc}") from None
        known |= names
        fixed = {k: v for k, v in constants.items() if k in names}
        members.append((_folded(member, fixed), {k: v for k, v in shapes.items() if k in names}))
    unknown = sorted((set(shapes) | set(constants)) - known)
    if unknown:
        raise RefusedError(AEE.EBADPARM, f"no graph has a tensor {unknown[0]!r}")
    return LoadedSlot(
        [
            OnnxModel(member, given, threads, graph.name, weights)
            for graph, (member, given) in zip(pack.graphs, members, strict=True)
        ]
    )


def compose_sizes(data: bytes, asked: ModelQuery, threads: int) -> LoadedSlot:
    """One graph per size asked (``asked.sizes``) of a plain ONNX model: graph i is the
    model with every sized input at its i-th shape, named ``<input>=<d0>x<d1>...``."""
    if graph_pack.is_pack(data):
        raise RefusedError(AEE.EBADPARM, "sizes apply to a plain ONNX model, not a graph pack")
    folded = _folded(data, asked.constants)
    count = len(next(iter(asked.sizes.values())))
    graphs = []
    shared: dict[str, ort.InferenceSession] = {}  # one session for the sizes that need none
    for index in range(count):
        chosen = {name: shapes[index] for name, shapes in asked.sizes.items()}
        label = ",".join(f"{n}={'x'.join(str(d) for d in s)}" for n, s in chosen.items())
        if len(label.encode("utf-8")) >= MAX_NAME_BYTES:
            raise RefusedError(AEE.EBADPARM, f"the graph name {label[:40]!r}... is too long")
        graphs.append(OnnxModel(folded, {**asked.shapes, **chosen}, threads, label, shared=shared))
    return LoadedSlot(graphs)


def _folded(data: bytes, constants: Mapping[str, Constant]) -> bytes:
    """The model with its inputs fixed to ``constants`` (onnx_fold); RefusedError when
    one cannot be (AEE_EBADPARM: a bad model_uri, as a shape that does not fit)."""
    if not constants:
        return data
    _check_self_contained(data)  # before onnxruntime computes a condition of it
    try:
        return onnx_fold.fold_constants(data, constants)
    except onnx_fold.FoldError as exc:
        raise RefusedError(AEE.EBADPARM, str(exc)) from None
    except onnx_proto.DamagedError as exc:
        raise RefusedError(AEE.EUNABLETOLOAD, f"not an ONNX model: {exc}") from None
    except Exception as exc:  # onnxruntime could not compute a condition the values decide
        reason = f"onnxruntime refused the model with its inputs fixed: {exc}"
        raise QnnFailureError(_qnn_status(exc), reason) from None


class PortalQnnSkel(Skel):
    """``interface portal_qnn : remote_handle64`` on onnxruntime; one instance per open handle."""

    name = "portal_qnn"

    def __init__(self, intra_op_threads: int = DEFAULT_INTRA_OP_THREADS) -> None:
        self._threads = intra_op_threads
        self._lock = threading.Lock()  # one call at a time per handle, as on the C skel
        self._models: list[LoadedSlot | None] = [None] * MAX_MODELS
        self._load_error = b""  # why the handle's last model_load failed, for last_error
        self._methods = idl_methods(
            PORTAL_IDL,
            {
                "model_load": self._model_load,
                "set_input": self._set_input,
                "execute": self._execute,
                "get_output": self._get_output,
                "model_unload": self._model_unload,
                "graph_info": self._graph_info,
                "run": self._run,
                "last_error": self._last_error,
                "graph_name": self._graph_name,
                "output_dims": self._output_dims,
                "model_ref": self._model_ref,
                "chain": self._chain,
                "run_dims": self._run_dims,
            },
        )
        self._refs: portal_chain.ModelRefs | None = None  # the process's, at the first ref
        self._slot_refs: dict[int, int] = {}

    def methods(self) -> Mapping[int, SkelMethod]:
        return self._methods

    def close(self) -> None:
        with self._lock:
            self._models = [None] * MAX_MODELS
            self._forget_refs(list(self._slot_refs))

    @property
    def lock(self) -> threading.Lock:
        """The handle's lock (a chain holds the locks of every model it runs)."""
        return self._lock

    def loaded_slot(self, index: int) -> LoadedSlot | None:
        """The model in slot ``index`` (the handle lock is held)."""
        return self._models[index] if index < MAX_MODELS else None

    def keep_error(self, index: int, graph: OnnxModel) -> None:
        """A chain's step ran ``graph`` of slot ``index`` (the handle lock is held)."""
        self._keep_error(index, graph)

    def _forget_refs(self, slots: list[int]) -> None:
        for slot in slots:
            ref = self._slot_refs.pop(slot, None)
            if ref is not None and self._refs is not None:
                self._refs.drop(ref)

    @property
    def loaded(self) -> int:
        with self._lock:
            return sum(model is not None for model in self._models)

    # -- the methods ----------------------------------------------------------
    def _model_load(self, call: SkelCall) -> int:
        args = call.unpack(_LOAD)
        uri = args.text("model_uri")
        if not uri or len(uri.encode("utf-8")) + 1 > MAX_URI_BYTES:
            return AEE.EBADPARM.dsp
        with self._lock:
            slot = next((i for i, m in enumerate(self._models) if m is None), None)
            if slot is None:
                return AEE.EOUTOFHANDLES.dsp  # before anything is read: a full table runs nothing
            try:
                model = self._compose(call, uri)
            except RefusedError as exc:
                log.warning("portal_qnn model_load refused", extra={"uri": uri, "reason": str(exc)})
                self._load_error = failure_text(exc)
                return exc.code.dsp
            except QnnFailureError as exc:
                log.warning("portal_qnn model_load failed", extra={"uri": uri, "reason": str(exc)})
                self._load_error = failure_text(exc)
                call.pack_routs(
                    _LOAD, {"model_index": NO_MODEL, "num_graphs": 0, "qnn_status": exc.status}
                )
                return 0
            self._models[slot] = model
            self._load_error = b""
        graphs = len(model.graphs)
        call.pack_routs(_LOAD, {"model_index": slot, "num_graphs": graphs, "qnn_status": 0})
        return 0

    def _compose(self, call: SkelCall, uri: str) -> LoadedSlot:
        try:
            name, asked = parse_model_uri(uri)
        except ValueError as exc:
            raise RefusedError(AEE.EBADPARM, f"bad model URI: {exc}") from None
        if name.startswith(BUILTIN_PREFIX):
            raise RefusedError(AEE.ERESOURCENOTFOUND, "no builtin model in the emulated DSP")
        try:
            data = call.host_files.read_host_file(name, limit=MAX_MODEL_FILE_BYTES)
        except HostFileError as exc:
            raise RefusedError(AEE.EUNABLETOLOAD, str(exc)) from None
        if asked.sizes:
            return compose_sizes(data, asked, self._threads)
        return compose(data, asked.shapes, self._threads, asked.constants)

    def _slot(self, index: int) -> LoadedSlot | int:
        """The loaded model, or the AEE code that says why not (the handle lock is held)."""
        if index >= MAX_MODELS:
            return AEE.EBADPARM.dsp
        slot = self._models[index]
        if slot is None:
            return AEE.EBADSTATE.dsp
        return slot

    def _model(self, index: int, graph: int) -> OnnxModel | int:
        """The graph of a loaded model, or the AEE code that says why not (the handle
        lock is held)."""
        slot = self._slot(index)
        if isinstance(slot, int):
            return slot
        if graph >= len(slot.graphs):
            return AEE.EBADPARM.dsp
        return slot.graphs[graph]

    def _set_input(self, call: SkelCall) -> int:
        args = call.unpack(_SET_INPUT)
        with self._lock:
            model = self._model(args.integer("model_index"), args.integer("graph_index"))
            if isinstance(model, int):
                return model
            return model.set_input(args.integer("tensor_index"), args.view("data"))

    def _execute(self, call: SkelCall) -> int:
        args = call.unpack(_EXECUTE)
        with self._lock:
            model = self._model(args.integer("model_index"), args.integer("graph_index"))
            if isinstance(model, int):
                return model
            with call.computing(matrix=True):
                rc, status = model.execute()
            self._keep_error(args.integer("model_index"), model)
        if rc == 0:
            call.pack_routs(_EXECUTE, {"qnn_status": status})
        return rc

    def _get_output(self, call: SkelCall) -> int:
        args = call.unpack(_GET_OUTPUT)
        with self._lock:
            model = self._model(args.integer("model_index"), args.integer("graph_index"))
            if isinstance(model, int):
                return model
            rc, produced = model.get_output(args.integer("tensor_index"), args.view("data"))
        if rc == 0:
            call.pack_routs(_GET_OUTPUT, {"data_len": produced})
        return rc

    def _model_unload(self, call: SkelCall) -> int:
        args = call.unpack(_UNLOAD)
        index = args.integer("model_index")
        with self._lock:
            slot = self._slot(index)
            if isinstance(slot, int):
                return slot
            self._models[index] = None
            self._forget_refs([index])
        return 0

    def _model_ref(self, call: SkelCall) -> int:
        args = call.unpack(_MODEL_REF)
        index = args.integer("model_index")
        with self._lock:
            slot = self._slot(index)
            if isinstance(slot, int):
                return slot
            if self._refs is None:
                self._refs = (
                    call.pd.resident(portal_chain.ModelRefs)
                    if call.pd is not None
                    else portal_chain.LOCAL_REFS
                )
            ref = self._slot_refs.get(index)
            if ref is None:
                ref = self._slot_refs[index] = self._refs.ref(self, index)
        call.pack_routs(_MODEL_REF, {"ref": ref})
        return 0

    def _chain(self, call: SkelCall) -> int:
        """Several graphs in one call (npud.sim.portal_chain)."""
        args = call.unpack(_CHAIN)
        refs = self._refs or (
            call.pd.resident(portal_chain.ModelRefs)
            if call.pd is not None
            else portal_chain.LOCAL_REFS
        )
        plan_view = args.view("plan")
        try:
            graphs, sources, asked = portal_chain.parse_plan(
                np.frombuffer(plan_view, "<u4").tolist()
            )
            found = {}
            for ref, _ in graphs:
                hit = refs.find(ref)
                if hit is None:
                    raise portal_chain.PlanError(AEE.EBADPARM, f"no model has ref {ref}")
                found[ref] = hit
        except portal_chain.PlanError as exc:
            log.warning("portal_qnn chain refused", extra={"reason": str(exc)})
            return exc.code.dsp
        run = portal_chain.ChainRun(refs)
        with portal_chain.locked([skel for skel, _ in found.values()]):
            try:
                plan = portal_chain.check_plan(graphs, sources, asked, found)
            except portal_chain.PlanError as exc:
                log.warning("portal_qnn chain refused", extra={"reason": str(exc)})
                return exc.code.dsp
            inputs, outputs = args.view("inputs"), args.view("outputs")
            if len(inputs) != plan.given_bytes:
                return AEE.EBADSIZE.dsp
            wanted = portal_chain.DIMS_STRIDE * 4 * len(plan.outputs)  # u32 each
            if len(outputs) < plan.output_bytes or len(args.view("dims")) < wanted:
                return AEE.EBUFFERTOOSMALL.dsp
            try:
                with call.computing(matrix=True):
                    arrays = portal_chain.run_plan(plan, inputs, run)
                dims = portal_chain.write_outputs(plan, arrays, outputs)
            except portal_chain.StepFailedError as exc:
                failed = {"failed_step": exc.step, "step_status": exc.status}
                call.pack_routs(_CHAIN, {**failed, "qnn_status": exc.qnn})
                return 0
            finally:
                run.close()
        done = {"failed_step": portal_chain.NO_STEP, "step_status": 0, "qnn_status": 0}
        call.pack_routs(_CHAIN, {"dims": dims, **done})
        return 0

    def _graph_info(self, call: SkelCall) -> int:
        args = call.unpack(_GRAPH_INFO)
        with self._lock:
            model = self._model(args.integer("model_index"), args.integer("graph_index"))
            if isinstance(model, int):
                return model
            inputs, outputs = list(model.inputs), list(model.outputs)
        in_view, out_view = args.view("inputs"), args.view("outputs")
        if len(in_view) < len(inputs) * _SPEC_SIZE or len(out_view) < len(outputs) * _SPEC_SIZE:
            return AEE.EBUFFERTOOSMALL.dsp
        call.pack_routs(
            _GRAPH_INFO,
            {
                "num_inputs": len(inputs),
                "num_outputs": len(outputs),
                "inputs": [spec.record() for spec in inputs],
                "outputs": [spec.record() for spec in outputs],
            },
        )
        return 0

    def _run(self, call: SkelCall) -> int:
        args = call.unpack(_RUN)
        with self._lock:
            model = self._model(args.integer("model_index"), args.integer("graph_index"))
            if isinstance(model, int):
                return model
            with call.computing(matrix=True):
                rc, status = model.run(args.view("inputs"), args.view("outputs"))
            self._keep_error(args.integer("model_index"), model)
        if rc == 0:
            call.pack_routs(_RUN, {"qnn_status": status})
        return rc

    def _last_error(self, call: SkelCall) -> int:
        args = call.unpack(_LAST_ERROR)
        index = args.integer("model_index")
        with self._lock:
            if index == NO_MODEL:
                text = self._load_error
            else:
                slot = self._slot(index)
                if isinstance(slot, int):
                    return slot
                text = slot.last_error
        view = args.view("text")
        copied = text[: len(view)]
        call.pack_routs(_LAST_ERROR, {"text": list(copied), "text_len": len(copied)})
        return 0

    def _keep_error(self, index: int, graph: OnnxModel) -> None:
        """The model's last_error is its last execute's or run's, whichever graph ran."""
        slot = self._models[index]
        assert slot is not None, "the handle lock is held since the graph was found"
        slot.last_error = graph.last_error

    def _output_dims(self, call: SkelCall) -> int:
        args = call.unpack(_OUTPUT_DIMS)
        with self._lock:
            model = self._model(args.integer("model_index"), args.integer("graph_index"))
            if isinstance(model, int):
                return model
            shapes = model.output_dims()
        if shapes is None:
            return AEE.ENOTINITIALIZED.dsp
        if len(args.view("dims")) < OUTPUT_DIMS_STRIDE * 4 * len(shapes):  # u32 each
            return AEE.EBUFFERTOOSMALL.dsp
        call.pack_routs(_OUTPUT_DIMS, {"dims": _dims_entries(shapes), "num_outputs": len(shapes)})
        return 0

    def _run_dims(self, call: SkelCall) -> int:
        """run, then output_dims' answer in the same call (one round trip per run)."""
        args = call.unpack(_RUN_DIMS)
        with self._lock:
            model = self._model(args.integer("model_index"), args.integer("graph_index"))
            if isinstance(model, int):
                return model
            if len(args.view("dims")) < OUTPUT_DIMS_STRIDE * 4 * len(model.outputs):
                return AEE.EBUFFERTOOSMALL.dsp  # before the graph runs: nothing changed
            with call.computing(matrix=True):
                rc, status = model.run(args.view("inputs"), args.view("outputs"))
            self._keep_error(args.integer("model_index"), model)
            shapes = model.output_dims() if rc == 0 and status == 0 else None
        if rc == 0:
            dims = _dims_entries(shapes or [])
            call.pack_routs(
                _RUN_DIMS,
                {"qnn_status": status, "dims": dims, "num_outputs": len(shapes or [])},
            )
        return rc

    def _graph_name(self, call: SkelCall) -> int:
        args = call.unpack(_GRAPH_NAME)
        with self._lock:
            model = self._model(args.integer("model_index"), args.integer("graph_index"))
            if isinstance(model, int):
                return model
            name = model.name.encode("utf-8")
        view = args.view("name")
        copied = name[: len(view)]
        call.pack_routs(_GRAPH_NAME, {"name": list(copied), "name_len": len(copied)})
        return 0
