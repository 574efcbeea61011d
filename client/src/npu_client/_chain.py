"""Several loaded models run in one request: a chain, built once and run per chunk.

A wake-word pipeline runs three models per 80 ms chunk (a melspectrogram, an
embedding, a wake-word head); as a chain it is one request and one reply::

    chain = npu.chain(
        [
            npu_client.Step("mel", mel),
            npu_client.Step("embed", embedding, inputs={"input_1": "mel:output"}),
            npu_client.Step("wake", head, inputs={"x": "embed:features"}),
        ],
        outputs=["wake:score"],
    )
    score = chain.run({"mel:audio": chunk})["wake:score"]

A step is a graph of a loaded model of this client; its inputs are either
fed by earlier steps' outputs (``inputs={"<input>": "<step>:<output>"}``) or
the caller's, given to :meth:`ChainBase.run` as ``"<step>:<input>"`` (or set
on the model beforehand: an input keeps its value between runs, as for
``Model.run``). npud runs the steps in order, on the DSP in one call where
the DSP can (intermediate tensors never leave it), and answers with the
outputs asked for. A reference is ``"<step>:<tensor>"`` (split at the first
colon: step names have none, tensor names may) or a ``(step, tensor)`` pair.

:class:`ChainBase` is everything but the waiting; the blocking ``Chain`` and
``TrioChain`` add only that, as the model facades do.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from npu_client import _requests as requests
from npu_client._args import call_timing
from npu_client._core import Call, ClientCore, Pending
from npu_client._errors import (
    InputNotSet,
    InvalidArgument,
    InvalidTensorIndex,
    TensorMismatch,
    Unsupported,
    code_message,
)
from npu_client._models import ModelState, TensorValue, numpy_module
from npu_protocol import (
    MAX_CHAIN_STEPS,
    MAX_TENSORS,
    SINCE,
    ChainOutput,
    ChainSource,
    ChainStep,
    ErrorCode,
    Feature,
    ModelChainReply,
    ModelChainRequest,
    TensorInfo,
    format_message,
    speaks,
)

Ref = str | tuple[str, str]
"""``"<step>:<tensor>"`` or ``(step, tensor)``."""


@dataclasses.dataclass(frozen=True)
class Step:
    """One step of a chain: graph ``graph`` (by name; the first when None) of ``model``,
    called ``name`` in references; ``inputs`` maps inputs of the graph to the earlier
    steps' outputs that feed them (every other input is the caller's)."""

    name: str
    model: Any
    inputs: Mapping[str, Ref] = dataclasses.field(default_factory=dict)
    graph: str | None = None


def _split(ref: object, what: str) -> tuple[str, str]:
    if isinstance(ref, tuple) and len(ref) == 2 and all(isinstance(r, str) for r in ref):
        return ref[0], ref[1]
    if isinstance(ref, str) and ":" in ref:
        step, _, tensor = ref.partition(":")
        return step, tensor
    raise _invalid(f"{what} {ref!r} is not '<step>:<tensor>' nor a (step, tensor) pair")


def _invalid(detail: str) -> InvalidArgument:
    return InvalidArgument(
        format_message(ErrorCode.INVALID_ARGUMENT, detail=detail), fields={"detail": detail}
    )


def _no_tensor(index: str) -> InvalidTensorIndex:
    return InvalidTensorIndex(
        code_message(ErrorCode.INVALID_TENSOR_INDEX, index=index), fields={"index": index}
    )


def _names(specs: Sequence[TensorInfo]) -> str:
    return ", ".join(repr(s.name) for s in specs) or "none"


@dataclasses.dataclass(frozen=True)
class _Planned:
    name: str
    state: ModelState
    graph: int
    inputs: tuple[TensorInfo, ...]
    outputs: tuple[TensorInfo, ...]
    fed: frozenset[str]

    @property
    def label(self) -> str:
        return f"step {self.name!r} (model {self.state.id} {self.state.info.name!r})"


class ChainBase:
    """A chain of this client's loaded models (see the module docstring). Build it once
    (``client.chain(...)``: everything is checked then) and run it per chunk: a run
    writes the given inputs into the models' arenas, sends one small request and reads
    the outputs asked for from the arenas."""

    def __init__(self, client: Any, steps: Sequence[Step], outputs: Sequence[Ref]) -> None:
        """Internal: use the client's ``chain``."""
        core: ClientCore[Any] = client._core
        if not speaks(core.protocol_version, Feature.CHAIN):
            what = (
                f"chains (npud speaks protocol version {core.protocol_version}; running"
                f" several models in one request needs {SINCE[Feature.CHAIN]}): run the models one"
                " by one, or update npud"
            )
            raise Unsupported(code_message(ErrorCode.UNSUPPORTED, what=what), fields={"what": what})
        if not 1 <= len(steps) <= MAX_CHAIN_STEPS:
            raise _invalid(f"a chain has 1 to {MAX_CHAIN_STEPS} steps; got {len(steps)}")
        if not 1 <= len(outputs) <= MAX_TENSORS:
            raise _invalid(f"a chain answers with 1 to {MAX_TENSORS} outputs; got {len(outputs)}")
        self._client = client
        planned: list[_Planned] = []
        index: dict[str, int] = {}
        wire: list[ChainStep] = []
        for position, step in enumerate(steps):
            if not isinstance(step, Step):
                raise TypeError(f"a chain's steps are npu_client.Step, not {type(step).__name__}")
            if not step.name or ":" in step.name or step.name in index:
                raise _invalid(
                    f"step {position}'s name {step.name!r} is empty, has a colon or is taken"
                )
            state = getattr(step.model, "_state", None)
            if not isinstance(state, ModelState) or step.model._client is not client:
                raise _invalid(f"step {step.name!r}: its model is not one this client loaded")
            state.check_loaded()
            graph = requests.graph_of(core, state, step.graph)
            info = state.graphs[graph]
            this = _Planned(
                step.name, state, graph, info.inputs, info.outputs, frozenset(step.inputs)
            )
            sources = {}
            for input_name, ref in step.inputs.items():
                sources[input_name] = self._source(planned, index, this, input_name, ref)
            index[step.name] = position
            planned.append(this)
            wire.append(
                ChainStep(
                    model=state.id,
                    graph=info.name if graph else "",
                    inputs=sources,
                )
            )
        self._steps = tuple(planned)
        self._index = index
        asked: list[ChainOutput] = []
        self._asked: list[tuple[str, _Planned, TensorInfo]] = []
        for ref in outputs:
            name, tensor = _split(ref, "output")
            step_at = self._step(name, "output")
            spec = self._output(planned[step_at], tensor)
            key = f"{name}:{tensor}"
            if any(key == k for k, _, _ in self._asked):
                raise _invalid(f"output {key!r} is asked for twice")
            asked.append(ChainOutput(step=step_at, output=tensor))
            self._asked.append((key, planned[step_at], spec))
        self._wire_steps = tuple(wire)
        self._wire_outputs = tuple(asked)
        self.last_dsp_us = 0
        """The DSP time of the last run (µs), as npud measured it."""

    # --- what it is ----------------------------------------------------------------------

    @property
    def inputs(self) -> dict[str, TensorInfo]:
        """The caller's inputs by ``"<step>:<input>"``: every input no step feeds."""
        return {
            f"{s.name}:{spec.name}": spec
            for s in self._steps
            for spec in s.inputs
            if spec.name not in s.fed
        }

    @property
    def outputs(self) -> tuple[str, ...]:
        """The outputs a run returns, by ``"<step>:<output>"``."""
        return tuple(key for key, _, _ in self._asked)

    def __repr__(self) -> str:
        steps = " -> ".join(s.name for s in self._steps)
        return f"<chain {steps}: {', '.join(self.outputs)}>"

    # --- building ------------------------------------------------------------------------

    def _step(self, name: str, what: str, index: Mapping[str, int] | None = None) -> int:
        table = self._index if index is None else index
        if name not in table:
            known = ", ".join(repr(n) for n in table) or "none"
            raise _invalid(f"{what} names step {name!r}, which is not an earlier step ({known})")
        return table[name]

    @staticmethod
    def _output(step: _Planned, tensor: str) -> TensorInfo:
        for spec in step.outputs:
            if spec.name == tensor:
                return spec
        raise _no_tensor(f"{step.label}: output {tensor!r} (its outputs: {_names(step.outputs)})")

    def _source(
        self,
        planned: Sequence[_Planned],
        index: Mapping[str, int],
        this: _Planned,
        input_name: str,
        ref: Ref,
    ) -> ChainSource:
        target = next((s for s in this.inputs if s.name == input_name), None)
        if target is None:
            raise _no_tensor(
                f"{this.label}: input {input_name!r} (its inputs: {_names(this.inputs)})"
            )
        step_name, tensor = _split(ref, f"{this.label}: input {input_name!r}'s source")
        at = self._step(step_name, f"{this.label}: input {input_name!r}", index)
        made = self._output(planned[at], tensor)
        if made.dtype != target.dtype or tuple(made.shape) != tuple(target.shape):
            detail = (
                f"{this.label}: input {input_name!r} takes {target.dtype} {list(target.shape)};"
                f" {planned[at].label}'s output {tensor!r} is {made.dtype} {list(made.shape)}"
            )
            raise TensorMismatch(
                format_message(ErrorCode.TENSOR_MISMATCH, detail=detail), fields={"detail": detail}
            )
        return ChainSource(step=at, output=tensor)

    # --- running -------------------------------------------------------------------------

    def _set_inputs(self, inputs: Mapping[Any, TensorValue] | None) -> None:
        """``run``'s first step: each given input into its model's arena, then a check
        that every input the caller owns has a value."""
        for ref, value in (inputs or {}).items():
            name, tensor = _split(ref, "input")
            step = self._steps[self._step(name, "input")]
            if tensor in step.fed:
                raise _invalid(f"input {name}:{tensor} is fed by an earlier step; do not give it")
            step.state.set_input(tensor, value, step.graph)
        for step in self._steps:
            step.state.check_loaded()
            done = step.state.inputs_set(step.graph)
            missing = [
                repr(f"{step.name}:{s.name}")
                for s in step.inputs
                if s.name not in step.fed and s.name not in done
            ]
            if missing:
                detail = (
                    f"chain input {', '.join(missing)} has no value: give it to run() or set it"
                    " on the model before running"
                )
                raise InputNotSet(
                    format_message(ErrorCode.INPUT_NOT_SET, detail=detail),
                    fields={"detail": detail},
                )

    def _run_call(self, timeout: float | None, deadline: float | None) -> Call[dict[str, Any]]:
        core: ClientCore[Any] = self._client._core
        timeout_ms, deadline_ms = call_timing(timeout, deadline, core.limits, core.protocol_version)
        steps, outputs = self._wire_steps, self._wire_outputs

        def finish(pending: Pending) -> dict[str, Any]:
            reply = pending.result(ModelChainReply)
            self.last_dsp_us = reply.dsp_us
            return self._outputs(reply.output_shapes)

        return Call(
            lambda rid: ModelChainRequest(
                id=rid,
                steps=steps,
                outputs=outputs,
                timeout_ms=timeout_ms,
                deadline_ms=deadline_ms,
            ),
            finish,
        )

    def _outputs(self, shapes: Sequence[Sequence[int]]) -> dict[str, Any]:
        """Each output asked for, read from its model's arena at the shape it was
        produced with (copies)."""
        numpy = numpy_module()
        result: dict[str, Any] = {}
        for (key, step, spec), shape in zip(self._asked, shapes, strict=False):
            produced = tuple(shape)
            data = step.state.read(spec, produced)
            if numpy is None:
                result[key] = data
            else:
                result[key] = numpy.frombuffer(data, numpy.dtype(spec.dtype)).reshape(produced)
        return result


class Chain(ChainBase):
    """A chain of a blocking client's models (:meth:`npu_client.Client.chain`)."""

    def run(
        self,
        inputs: Mapping[Any, TensorValue] | None = None,
        *,
        timeout: float | None = None,
        deadline: float | None = None,
    ) -> dict[str, Any]:
        """Set ``inputs`` (by ``"<step>:<input>"``), run every step once in one request,
        return the outputs asked for by ``"<step>:<output>"`` (copies: numpy arrays, or
        bytes without numpy). ``timeout`` and ``deadline`` (seconds) as for a model's
        ``run``. A step that fails fails the run, its error naming the step and model."""
        self._set_inputs(inputs)
        result: dict[str, Any] = self._client._run(self._run_call(timeout, deadline))
        return result


class TrioChain(ChainBase):
    """A chain of a trio client's models (``TrioClient.chain``); ``run`` is awaited."""

    async def run(
        self,
        inputs: Mapping[Any, TensorValue] | None = None,
        *,
        timeout: float | None = None,
        deadline: float | None = None,
    ) -> dict[str, Any]:
        """As :meth:`Chain.run`."""
        self._set_inputs(inputs)
        result: dict[str, Any] = await self._client._run(self._run_call(timeout, deadline))
        return result
