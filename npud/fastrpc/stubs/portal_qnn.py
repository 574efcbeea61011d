"""portal_qnn, typed: load a model from a client's fd, run it on DMA-BUF slices, unload it.

The synchronous API the daemon calls for models (no trio here), built on the
stubs that :mod:`npud.idl` derives from ``idl/portal_qnn.idl``::

    with PortalQnn.open(session, backend="emulator") as portal:
        model = portal.load(fd, shapes={"input": (1, 576)})   # the caller keeps fd
        spec = model.graphs[0].inputs[0]                      # name, dtype, shape, nbytes
        portal.set_input(model.slot, "input", Slice(buf, 0, spec.nbytes))
        portal.execute(model.slot)
        produced = portal.get_output(model.slot, 0, Slice(buf, 4096, 4))
        portal.unload(model.slot)

or a whole run in one invoke, on tensor arenas (every input packed in one
slice, every output in another, at the offsets :func:`arena_layout` gives)::

        portal.run_arena(model.slot, Slice(buf, 0, graph.input_arena), Slice(buf, 8192, n))

One :class:`PortalQnn` is one open handle of the skel: a table of
:data:`MAX_MODELS` model slots. Loading checks the file's format for the
backend first (:mod:`npud.fastrpc.stubs.model_format`), then lends the fd to the
DSP for the time of ``model_load`` (:meth:`FastRpcSession.expose_file`): the
DSP's loader reads it through the reverse-RPC listener; no path is opened.
Tensor data travels only as slices of session DMA-BUFs.

Errors: :class:`ModelError` (a RpcError) with a :class:`ModelFailure`
saying what went wrong; transport failures stay RpcErrors. A graph that
fails on the DSP is ``ModelFailure.QNN`` with its QNN error number and the
runtime's reason, which the skel keeps for the model and ``last_error``
fetches under the model's lock (so it is that call's, bounded by the skel). Thread-safe:
calls that name one model run one at a time (a per-model lock; :meth:`run`
holds it for its whole sequence); calls on different models do not wait for
each other on the host.
"""

from __future__ import annotations

import dataclasses
import functools
import threading
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Final, Literal

from npu_protocol import AEE, ErrorCode
from npud import idl
from npud.fastrpc.kernel.errors import RpcError
from npud.fastrpc.kernel.invoke_args import InArg, OutArg, Slice
from npud.fastrpc.session import FastRpcSession
from npud.fastrpc.stubs.model_errors import FILE_FAILURES, ModelError, ModelFailure, load_error
from npud.fastrpc.stubs.model_format import ModelFileError, ModelFormat
from npud.fastrpc.stubs.model_invokes import (
    Marshalled,
    check_slice,
    in_arg,
    out_arg,
    produced_shapes,
)
from npud.fastrpc.stubs.model_query import check_sizes, check_uri_length, model_uri_query
from npud.fastrpc.stubs.model_shapes import ShapeError
from npud.fastrpc.stubs.model_specs import (
    DataType,
    GraphSpec,
    LoadedModel,
    TensorKey,
    TensorSpec,
    arena_layout,
    spec_from_record,
)
from npud.fastrpc.stubs.model_walks import CheckedFile, Walks, walk_model_file
from npud.fastrpc.stubs.portal_limits import (
    MAX_ERROR_BYTES,
    MAX_GRAPH_NAME_BYTES,
    MAX_GRAPHS,
    MAX_MODELS,
    MAX_RANK,
    MAX_TENSORS,
    MAX_URI_BYTES,
    NO_MODEL,
    OUTPUT_DIMS_STRIDE,
)
from npud.formats import onnx_proto
from npud.formats.onnx_values import Constant

# The stub's parts live in their own modules; this one keeps every name it had.
__all__ = [
    "MAX_ERROR_BYTES",
    "MAX_GRAPHS",
    "MAX_GRAPH_NAME_BYTES",
    "MAX_MODELS",
    "MAX_RANK",
    "MAX_TENSORS",
    "MAX_URI_BYTES",
    "NO_MODEL",
    "OUTPUT_DIMS_STRIDE",
    "PORTAL_QNN_URI",
    "QNN_SUFFIX",
    "Backend",
    "DataType",
    "GraphSpec",
    "LoadedModel",
    "ModelError",
    "ModelFailure",
    "PortalQnn",
    "TensorKey",
    "TensorSlices",
    "TensorSpec",
    "Walks",
    "arena_layout",
    "model_uri_query",
]

PORTAL_QNN_URI: Final = (
    "file:///libportal_qnn_skel.so?portal_qnn_skel_handle_invoke&_modver=1.0&_dom=cdsp"
)
QNN_SUFFIX: Final = {"kernel": ".so", "emulator": ".onnx"}


Backend = Literal["kernel", "emulator"]
TensorSlices = Mapping[str, Slice] | Mapping[int, Slice] | Mapping[TensorKey, Slice]
"""Slices by tensor name or index (Mapping is invariant in its key type)."""

# The IDL's methods, by name: idl/portal_qnn.idl is parsed at the first call (_portal_idl).
_LOAD: Final = "model_load"
_SET_INPUT: Final = "set_input"
_EXECUTE: Final = "execute"
_GET_OUTPUT: Final = "get_output"
_UNLOAD: Final = "model_unload"
_GRAPH_INFO: Final = "graph_info"
_RUN: Final = "run"
_LAST_ERROR: Final = "last_error"
_GRAPH_NAME: Final = "graph_name"
_OUTPUT_DIMS: Final = "output_dims"
_MODEL_REF: Final = "model_ref"
_RUN_DIMS: Final = "run_dims"


@functools.cache
def _portal_idl() -> idl.Interface:
    """``idl/portal_qnn.idl``, parsed at the first model call (then cached)."""
    return idl.load("portal_qnn")


@dataclasses.dataclass
class _Model:
    loaded: LoadedModel
    marshalled: dict[tuple[int, str], Marshalled] = dataclasses.field(default_factory=dict)
    """The run invokes marshalled so far, by (graph, method)."""
    lock: threading.Lock = dataclasses.field(default_factory=threading.Lock)
    inputs_set: dict[int, set[int]] = dataclasses.field(default_factory=dict)
    executed: set[int] = dataclasses.field(default_factory=set)
    unloaded: bool = False
    ref: int | None = None
    """The model's number in its DSP process (model_ref), once asked; 0: the skel has
    no chains."""


class PortalQnn:
    """One open portal_qnn handle and the models in its slots (see the module docstring)."""

    def __init__(self, session: FastRpcSession, handle: int, backend: Backend) -> None:
        self._session = session
        self.handle = handle
        self.backend: Backend = backend
        self._lock = threading.Lock()
        self._load_lock = threading.Lock()  # a load and the reason it failed, together
        self._models: dict[int, _Model] = {}
        self._closed = False
        self._run_dims = True
        """Whether the skel has run_dims (method 14); False once it answered
        AEE_EUNSUPPORTED (runs then take run and output_dims: two invokes)."""

    @classmethod
    def open(cls, session: FastRpcSession, *, backend: Backend) -> PortalQnn:
        """Open the skel (remotectl); ``backend`` says which model format the DSP loads."""
        if backend not in QNN_SUFFIX:
            raise ValueError(f"backend must be 'kernel' or 'emulator', not {backend!r}")
        return cls(session, session.remote_open(PORTAL_QNN_URI), backend)

    @property
    def model_format(self) -> ModelFormat:
        return ModelFormat.ONNX if self.backend == "emulator" else ModelFormat.QNN_LIBRARY

    def models(self) -> dict[int, LoadedModel]:
        """The loaded models by slot (a snapshot)."""
        with self._lock:
            return {slot: model.loaded for slot, model in self._models.items()}

    # ----------------------------------------------------------------- load
    @classmethod
    def check(
        cls,
        fd: int,
        backend: Backend,
        shapes: Mapping[str, Sequence[int]] | None = None,
        budget: onnx_proto.Budget | None = None,
        walks: Walks = walk_model_file,
        *,
        constants: Mapping[str, Constant] | None = None,
        sizes: Mapping[str, Sequence[Sequence[int]]] | None = None,
    ) -> CheckedFile:
        """Every check :meth:`load` makes on the file before it reaches the DSP (the
        file's kind, contents and shapes: those of each graph ``sizes`` makes, with the
        inputs ``constants`` fixes, and which outputs have rooms), within ``budget``;
        ModelError when one fails. ``walks`` walks the file (npud.requests.model_check gives one
        that runs in a child process); a caller may check on a thread of its choice and
        give :meth:`load` the result."""
        checked_sizes = check_sizes(sizes or {}, shapes or {})
        if (shapes or constants or checked_sizes) and backend == "kernel":
            what = "shapes apply" if shapes or checked_sizes else "input values (constants) apply"
            raise ModelError(
                ModelFailure.TENSOR_MISMATCH,
                f"a QNN model library has fixed shapes and inputs: {what} to ONNX models only",
            )
        # Refuses bad names, dimensions and values; the query alone (load checks the
        # length again with the file's name).
        check_uri_length(model_uri_query(shapes or {}, constants or {}, checked_sizes))
        fixed = {name: tuple(c.shape) for name, c in (constants or {}).items()}
        try:
            return walks(fd, backend, shapes or {}, budget, fixed, checked_sizes)
        except ModelFileError as exc:
            raise ModelError(FILE_FAILURES[exc.kind], str(exc)) from None
        except ShapeError as exc:
            failure = (
                ModelFailure.MODEL_REJECTED if exc.kind == "free" else ModelFailure.TENSOR_MISMATCH
            )
            raise ModelError(failure, str(exc)) from None
        except onnx_proto.DamagedError as exc:
            raise ModelError(
                ModelFailure.FILE_MALFORMED, f"the model file is a damaged ONNX model: {exc}"
            ) from None
        except onnx_proto.CheckTimeoutError as exc:
            raise ModelError(
                ModelFailure.MODEL_REJECTED,
                f"the model file was not checked in time: {exc} ([daemon] model_check_s); a"
                " model of this many protobuf fields is not loaded",
            ) from None
        except onnx_proto.LimitError as exc:
            raise ModelError(
                ModelFailure.MODEL_REJECTED, f"the model is outside npud's limits: {exc}"
            ) from None
        except OSError as exc:
            raise ModelError(
                ModelFailure.FILE_UNREADABLE, f"cannot read the model file: {exc}"
            ) from None

    def load(
        self,
        fd: int,
        *,
        shapes: Mapping[str, Sequence[int]] | None = None,
        constants: Mapping[str, Constant] | None = None,
        sizes: Mapping[str, Sequence[Sequence[int]]] | None = None,
        checked: CheckedFile | None = None,
    ) -> LoadedModel:
        """Load the model file open on ``fd`` (the caller keeps it) into a free slot.

        ``shapes`` fixes free dimensions of an ONNX model's tensors by name (the
        emulator backend); a QNN model library's shapes are fixed already.
        ``constants`` fixes ONNX model inputs to values, which the DSP folds into the
        model before shape inference (npud.sim.onnx_fold): those inputs are gone.
        ``sizes`` gives inputs several whole shapes: the DSP makes one graph of the
        model per shape (graph i takes the i-th of each), named ``<input>=<d0>x<d1>``.
        ``checked``: what :meth:`check` found for this file with these shapes, values
        and sizes (made now when None).
        """
        if checked is None:
            checked = self.check(fd, self.backend, shapes, constants=constants, sizes=sizes)
        sniffed, unsized, roomy = checked.file, list(checked.unsized), checked.rooms
        # What the check left for the DSP to size may be a room the model bounds itself
        # (npud.sim.onnx_bounds): its runs report their shapes (run_dims) as a room's do.
        left = frozenset(t.name for t in unsized)
        query = model_uri_query(shapes or {}, constants or {}, sizes or {})
        try:
            exposed = self._session.expose_file(fd, suffix=QNN_SUFFIX[self.backend])
        except ValueError as exc:
            reason = f"cannot read the model file: {exc}"
            raise ModelError(ModelFailure.FILE_UNREADABLE, reason) from None
        with exposed:
            uri = exposed.name + query
            check_uri_length(uri)
            with self._load_lock:
                rc, values = self._call(_LOAD, model_uri=uri)
                failed = rc != 0 or values.integer("qnn_status") != 0
                said = self.last_error(NO_MODEL) if failed else ""
        if rc != 0:
            raise load_error(rc, sniffed, unsized, said)
        status = values.integer("qnn_status")
        if status != 0:
            reason = f"composing the model failed with QNN error {status}"
            raise ModelError(ModelFailure.QNN, f"{reason}: {said}" if said else reason)
        slot = values.integer("model_index")
        try:
            graphs = tuple(
                self._describe(slot, g, (roomy[g] if g < len(roomy) else frozenset()) | left)
                for g in range(values.integer("num_graphs"))
            )
        except BaseException:
            self._call(_UNLOAD, model_index=slot)  # best effort: the slot must not leak
            raise
        loaded = LoadedModel(slot, graphs, sniffed)
        with self._lock:
            self._models[slot] = _Model(loaded)
        return loaded

    def _describe(self, slot: int, graph: int, roomy: frozenset[str]) -> GraphSpec:
        capacity = MAX_TENSORS
        rc, values = self._call(
            _GRAPH_INFO, model_index=slot, graph_index=graph, inputs=capacity, outputs=capacity
        )
        if rc != 0:
            raise RpcError(ErrorCode.INVOKE_FAILED, code=rc)
        inputs = values.records("inputs")[: values.integer("num_inputs")]
        outputs = values.records("outputs")[: values.integer("num_outputs")]
        rc, named = self._call(
            _GRAPH_NAME, model_index=slot, graph_index=graph, name=MAX_GRAPH_NAME_BYTES
        )
        if rc not in (0, AEE.EUNSUPPORTED.dsp):  # a skel before graph_name: no names
            raise RpcError(ErrorCode.INVOKE_FAILED, code=rc)
        name = ""
        if rc == 0:
            raw = named.data("name")[: min(named.integer("name_len"), MAX_GRAPH_NAME_BYTES - 1)]
            name = raw.decode("utf-8", errors="replace").split("\0")[0]
        return GraphSpec(
            graph,
            tuple(spec_from_record(i, r) for i, r in enumerate(inputs)),
            tuple(spec_from_record(i, r) for i, r in enumerate(outputs)),
            name,
            roomy,
        )

    # ------------------------------------------------------------------ run
    def set_input(
        self,
        slot: int,
        tensor: TensorKey,
        data: Slice,
        *,
        graph: int = 0,
        dtype: DataType | None = None,
        shape: Sequence[int] | None = None,
    ) -> None:
        """Copy one input from ``data`` (exactly the tensor's size). ``dtype`` and
        ``shape``, when the caller knows them, are checked against the model's."""
        with self._model(slot) as model:
            self._set_input(model, graph, tensor, data, dtype, shape)

    def execute(self, slot: int, *, graph: int = 0) -> None:
        """Run the graph on the inputs set since load."""
        with self._model(slot) as model:
            self._execute(model, graph)

    def get_output(self, slot: int, tensor: TensorKey, data: Slice, *, graph: int = 0) -> int:
        """Copy one output of the last execute into ``data`` (at least the tensor's size;
        the rest is zero-filled); returns the bytes the graph produced."""
        with self._model(slot) as model:
            return self._get_output(model, graph, tensor, data)

    def run(
        self,
        slot: int,
        inputs: TensorSlices,
        outputs: TensorSlices,
        *,
        graph: int = 0,
    ) -> dict[str, int]:
        """set_input for each of ``inputs``, execute, get_output for each of ``outputs``,
        with no other call on this model in between. Returns bytes produced by name."""
        with self._model(slot) as model:
            for key, data in inputs.items():
                self._set_input(model, graph, key, data, None, None)
            self._execute(model, graph)
            spec = self._graph(model, graph)
            return {
                spec.output(key).name: self._get_output(model, graph, key, data)
                for key, data in outputs.items()
            }

    def run_arena(
        self, slot: int, inputs: Slice, outputs: Slice, *, graph: int = 0
    ) -> tuple[tuple[int, ...], ...] | None:
        """One whole run in one invoke: every input from the ``inputs`` arena (exactly
        :attr:`GraphSpec.input_arena` bytes), execute, every output into the ``outputs``
        arena (at least :attr:`GraphSpec.output_arena` bytes; the rest is zero-filled).
        Returns every output's shape as the run produced it when the graph has outputs
        with rooms (:attr:`GraphSpec.rooms`; the same invoke, run_dims, or on a skel
        without it a second one, output_dims), else None: every output has graph_info's
        shape. An output that outgrew its room is ``ModelFailure.OUTPUT_TOO_LARGE``."""
        check_slice(inputs)
        check_slice(outputs)
        with self._model(slot) as model:
            spec = self._graph(model, graph)
            if inputs.length != spec.input_arena:
                raise ModelError(
                    ModelFailure.TENSOR_MISMATCH,
                    f"the inputs arena of graph {graph} is {spec.input_arena} bytes;"
                    f" got {inputs.length}",
                )
            if outputs.length < spec.output_arena:
                raise ModelError(
                    ModelFailure.TENSOR_MISMATCH,
                    f"the outputs arena of graph {graph} is {spec.output_arena} bytes;"
                    f" the slice holds {outputs.length}",
                )
            model.executed.discard(graph)
            shaped = bool(spec.rooms) and self._run_dims
            if shaped:
                rc, values = self._run_call(model, spec, _RUN_DIMS, inputs, outputs)
                if rc == AEE.EUNSUPPORTED.dsp:  # a skel before run_dims: nothing ran
                    self._run_dims = shaped = False
            if not shaped:
                rc, values = self._run_call(model, spec, _RUN, inputs, outputs)
            if rc == AEE.EINVALIDFORMAT.dsp:
                raise self._overgrown(slot, graph)
            self._check(rc, model)
            model.inputs_set[graph] = {s.index for s in spec.inputs}
            status = values.integer("qnn_status")
            if status != 0:
                raise self._graph_failure(slot, graph, status)
            model.executed.add(graph)
            if shaped:
                return produced_shapes(values, spec)
            return self._output_dims(slot, spec) if spec.rooms else None

    def _run_call(
        self,
        model: _Model,
        spec: GraphSpec,
        name: str | idl.Method,
        inputs: Slice,
        outputs: Slice,
    ) -> tuple[int, idl.Values]:
        """run (or run_dims) of graph ``spec`` on the two arena slices, as :meth:`_call`
        makes it, marshalled once per graph and slices (:class:`Marshalled`)."""
        key = (spec.index, name if isinstance(name, str) else name.name)
        done = model.marshalled.get(key)
        if done is None or done.inputs != inputs or done.outputs != outputs:
            method = _portal_idl().method(name) if isinstance(name, str) else name
            arguments: dict[str, object] = {
                "model_index": model.loaded.slot,
                "graph_index": spec.index,
                "inputs": inputs if inputs.length else b"",
                "outputs": outputs,
            }
            if key[1] == "run_dims":
                arguments["dims"] = OUTPUT_DIMS_STRIDE * len(spec.outputs)
            call = method.encode(**arguments)
            done = Marshalled(
                inputs,
                outputs,
                method,
                call.sc,
                tuple(in_arg(item) for item in call.inputs),
                tuple(out_arg(item) for item in call.outputs),
            )
            model.marshalled[key] = done
        result = self._session.invoke(self.handle, done.sc, list(done.in_args), list(done.out_args))
        if result.rc != 0:
            return result.rc, idl.Values({})
        return 0, done.method.decode(result.outputs)

    def _output_dims(self, slot: int, spec: GraphSpec) -> tuple[tuple[int, ...], ...] | None:
        """Every output's shape as the graph's last run produced it; None from a skel
        without output_dims (its outputs have graph_info's shapes)."""
        capacity = OUTPUT_DIMS_STRIDE * len(spec.outputs)
        rc, values = self._call(
            _OUTPUT_DIMS, model_index=slot, graph_index=spec.index, dims=capacity
        )
        if rc == AEE.EUNSUPPORTED.dsp:
            return None
        if rc != 0:
            raise RpcError(ErrorCode.INVOKE_FAILED, code=rc)
        return produced_shapes(values, spec)

    def _overgrown(self, slot: int, graph: int) -> ModelError:
        """An output did not fit the place graph_info gave it: the DSP's words name the
        tensor, its room and what the run needed (last_error)."""
        said = self.last_error(slot)
        detail = (
            f"graph {graph}: {said}"
            if said
            else (f"graph {graph} produced an output larger than graph_info described")
        )
        return ModelError(
            ModelFailure.OUTPUT_TOO_LARGE,
            f"{detail} (give it a larger room at load: its whole shape in shapes=, or"
            " npuctl run --shape)",
        )

    def model_ref(self, slot: int) -> int | None:
        """The model's number in its DSP process, for a chain's plan (asked once, then
        kept); None when the skel has no chains (AEE_EUNSUPPORTED: the C skel today)."""
        with self._model(slot) as model:
            if model.ref is None:
                rc, values = self._call(_MODEL_REF, model_index=slot)
                if rc == AEE.EUNSUPPORTED.dsp:
                    model.ref = 0
                else:
                    self._check(rc, model)
                    model.ref = values.integer("ref")
            return model.ref or None

    @contextmanager
    def hold(self, slot: int) -> Iterator[None]:
        """No other call on the model while the block runs (a chain holds every model it
        runs: npud.fastrpc.stubs.portal_chain)."""
        with self._model(slot):
            yield

    def call(self, method: str, /, **arguments: object) -> tuple[int, idl.Values]:
        """Invoke one of the IDL's methods on this handle: (AEE result, rout values)."""
        return self._call(method, **arguments)

    def unload(self, slot: int) -> None:
        """Free the slot (the DSP releases the model). Unloading twice is NOT_LOADED."""
        with self._model(slot) as model:
            rc, _ = self._call(_UNLOAD, model_index=slot)
            model.unloaded = True
            with self._lock:
                self._models.pop(slot, None)
        if rc == AEE.EBADSTATE.dsp:
            raise ModelError(ModelFailure.NOT_LOADED, f"slot {slot}")
        if rc != 0:
            raise RpcError(ErrorCode.INVOKE_FAILED, code=rc)

    def close(self) -> None:
        """Close the handle: the DSP unloads whatever is still loaded. Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            models, self._models = list(self._models.values()), {}
        for model in models:
            with model.lock:
                model.unloaded = True
        self._session.remote_close(self.handle)

    def __enter__(self) -> PortalQnn:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # -------------------------------------------------------------- helpers
    @contextmanager
    def _model(self, slot: int) -> Iterator[_Model]:
        with self._lock:
            model = self._models.get(slot)
        if model is None:
            raise ModelError(ModelFailure.NOT_LOADED, f"slot {slot}")
        with model.lock:
            if model.unloaded:
                raise ModelError(ModelFailure.NOT_LOADED, f"slot {slot}")
            yield model

    @staticmethod
    def _graph(model: _Model, graph: int) -> GraphSpec:
        graphs = model.loaded.graphs
        if not 0 <= graph < len(graphs):
            raise ModelError(
                ModelFailure.BAD_TENSOR, f"graph {graph} (the model has {len(graphs)})"
            )
        return graphs[graph]

    def _set_input(
        self,
        model: _Model,
        graph: int,
        key: TensorKey,
        data: Slice,
        dtype: DataType | None,
        shape: Sequence[int] | None,
    ) -> None:
        spec = self._graph(model, graph).input(key)
        check_slice(data)
        wrong = []
        if dtype is not None and dtype != spec.dtype:
            wrong.append(f"data type {DataType(dtype).numpy}")
        if shape is not None and tuple(shape) != spec.shape:
            wrong.append(f"shape {list(shape)}")
        if data.length != spec.nbytes:
            wrong.append(f"{data.length} bytes")
        if wrong:
            raise ModelError(
                ModelFailure.TENSOR_MISMATCH,
                f"input {spec.name!r} takes {spec.describe()} ({spec.nbytes} bytes);"
                f" got {', '.join(wrong)}",
            )
        rc, _ = self._call(
            _SET_INPUT,
            model_index=model.loaded.slot,
            graph_index=graph,
            tensor_index=spec.index,
            data=data,
        )
        self._check(rc, model)
        model.inputs_set.setdefault(graph, set()).add(spec.index)

    def _execute(self, model: _Model, graph: int) -> None:
        spec = self._graph(model, graph)
        model.executed.discard(graph)
        rc, values = self._call(_EXECUTE, model_index=model.loaded.slot, graph_index=graph)
        if rc == AEE.EINVALIDFORMAT.dsp:
            raise self._overgrown(model.loaded.slot, graph)
        if rc == AEE.ENOTINITIALIZED.dsp:
            done = model.inputs_set.get(graph, set())
            missing = [repr(s.name or s.index) for s in spec.inputs if s.index not in done]
            raise ModelError(
                ModelFailure.INPUT_NOT_SET,
                f"input {', '.join(missing) or '?'} of graph {graph} was never set",
            )
        self._check(rc, model)
        status = values.integer("qnn_status")
        if status != 0:
            raise self._graph_failure(model.loaded.slot, graph, status)
        model.executed.add(graph)

    def _graph_failure(self, slot: int, graph: int, status: int) -> ModelError:
        """The QNN failure of a run or execute, with the runtime's reason when the skel
        kept one (last_error; the model's lock is held, so it is this call's)."""
        message = f"graph {graph} failed with QNN error {status}"
        reason = self.last_error(slot)
        return ModelError(ModelFailure.QNN, f"{message}: {reason}" if reason else message)

    def last_error(self, slot: int) -> str:
        """Why the model's last execute or run failed, in the runtime's words (at most
        MAX_ERROR_BYTES - 1 bytes, printable); with :data:`NO_MODEL`, why the handle's
        last load failed. "" when it succeeded, or when the skel does not keep reasons
        (a skel older than last_error answers AEE_EUNSUPPORTED)."""
        rc, values = self._call(_LAST_ERROR, model_index=slot, text=MAX_ERROR_BYTES)
        if rc != 0:
            return ""
        data = values.data("text")[: min(values.integer("text_len"), MAX_ERROR_BYTES - 1)]
        text = data.decode("utf-8", errors="replace")
        return "".join(c if c.isprintable() else " " for c in text).strip()

    def _get_output(self, model: _Model, graph: int, key: TensorKey, data: Slice) -> int:
        spec = self._graph(model, graph).output(key)
        check_slice(data)
        if data.length < spec.nbytes:
            raise ModelError(
                ModelFailure.TENSOR_MISMATCH,
                f"output {spec.name!r} is {spec.describe()} ({spec.nbytes} bytes);"
                f" the buffer holds {data.length}",
            )
        rc, values = self._call(
            _GET_OUTPUT,
            model_index=model.loaded.slot,
            graph_index=graph,
            tensor_index=spec.index,
            data=data,
        )
        if rc == AEE.ENOTINITIALIZED.dsp:
            raise ModelError(
                ModelFailure.NOT_EXECUTED,
                f"graph {graph} has no outputs: it has not run successfully since it was loaded"
                " or since its last failure",
            )
        self._check(rc, model)
        return values.integer("data_len")

    def _check(self, rc: int, model: _Model) -> None:
        if rc == AEE.EBADSTATE.dsp:
            raise ModelError(ModelFailure.NOT_LOADED, f"slot {model.loaded.slot}")
        if rc != 0:
            raise RpcError(ErrorCode.INVOKE_FAILED, code=rc)

    def _call(self, method: str | idl.Method, /, **arguments: object) -> tuple[int, idl.Values]:
        """Invoke the IDL's method (by name, or a Method as tests build one an older
        skel lacks); (AEE result, rout values, which are empty unless it is 0)."""
        if isinstance(method, str):
            method = _portal_idl().method(method)
        call = method.encode(**arguments)
        inputs: list[InArg] = [in_arg(item) for item in call.inputs]
        outputs: list[OutArg] = [out_arg(item) for item in call.outputs]
        result = self._session.invoke(self.handle, call.sc, inputs, outputs)
        if result.rc != 0:
            return result.rc, idl.Values({})
        return 0, method.decode(result.outputs)
