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

import logging
import threading
from collections.abc import Mapping
from typing import Final

import numpy as np

from npu_protocol.aee import AEE
from npud import idl
from npud.sim import portal_chain
from npud.sim.model_uri import ModelQuery, parse_model_uri
from npud.sim.onnx_model import LoadedSlot, OnnxModel, compose, compose_sizes, dims_entries
from npud.sim.qnn_errors import QnnFailureError, RefusedError, failure_text
from npud.sim.qnn_limits import (
    BUILTIN_PREFIX,
    DEFAULT_INTRA_OP_THREADS,
    MAX_ERROR_BYTES,
    MAX_GRAPHS,
    MAX_MODEL_BYTES,
    MAX_MODEL_FILE_BYTES,
    MAX_MODELS,
    MAX_NAME_BYTES,
    MAX_RANK,
    MAX_TENSOR_BYTES,
    MAX_TENSORS,
    MAX_URI_BYTES,
    NO_MODEL,
    ONNX_TYPES,
    ORT_MODEL_FORMAT,
    ORT_QUIET,
    QNN_COMMON_ERROR_GENERAL,
    QNN_COMMON_ERROR_NOT_SUPPORTED,
    QNN_GRAPH_ERROR_INVALID_ARGUMENT,
    SHAPE_PREFIX,
    SHARED_SESSION,
    SIZES_PREFIX,
    VALUE_DTYPES,
    VALUE_PREFIX,
)
from npud.sim.skels import HostFileError, Skel, SkelCall, SkelMethod, idl_methods
from npud.sim.tensor_specs import Bounds, TensorSpec, arena_offsets

# The skel's parts live in their own modules; this one keeps every name it had.
__all__ = [
    "BUILTIN_PREFIX",
    "DEFAULT_INTRA_OP_THREADS",
    "MAX_ERROR_BYTES",
    "MAX_GRAPHS",
    "MAX_MODELS",
    "MAX_MODEL_BYTES",
    "MAX_MODEL_FILE_BYTES",
    "MAX_NAME_BYTES",
    "MAX_RANK",
    "MAX_TENSORS",
    "MAX_TENSOR_BYTES",
    "MAX_URI_BYTES",
    "NO_MODEL",
    "ONNX_TYPES",
    "ORT_MODEL_FORMAT",
    "ORT_QUIET",
    "OUTPUT_DIMS_STRIDE",
    "PORTAL_IDL",
    "QNN_COMMON_ERROR_GENERAL",
    "QNN_COMMON_ERROR_NOT_SUPPORTED",
    "QNN_GRAPH_ERROR_INVALID_ARGUMENT",
    "SHAPE_PREFIX",
    "SHARED_SESSION",
    "SIZES_PREFIX",
    "VALUE_DTYPES",
    "VALUE_PREFIX",
    "Bounds",
    "LoadedSlot",
    "ModelQuery",
    "OnnxModel",
    "PortalQnnSkel",
    "QnnFailureError",
    "RefusedError",
    "TensorSpec",
    "arena_offsets",
    "compose",
    "compose_sizes",
    "failure_text",
    "parse_model_uri",
]

log = logging.getLogger(__name__)

PORTAL_IDL: Final = idl.load("portal_qnn")
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
_SPEC_SIZE: Final = _GRAPH_INFO.param("inputs").element_size  # sizeof(portal_qnn_tensor_spec)


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
        call.pack_routs(_OUTPUT_DIMS, {"dims": dims_entries(shapes), "num_outputs": len(shapes)})
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
            dims = dims_entries(shapes or [])
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
