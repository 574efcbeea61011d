"""The one implementation of a loaded model behind both clients' facades.

:class:`ModelBase` is everything a model is and does that does not wait: its
description, the tensors in the shared arena (:class:`npu_client._models.ModelState`),
and the requests its waiting calls send (:mod:`npu_client._requests`). The blocking
``Model`` (:mod:`npu_client._blocking`) and ``TrioModel``
(:mod:`npu_client.trio_client`) add only the waiting: each of ``run``, ``execute``,
``info`` and ``unload`` hands the request this class builds to its client's ``_run``,
called or awaited, and the context-manager protocol of its kind.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Generic, Protocol, TypeVar

from npu_client import _requests as requests
from npu_client._core import Call, ClientCore
from npu_client._models import ModelState, TensorValue, pick_graph
from npu_protocol import GraphInfo, ModelInfo, TensorInfo


class _HasCore(Protocol):
    @property
    def _core(self) -> ClientCore[Any]: ...


C = TypeVar("C", bound=_HasCore)


class ModelBase(Generic[C]):
    """A model loaded in npud; its tensors are shared memory (the arena).

    ``inputs`` / ``outputs`` describe the tensors (name, dtype, shape, nbytes,
    offset) of the model's first graph; ``graphs`` lists every graph (a QNN
    context binary, or a graph pack on the emulator, holds up to 8: an LLM's
    prefill and decode), each with its own tensors in its own regions of the
    arena. ``graph=NAME`` picks one for ``run``, ``execute`` and the tensor
    calls; without it they use the first. ``run`` gives inputs, runs once and
    returns every output: numpy arrays when numpy is installed, ``bytes``
    otherwise. Inputs keep their value
    between runs, so ``run({"audio": chunk})`` changes only the audio. For
    callers that keep state between calls: :meth:`set_input`, ``execute``,
    :meth:`get_output`, and :meth:`input_view` / :meth:`output_view`, views of
    the tensors in the shared arena (write an input in place: no copy at all).
    A run sends only its small request; no tensor bytes cross the socket.
    ``unload`` (or leaving a ``with`` block) releases it in npud and here.
    """

    def __init__(self, client: C, state: ModelState) -> None:
        """Internal: use the client's ``load_model``."""
        self._client = client
        self._state = state

    @property
    def id(self) -> int:
        """The daemon's id for the model (scoped to the connection)."""
        return self._state.id

    @property
    def name(self) -> str:
        return self._state.info.name

    @property
    def inputs(self) -> tuple[TensorInfo, ...]:
        return self._state.inputs

    @property
    def outputs(self) -> tuple[TensorInfo, ...]:
        return self._state.outputs

    @property
    def graphs(self) -> tuple[GraphInfo, ...]:
        """Every graph of the model in index order: its name and its own inputs and
        outputs. A daemon before protocol version 5 reports the first alone, unnamed."""
        return self._state.graphs

    @property
    def unloaded(self) -> bool:
        """True once unloaded, its client closed, or its DSP session restarted."""
        return self._state.unloaded

    @property
    def last_dsp_us(self) -> int:
        """The DSP time of the last run (µs), as npud measured it."""
        return self._state.last_dsp_us

    def set_input(self, name: str, value: TensorValue, *, graph: str | None = None) -> None:
        """Write input ``name`` (of graph ``graph``; the first when None) into the shared
        arena (checked: dtype, shape, size)."""
        self._state.set_input(name, value, self._graph(graph))

    def get_output(self, name: str, *, graph: str | None = None) -> Any:
        """A copy of output ``name`` (of graph ``graph``) from that graph's last
        successful run (NoOutputs before one)."""
        return self._state.get_output(name, self._graph(graph))

    def output_shape(self, name: str, *, graph: str | None = None) -> tuple[int, ...]:
        """Output ``name``'s shape (of graph ``graph``) as its last successful run produced
        it: smaller than ``outputs``' shape, its room, when the data decides its size
        (``get_output`` and ``run`` return arrays of this shape)."""
        return self._state.output_shape(name, self._graph(graph))

    def input_view(self, name: str, *, graph: str | None = None) -> Any:
        """Input ``name`` (of graph ``graph``) in the shared arena, writable: a numpy
        array (memoryview without numpy). Taking it counts as giving the input a value."""
        return self._state.input_view(name, self._graph(graph))

    def output_view(self, name: str, *, graph: str | None = None) -> Any:
        """Output ``name`` (of graph ``graph``) in the shared arena: the graph's next run
        overwrites it."""
        return self._state.output_view(name, self._graph(graph))

    def __repr__(self) -> str:
        return repr(self._state)

    # --- what the facades' waiting calls send --------------------------------------------

    def _graph(self, graph: str | None) -> int:
        """The index of graph ``graph`` (Unsupported before protocol version 5,
        InvalidTensorIndex for a name the model does not have)."""
        return requests.graph_of(self._client._core, self._state, graph)

    def _run_graph(self, graph: str | None, inputs: Mapping[str, TensorValue] | None) -> int:
        """The graph ``run`` runs: ``graph`` by name; without one, on a model loaded with
        several sizes of a dimension, the graph whose inputs take ``inputs``' shapes."""
        if graph is None:
            picked = pick_graph(self._state, inputs)
            if picked is not None:
                return picked
        return self._graph(graph)

    def _set_inputs(self, inputs: Mapping[str, TensorValue] | None, graph: int = 0) -> None:
        """``run``'s first step: each of ``inputs`` into the arena."""
        for name, value in (inputs or {}).items():
            self._state.set_input(name, value, graph)

    def _outputs(self, graph: int = 0) -> dict[str, Any]:
        """``run``'s last step: every output of the graph by name (copies)."""
        return self._state.all_outputs(graph)

    def _execute_call(
        self, timeout: float | None, deadline: float | None, graph: int = 0
    ) -> Call[None]:
        return requests.run_model(self._client._core, self._state, timeout, deadline, graph)

    def _info_call(self) -> Call[ModelInfo]:
        return requests.model_info(self._state)

    def _unload_call(self) -> Call[None] | None:
        """The unload request, or None when there is nothing to unload (it is gone)."""
        if self._state.unloaded:
            return None
        return requests.unload_model(self._client._core, self._state)
