"""The emulated portal_qnn skel's models on onnxruntime: one graph's session and
staging buffers (OnnxModel), and a model file's graphs composed into a slot
(an ONNX model, a graph pack, or one graph per size asked)."""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Mapping, Sequence
from typing import Any

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
from npud.formats import graph_pack, onnx_proto
from npud.formats.onnx_values import Constant
from npud.sim import onnx_fold
from npud.sim.model_uri import ModelQuery
from npud.sim.qnn_errors import QnnFailureError, RefusedError, failure_text
from npud.sim.qnn_limits import (
    MAX_ERROR_BYTES,
    MAX_MODEL_BYTES,
    MAX_NAME_BYTES,
    MAX_RANK,
    MAX_TENSORS,
    ORT_MODEL_FORMAT,
    ORT_QUIET,
    QNN_COMMON_ERROR_GENERAL,
    QNN_COMMON_ERROR_NOT_SUPPORTED,
    QNN_GRAPH_ERROR_INVALID_ARGUMENT,
    SHARED_SESSION,
)
from npud.sim.tensor_specs import (
    TensorSpec,
    arena_offsets,
    declared_dims,
    declared_io,
    model_bounds,
    resolve_shapes,
    tensor_spec,
    with_input_shapes,
)

log = logging.getLogger("npud.sim.portal_qnn")  # the skel's logger: its parts log as it


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
        fixed = with_input_shapes(data, shapes)
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
        inputs = [declared_io(node) for node in self._session.get_inputs()]
        outputs = [declared_io(node) for node in self._session.get_outputs()]
        if len(inputs) > MAX_TENSORS or not 1 <= len(outputs) <= MAX_TENSORS:
            raise RefusedError(
                AEE.EINVALIDFORMAT,
                f"{len(inputs)} inputs and {len(outputs)} outputs (at most 32, at least 1 output)",
            )
        names = frozenset(name for name, _, _ in outputs)
        resolved = resolve_shapes(
            [*inputs, *outputs],
            shapes,
            names,
            declared_dims(data),
            lambda fixed: model_bounds(data, fixed),
        )
        self.inputs = [tensor_spec(name, kind, resolved[name]) for name, kind, _ in inputs]
        self.outputs = [tensor_spec(name, kind, resolved[name]) for name, kind, _ in outputs]
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


def dims_entries(shapes: Sequence[tuple[int, ...]]) -> list[int]:
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
