"""Several loaded models in one request (``model_chain``, PROTOCOL.md section 7.10).

A chain is a list of steps, each a graph of one of the connection's loaded
models, whose inputs are either the caller's (their values are in the
model's arena, as for ``model_run``) or outputs of earlier steps. npud checks
the whole chain against the models (:func:`plan_chain`: every refusal names
the step and the model) and runs it (:func:`run_chain`):

* **On the DSP, in one invoke** when the skel has chains (portal_qnn's
  ``model_ref`` and ``chain``, idl/portal_qnn.idl; the emulator's skel does):
  the caller's inputs are gathered from the models' arenas into the call's
  inputs, every step runs on the DSP with its intermediate tensors in the
  DSP's memory (freed there before the call returns), and the outputs asked
  for come back in the call's outputs, which npud writes where ``model_run``
  would have put them: each in its model's arena, at its ``TensorInfo``
  offset. The gather and scatter are copies of the tensors the chain's ends
  take and give (bytes to kilobytes for a wake-word chain), made by npud
  while it holds every model of the chain.
* **Step by step** when the skel has none (the C skel today,
  docs/hardware.md): one ``run`` invoke per step, each intermediate tensor
  copied by npud from its producer's arena region into its consumer's input
  region (so those regions, unlike on the DSP path, hold the intermediate
  values afterwards). Still one request and one reply for the client.

The outputs of a step that the request does not ask for are not written on
the DSP path; their regions keep what they held.
"""

from __future__ import annotations

import array
import contextlib
import dataclasses
import sys
import weakref
from collections.abc import Iterator, Sequence
from typing import Final

import npu_protocol as p
from npu_protocol import AEE, CodedError, ErrorCode
from npud.fastrpc.kernel.errors import RpcError
from npud.fastrpc.session import FastRpcSession
from npud.fastrpc.stubs.portal_qnn import (
    GraphSpec,
    ModelError,
    ModelFailure,
    PortalQnn,
    TensorSpec,
    arena_layout,
)
from npud.requests.models import NpuModel

MAX_STEPS: Final = p.MAX_CHAIN_STEPS
MAX_INTERMEDIATE_BYTES: Final = 256 * 1024 * 1024
"""What a chain's step outputs may take on the DSP at once (portal_qnn's staging limit)."""
GIVEN: Final = 0xFFFFFFFF
NO_STEP: Final = 0xFFFFFFFF
DIMS_STRIDE: Final = 9


@dataclasses.dataclass(frozen=True)
class PlannedStep:
    model_id: int
    model: NpuModel
    graph: int
    spec: GraphSpec
    sources: tuple[tuple[int, int] | None, ...]
    """Per input of the graph, in order: (step, output index) feeding it, None: the
    caller's (in the arena)."""
    label: str
    """How errors name it: ``step 1 (model 3 'embedding.onnx')``."""


@dataclasses.dataclass(frozen=True)
class Region:
    """A tensor at ``offset`` of ``model``'s arena."""

    model: NpuModel
    offset: int
    spec: TensorSpec


@dataclasses.dataclass(frozen=True)
class ChainPlan:
    steps: tuple[PlannedStep, ...]
    given: tuple[Region, ...]
    """The caller's inputs, in the plan's order (step by step, input by input)."""
    asked: tuple[tuple[int, int], ...]
    """(step, output index) of each output asked for, in the request's order."""
    asked_regions: tuple[Region, ...]

    @property
    def models(self) -> list[NpuModel]:
        unique: dict[int, NpuModel] = {}
        for step in self.steps:
            unique.setdefault(id(step.model), step.model)
        return list(unique.values())

    def words(self, refs: Sequence[int]) -> list[int]:
        """The DSP's plan (idl/portal_qnn.idl, chain) with each step's model ref."""
        words = [len(self.steps), len(self.asked)]
        given = 0
        for step, ref in zip(self.steps, refs, strict=True):
            words += [ref, step.graph, len(step.sources)]
            for source in step.sources:
                if source is None:
                    words += [GIVEN, given]
                    given += 1
                else:
                    words += list(source)
        for step_index, tensor in self.asked:
            words += [step_index, tensor]
        return words


def too_many_steps(count: int) -> CodedError:
    return CodedError(
        ErrorCode.INVALID_ARGUMENT,
        detail=f"a chain has at most {MAX_STEPS} steps; this one has {count} (split it into"
        " several requests)",
    )


def _label(index: int, model_id: int, model: NpuModel, graph: int) -> str:
    of = f", graph {model.graph_names[graph]!r}" if graph else ""
    return f"step {index} (model {model_id} {model.name!r}{of})"


def _names(specs: Sequence[TensorSpec]) -> str:
    return ", ".join(repr(s.name) for s in specs) or "none"


def plan_chain(
    request: p.ModelChainRequest,
    models: Sequence[NpuModel],
    session: FastRpcSession,
) -> ChainPlan:
    """The checked chain; CodedError naming the step (and its model) for what does not
    fit. ``models`` are the steps' models in order (resolved by the handler, which
    refuses an unknown id as model_run does)."""
    if len(request.steps) > MAX_STEPS:
        raise too_many_steps(len(request.steps))
    steps: list[PlannedStep] = []
    seen: dict[tuple[int, int], int] = {}
    intermediate = 0
    for index, (wire, model) in enumerate(zip(request.steps, models, strict=True)):
        label = f"step {index} (model {wire.model} {model.name!r})"
        try:
            graph = model.graph_index(wire.graph)
        except CodedError as exc:
            raise _in_step(exc, label) from None
        label = _label(index, wire.model, model, graph)
        if model.session is not session:
            raise CodedError(
                ErrorCode.INVALID_ARGUMENT,
                detail=f"{label}: the model was loaded in another DSP process (domain) than"
                " the chain's first step; a chain runs in one domain",
            )
        earlier = seen.setdefault((wire.model, graph), index)
        if earlier != index:
            raise CodedError(
                ErrorCode.INVALID_ARGUMENT,
                detail=f"{label} runs the graph step {earlier} runs: a chain runs each graph"
                " of a model once (their tensors share the model's arena)",
            )
        spec = model.graph_specs[graph]
        inputs = {s.name: s for s in spec.inputs}
        unknown = sorted(set(wire.inputs) - set(inputs))
        if unknown:
            raise CodedError(
                ErrorCode.INVALID_TENSOR_INDEX,
                index=f"{label}: input {unknown[0]!r} (the graph's inputs: {_names(spec.inputs)})",
            )
        sources: list[tuple[int, int] | None] = []
        for tensor in spec.inputs:
            source = wire.inputs.get(tensor.name)
            sources.append(None if source is None else _source(steps, index, label, tensor, source))
        intermediate += sum(s.nbytes for s in spec.outputs)
        steps.append(PlannedStep(wire.model, model, graph, spec, tuple(sources), label))
    if intermediate > MAX_INTERMEDIATE_BYTES:
        raise CodedError(
            ErrorCode.QUOTA_EXCEEDED,
            resource="chain intermediate tensor bytes",
            limit=MAX_INTERMEDIATE_BYTES,
        )
    asked: list[tuple[int, int]] = []
    regions: list[Region] = []
    for wanted in request.outputs:
        if wanted.step >= len(steps):
            raise CodedError(
                ErrorCode.INVALID_ARGUMENT,
                detail=f"an output asked for names step {wanted.step}; the chain has"
                f" {len(steps)} steps",
            )
        step = steps[wanted.step]
        made = _output_index(step, wanted.output)
        if (wanted.step, made) in asked:
            raise CodedError(
                ErrorCode.INVALID_ARGUMENT,
                detail=f"{step.label}: output {wanted.output!r} is asked for twice",
            )
        asked.append((wanted.step, made))
        regions.append(_region(step, made, output=True))
    given = [
        _region(step, i, output=False)
        for step in steps
        for i, source in enumerate(step.sources)
        if source is None
    ]
    return ChainPlan(tuple(steps), tuple(given), tuple(asked), tuple(regions))


def _source(
    steps: Sequence[PlannedStep],
    index: int,
    label: str,
    tensor: TensorSpec,
    source: p.ChainSource,
) -> tuple[int, int]:
    if source.step >= index:
        later = "itself" if source.step == index else f"step {source.step}, which is not earlier"
        raise CodedError(
            ErrorCode.INVALID_ARGUMENT,
            detail=f"{label}: input {tensor.name!r} is fed from {later}: a chain runs its"
            " steps in order, each fed only by earlier ones (no cycles)",
        )
    producer = steps[source.step]
    output = _output_index(producer, source.output, f"{label}: input {tensor.name!r} is fed")
    made = producer.spec.outputs[output]
    if made.dtype != tensor.dtype or made.shape != tensor.shape:
        raise CodedError(
            ErrorCode.TENSOR_MISMATCH,
            detail=f"{label}: input {tensor.name!r} takes {tensor.describe()}; {producer.label}'s"
            f" output {made.name!r} is {made.describe()}",
        )
    return source.step, output


def _output_index(step: PlannedStep, name: str, why: str = "") -> int:
    for spec in step.spec.outputs:
        if spec.name == name:
            return spec.index
    prefix = f"{why} from " if why else ""
    raise CodedError(
        ErrorCode.INVALID_TENSOR_INDEX,
        index=f"{prefix}{step.label}: output {name!r} (the graph's outputs:"
        f" {_names(step.spec.outputs)})",
    )


def _region(step: PlannedStep, tensor: int, *, output: bool) -> Region:
    layout = step.model.layouts[step.graph]
    if output:
        spec = step.spec.outputs[tensor]
        return Region(step.model, layout.output_base + layout.output_offsets[tensor], spec)
    spec = step.spec.inputs[tensor]
    return Region(step.model, layout.input_base + layout.input_offsets[tensor], spec)


_TEXT_FIELDS: Final = ("detail", "msg", "index", "model")


def _in_step(exc: CodedError, label: str) -> CodedError:
    """``exc`` with its message naming the step (its first text field prefixed)."""
    for key in _TEXT_FIELDS:
        value = exc.fields.get(key)
        if isinstance(value, str):
            return RpcError(exc.code, **{**exc.fields, key: f"{label}: {value}"})
    return exc


# --- running ---------------------------------------------------------------------------


def run_chain(plan: ChainPlan) -> tuple[tuple[int, ...], ...]:
    """Run the chain (one invoke where the skel has chains, else one per step); the shape
    of each output asked for, as the run produced it."""
    portal = plan.steps[0].model.portal
    if portal not in _WITHOUT_CHAIN:
        refs = [step.model.portal.model_ref(step.model.slot) for step in plan.steps]
        if all(ref is not None for ref in refs):
            shapes = _run_on_dsp(plan, [ref for ref in refs if ref is not None])
            if shapes is not None:
                return shapes
            _WITHOUT_CHAIN.add(portal)  # asked once per handle: a skel does not grow methods
    return _run_steps(plan)


_WITHOUT_CHAIN: Final[weakref.WeakSet[PortalQnn]] = weakref.WeakSet()
"""Handles whose skel has model_ref but answered chain AEE_EUNSUPPORTED."""


@contextlib.contextmanager
def _holding(models: Sequence[NpuModel]) -> Iterator[None]:
    """No other call on any of the chain's models meanwhile, locked in one order."""
    keyed = {(id(m.portal), m.slot): m for m in models}
    with contextlib.ExitStack() as stack:
        for key in sorted(keyed):
            model = keyed[key]
            stack.enter_context(model.portal.hold(model.slot))
        yield


def _run_on_dsp(plan: ChainPlan, refs: Sequence[int]) -> tuple[tuple[int, ...], ...] | None:
    """The chain as one invoke; None when the skel has no ``chain`` method."""
    given_offsets, given_bytes = arena_layout([r.spec for r in plan.given])
    asked_offsets, asked_bytes = arena_layout([r.spec for r in plan.asked_regions])
    gathered = bytearray(given_bytes)
    for region, offset in zip(plan.given, given_offsets, strict=True):
        size = region.spec.nbytes
        gathered[offset : offset + size] = region.model.arena.view()[
            region.offset : region.offset + size
        ]
    portal = plan.steps[0].model.portal
    with _holding(plan.models):
        rc, values = portal.call(
            "chain",
            plan=_u32(plan.words(refs)),
            inputs=bytes(gathered),
            outputs=asked_bytes,
            dims=DIMS_STRIDE * len(plan.asked),
        )
        if rc == AEE.EUNSUPPORTED.dsp:
            return None
        if rc != 0:
            raise RpcError(ErrorCode.INVOKE_FAILED, code=rc)
        failed = values.integer("failed_step")
        if failed != NO_STEP:
            raise _step_failure(
                plan, failed, values.integer("step_status"), values.integer("qnn_status")
            )
        data = values.data("outputs")
        for region, offset in zip(plan.asked_regions, asked_offsets, strict=True):
            size = region.spec.nbytes
            region.model.arena.view()[region.offset : region.offset + size] = data[
                offset : offset + size
            ]
    dims = values.integers("dims")
    shapes = []
    for i in range(len(plan.asked)):
        rank = min(dims[DIMS_STRIDE * i], 8)
        shapes.append(tuple(dims[DIMS_STRIDE * i + 1 : DIMS_STRIDE * i + 1 + rank]))
    return tuple(shapes)


def _u32(words: Sequence[int]) -> bytes:
    """``words`` as little-endian u32s (the IDL's), packed at once rather than word by word."""
    packed = array.array("I", words)
    assert packed.itemsize == 4, "u32 is a C unsigned int on the hosts npud runs on"
    if sys.byteorder != "little":
        packed.byteswap()
    return packed.tobytes()


def _step_failure(plan: ChainPlan, index: int, status: int, qnn: int) -> CodedError:
    """The error of the chain's step ``index``, in the DSP's words (last_error)."""
    if index >= len(plan.steps):
        return RpcError(ErrorCode.INVOKE_FAILED, code=status or AEE.EFAILED.dsp)
    step = plan.steps[index]
    said = step.model.portal.last_error(step.model.slot)
    because = f": {said}" if said else ""
    if qnn:
        return ModelError(ModelFailure.QNN, f"{step.label}: failed with QNN error {qnn}{because}")
    if status == AEE.EINVALIDFORMAT.dsp:
        return ModelError(
            ModelFailure.OUTPUT_TOO_LARGE,
            f"{step.label}{because or ': an output outgrew its room'} (give it a larger room"
            " at load: its whole shape in shapes=)",
        )
    if status == AEE.EBADSIZE.dsp:
        return ModelError(
            ModelFailure.TENSOR_MISMATCH,
            f"{step.label}{because or ': an input was fed an output of another size'}",
        )
    return RpcError(ErrorCode.INVOKE_FAILED, code=status)


def _run_steps(plan: ChainPlan) -> tuple[tuple[int, ...], ...]:
    """The chain one ``run`` invoke per step (a skel without chains)."""
    produced: list[tuple[tuple[int, ...], ...]] = []
    for step in plan.steps:
        for index, source in enumerate(step.sources):
            if source is None:
                continue
            producer = plan.steps[source[0]]
            target = _region(step, index, output=False)
            origin = _region(producer, source[1], output=True)
            shape = produced[source[0]][source[1]]
            if shape != target.spec.shape:
                raise ModelError(
                    ModelFailure.TENSOR_MISMATCH,
                    f"{step.label}: input {target.spec.name!r} takes {list(target.spec.shape)};"
                    f" {producer.label}'s output {origin.spec.name!r} produced {list(shape)}",
                )
            size = target.spec.nbytes
            target.model.arena.view()[target.offset : target.offset + size] = (
                origin.model.arena.view()[origin.offset : origin.offset + size]
            )
        try:
            shapes = step.model.run(step.graph)
        except CodedError as exc:
            raise _in_step(exc, step.label) from None
        produced.append(shapes or tuple(s.shape for s in step.spec.outputs))
    return tuple(produced[s][t] for s, t in plan.asked)
