"""portal_qnn's chains on the emulated DSP: ``model_ref`` and ``chain`` (idl/portal_qnn.idl).

A chain runs several graphs in one call: npud's wake-word pipeline (a
melspectrogram, an embedding and a wake-word head per 80 ms chunk) is then
one invoke instead of three. Its steps name models by *ref*, a number
:class:`ModelRefs` gives a loaded model for its whole DSP process (every
handle of a process shares one directory, a :class:`~npud.sim.pd_services.PdResident`),
because each of npud's model loads is a handle of its own.

The plan (u32 words, layout in the IDL) is checked whole before anything
runs; each step's inputs are numpy views of the caller's inputs arena or the
arrays an earlier step produced, and only the outputs the plan asks for are
written into the outputs arena, once every step succeeded. The intermediate
arrays belong to one :class:`ChainRun`, which is emptied in a ``finally`` on
every path (and counted in :attr:`ModelRefs.live_bytes`, 0 between calls,
which tests read).

Locks: the skels of every model a chain names are locked for the whole call,
in one global order (the refs' directory order), so two chains sharing models
never deadlock, and a plain run of one of those models waits its turn as it
would behind another run.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import threading
from collections.abc import Iterator, Sequence
from typing import Any, Final, Protocol

import numpy as np
import numpy.typing as npt

from npu_protocol.aee import AEE
from npud.idl import arena
from npud.sim.pd_services import PdResident, PdServices


class Tensor(Protocol):
    """A graph's tensor as the skel describes it (npud.sim.tensor_specs.TensorSpec)."""

    @property
    def name(self) -> str: ...
    @property
    def dtype(self) -> np.dtype[Any]: ...
    @property
    def shape(self) -> tuple[int, ...]: ...
    @property
    def nbytes(self) -> int: ...


class Graph(Protocol):
    """One graph of a loaded model (npud.sim.portal_qnn.Graph)."""

    last_error: bytes

    @property
    def inputs(self) -> Sequence[Tensor]: ...
    @property
    def outputs(self) -> Sequence[Tensor]: ...

    def run_arrays(
        self, feeds: Sequence[npt.NDArray[Any]]
    ) -> tuple[int, int, list[npt.NDArray[Any]]]: ...


class Loaded(Protocol):
    @property
    def graphs(self) -> Sequence[Graph]: ...


class Skel(Protocol):
    """One open handle of the skel (npud.sim.portal_qnn.Skel): the module that
    defines it imports this one, so it is named by what a chain uses of it."""

    @property
    def lock(self) -> threading.Lock: ...
    def loaded_slot(self, index: int) -> Loaded | None: ...
    def keep_error(self, index: int, graph: Any) -> None: ...  # Any: a Graph of its own kind


MAX_STEPS: Final = 16
MAX_OUTPUTS: Final = 32
MAX_TENSORS: Final = 32
MAX_INTERMEDIATE_BYTES: Final = 256 * 1024 * 1024
GIVEN: Final = 0xFFFFFFFF
"""A source_step that takes a given tensor from the inputs arena."""
NO_STEP: Final = 0xFFFFFFFF
DIMS_STRIDE: Final = 9
MAX_RANK: Final = 8


class ModelRefs(PdResident):
    """The DSP process's directory of loaded models by ref (one per process)."""

    def __init__(self, pd: PdServices | None = None) -> None:
        if pd is not None:
            super().__init__(pd)
        self._lock = threading.Lock()
        self._refs = itertools.count(1)
        self._models: dict[int, tuple[Skel, int]] = {}
        self.live_bytes = 0
        """Bytes of intermediate tensors held by chains in flight (0 between calls)."""

    def ref(self, skel: Skel, slot: int) -> int:
        ref = next(self._refs)
        with self._lock:
            self._models[ref] = (skel, slot)
        return ref

    def drop(self, ref: int) -> None:
        with self._lock:
            self._models.pop(ref, None)

    def find(self, ref: int) -> tuple[Skel, int] | None:
        with self._lock:
            return self._models.get(ref)

    def count(self, delta: int) -> None:
        with self._lock:
            self.live_bytes += delta

    def pd_ended(self) -> None:
        with self._lock:
            self._models.clear()


LOCAL_REFS: Final = ModelRefs()
"""The directory of skels that run outside a DSP process (a skel built in a test)."""


class PlanError(Exception):
    """A malformed plan or arena: ``code`` is the AEE result."""

    def __init__(self, code: AEE, reason: str) -> None:
        super().__init__(reason)
        self.code = code


@dataclasses.dataclass(frozen=True)
class Source:
    step: int
    """An earlier step's index, or GIVEN."""
    tensor: int


@dataclasses.dataclass(frozen=True)
class Step:
    ref: int
    skel: Skel
    slot: int
    graph: Graph
    sources: tuple[Source, ...]


@dataclasses.dataclass(frozen=True)
class Plan:
    steps: tuple[Step, ...]
    outputs: tuple[tuple[int, int], ...]
    """(step, tensor_index) of each asked output."""
    given_offsets: tuple[int, ...]
    given_bytes: int
    output_offsets: tuple[int, ...]
    output_bytes: int


def parse_plan(
    words: Sequence[int],
) -> tuple[list[tuple[int, int]], list[list[Source]], list[int]]:
    """The plan's (ref, graph) per step, sources per step and asked outputs as flat
    (step, tensor) pairs; PlanError(EBADPARM) when the words do not add up."""
    cursor = iter(words)

    def take() -> int:
        try:
            return next(cursor)
        except StopIteration:
            raise PlanError(AEE.EBADPARM, "the plan ends early") from None

    steps, outputs = take(), take()
    if not 1 <= steps <= MAX_STEPS or not 1 <= outputs <= MAX_OUTPUTS:
        raise PlanError(
            AEE.EBADPARM, f"{steps} steps and {outputs} outputs (1..{MAX_STEPS}, 1..{MAX_OUTPUTS})"
        )
    graphs: list[tuple[int, int]] = []
    sources: list[list[Source]] = []
    for _ in range(steps):
        ref, graph, count = take(), take(), take()
        if count > MAX_TENSORS:
            raise PlanError(AEE.EBADPARM, f"a step has {count} inputs (at most {MAX_TENSORS})")
        graphs.append((ref, graph))
        sources.append([Source(take(), take()) for _ in range(count)])
    asked = [take() for _ in range(2 * outputs)]
    if next(cursor, None) is not None:
        raise PlanError(AEE.EBADPARM, "the plan has words past its last output")
    return graphs, sources, asked


def check_plan(
    graphs: Sequence[tuple[int, int]],
    sources: Sequence[Sequence[Source]],
    asked: Sequence[int],
    found: dict[int, tuple[Skel, int]],
) -> Plan:
    """The checked plan (the skels' locks are held); PlanError otherwise."""
    steps: list[Step] = []
    given: list[Any] = []
    intermediate = 0
    for index, ((ref, graph_index), wanted) in enumerate(zip(graphs, sources, strict=True)):
        skel, slot = found[ref]
        loaded = skel.loaded_slot(slot)
        if loaded is None:
            raise PlanError(AEE.EBADSTATE, f"step {index}: the model of ref {ref} is unloaded")
        if graph_index >= len(loaded.graphs):
            raise PlanError(AEE.EBADPARM, f"step {index}: no graph {graph_index}")
        graph = loaded.graphs[graph_index]
        if len(wanted) != len(graph.inputs):
            raise PlanError(
                AEE.EBADPARM,
                f"step {index}: {len(wanted)} sources for {len(graph.inputs)} inputs",
            )
        _check_sources(index, graph, wanted, steps, given)
        intermediate += sum(spec.nbytes for spec in graph.outputs)
        steps.append(Step(ref, skel, slot, graph, tuple(wanted)))
    if intermediate > MAX_INTERMEDIATE_BYTES:
        raise PlanError(AEE.ENOMEMORY, f"{intermediate} bytes of intermediate tensors")
    pairs = list(zip(asked[0::2], asked[1::2], strict=True))
    if len(set(pairs)) != len(pairs):
        raise PlanError(AEE.EBADPARM, "an output is asked for twice")
    outputs = []
    for step, tensor in pairs:
        if step >= len(steps) or tensor >= len(steps[step].graph.outputs):
            raise PlanError(AEE.EBADPARM, f"no output {tensor} of step {step}")
        outputs.append(steps[step].graph.outputs[tensor])
    given_offsets, given_bytes = arena.arena_layout(spec.nbytes for spec in given)
    output_offsets, output_bytes = arena.arena_layout(spec.nbytes for spec in outputs)
    return Plan(
        tuple(steps), tuple(pairs), given_offsets, given_bytes, output_offsets, output_bytes
    )


def _check_sources(
    index: int,
    graph: Graph,
    wanted: Sequence[Source],
    steps: Sequence[Step],
    given: list[Any],
) -> None:
    """Each input of step ``index`` has a source that fits it; the given ones are
    appended to ``given`` in plan order."""
    for spec, source in zip(graph.inputs, wanted, strict=True):
        if source.step == GIVEN:
            if source.tensor != len(given):
                raise PlanError(AEE.EBADPARM, "given tensors are not taken once each, in order")
            given.append(spec)
            continue
        if source.step >= index:
            raise PlanError(AEE.EBADPARM, f"step {index} takes from step {source.step}")
        producer = steps[source.step].graph
        if source.tensor >= len(producer.outputs):
            raise PlanError(AEE.EBADPARM, f"step {source.step} has no output {source.tensor}")
        out = producer.outputs[source.tensor]
        if out.dtype != spec.dtype or out.nbytes != spec.nbytes:
            raise PlanError(
                AEE.EBADPARM,
                f"step {index}: {spec.name} is {spec.dtype} {list(spec.shape)}; step"
                f" {source.step}'s {out.name} is {out.dtype} {list(out.shape)}",
            )


@contextlib.contextmanager
def locked(skels: Sequence[Skel]) -> Iterator[None]:
    """Every distinct skel's lock, in one order for every chain."""
    unique = sorted({id(s): s for s in skels}.values(), key=id)
    with contextlib.ExitStack() as stack:
        for skel in unique:
            stack.enter_context(skel.lock)
        yield


class StepFailedError(Exception):
    """Step ``step`` failed: an AEE code (``status``) or a QNN error (``qnn``)."""

    def __init__(self, step: int, status: int, qnn: int) -> None:
        super().__init__(step)
        self.step = step
        self.status = status
        self.qnn = qnn


class ChainRun:
    """One call's intermediate tensors: counted while held, emptied on every path."""

    def __init__(self, refs: ModelRefs) -> None:
        self._refs = refs
        self.produced: list[list[npt.NDArray[Any]]] = []
        self._bytes = 0

    def keep(self, arrays: list[npt.NDArray[Any]]) -> None:
        self.produced.append(arrays)
        size = sum(a.nbytes for a in arrays)
        self._bytes += size
        self._refs.count(size)

    def close(self) -> None:
        self.produced.clear()
        self._refs.count(-self._bytes)
        self._bytes = 0


def run_plan(plan: Plan, inputs: memoryview, run: ChainRun) -> list[npt.NDArray[Any]]:
    """Every step in order; the asked outputs. StepFailedError for the first that fails."""
    given = 0
    for index, step in enumerate(plan.steps):
        feeds: list[npt.NDArray[Any]] = []
        for spec, source in zip(step.graph.inputs, step.sources, strict=True):
            if source.step == GIVEN:
                offset = plan.given_offsets[given]
                given += 1
                count = int(np.prod(spec.shape, dtype=np.int64))
                feeds.append(np.frombuffer(inputs, spec.dtype, count, offset).reshape(spec.shape))
                continue
            array = run.produced[source.step][source.tensor]
            if array.shape != spec.shape:  # an output smaller than its room: not this input
                step.graph.last_error = (
                    f"input {spec.name!r} takes {list(spec.shape)}; step {source.step}'s output"
                    f" produced {list(array.shape)}"
                ).encode()[:255]
                step.skel.keep_error(step.slot, step.graph)
                raise StepFailedError(index, AEE.EBADSIZE.dsp, 0)
            feeds.append(array)
        rc, status, produced = step.graph.run_arrays(feeds)
        step.skel.keep_error(step.slot, step.graph)
        if rc != 0 or status != 0:
            raise StepFailedError(index, rc, status)
        run.keep(produced)
    return [run.produced[step][tensor] for step, tensor in plan.outputs]


def write_outputs(plan: Plan, arrays: Sequence[npt.NDArray[Any]], outputs: memoryview) -> list[int]:
    """The asked outputs into the outputs arena (each at its offset, the rest zero); the
    dims words."""
    target = np.frombuffer(outputs, np.uint8)
    target[:] = 0
    dims: list[int] = []
    for offset, array in zip(plan.output_offsets, arrays, strict=True):
        data = np.ascontiguousarray(array).reshape(-1).view(np.uint8)
        target[offset : offset + data.nbytes] = data
        shape = [int(d) for d in array.shape]
        dims += [len(shape), *shape, *[0] * (MAX_RANK - len(shape))]
    return dims
