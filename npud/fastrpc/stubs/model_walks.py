"""Every walk npud makes of a model file before it reaches the DSP, in one function.

:func:`walk_model_file` checks the file's kind and contents
(:func:`npud.fastrpc.stubs.model_format.check_model_file`) and, for ONNX, the shapes a
load gives (:mod:`npud.fastrpc.stubs.model_shapes`): those of each graph a load of
several sizes makes, with the shapes of the values inputs are fixed to, and which
outputs' given shapes are rooms; all within one :class:`~npud.formats.onnx_proto.Budget`.
It raises what the walks raise (ModelFileError, ShapeError, DamagedError,
CheckTimeoutError, LimitError, OSError);
:meth:`npud.fastrpc.stubs.portal_qnn.PortalQnn.check` turns them into ModelErrors.
The module imports little, so that npud.requests.model_check's child process starts fast.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence

from npud.fastrpc.stubs.model_format import ModelFormat, Sniffed, check_model_file, members
from npud.fastrpc.stubs.model_shapes import ShapeError, check_tensors, rooms
from npud.formats import onnx_proto


@dataclasses.dataclass(frozen=True)
class CheckedFile:
    """What the walks found: the file; the outputs left for the DSP to size (their
    shapes follow only from inference); and, for each graph the load makes in the
    DSP's order, the outputs whose given shape is a room (the data decides their size:
    a run reports the shape it produced)."""

    file: Sniffed
    unsized: tuple[onnx_proto.GraphTensor, ...] = ()
    rooms: tuple[frozenset[str], ...] = ()


Walks = Callable[
    [
        int,
        str,
        Mapping[str, Sequence[int]],
        "onnx_proto.Budget | None",
        Mapping[str, Sequence[int]],
        Mapping[str, Sequence[Sequence[int]]],
    ],
    CheckedFile,
]
"""What walks a model file (fd, backend, shapes, budget, the shapes of the constants'
values, sizes): walk_model_file's signature."""


def walk_model_file(
    fd: int,
    backend: str,
    shapes: Mapping[str, Sequence[int]],
    budget: onnx_proto.Budget | None = None,
    constants: Mapping[str, Sequence[int]] | None = None,
    sizes: Mapping[str, Sequence[Sequence[int]]] | None = None,
) -> CheckedFile:
    """The file on ``fd`` (borrowed), checked with ``shapes``, the shapes of the values
    ``constants`` fixes inputs to, and ``sizes`` (several whole shapes of inputs: one
    graph per shape, graph i taking the i-th of each)."""
    sniffed = check_model_file(fd, backend, budget)
    if sniffed.format is not ModelFormat.ONNX:
        return CheckedFile(sniffed)
    graphs = members(fd, sniffed.size, budget)
    tensors = [onnx_proto.graph_io(graph, budget) for graph in graphs]  # one walk each
    unsized: list[onnx_proto.GraphTensor] = []
    roomy: list[frozenset[str]] = []
    for variant in variants(shapes, sizes or {}):
        unsized += _graph_shapes(tensors, variant, constants or {})
        roomy += [rooms(graph, variant) for graph in tensors]
    return CheckedFile(sniffed, tuple(unsized), tuple(roomy))


def variants(
    shapes: Mapping[str, Sequence[int]], sizes: Mapping[str, Sequence[Sequence[int]]]
) -> list[dict[str, Sequence[int]]]:
    """The shapes of each graph a load with ``sizes`` makes (one: ``shapes`` alone)."""
    if not sizes:
        return [dict(shapes)]
    count = len(next(iter(sizes.values())))
    return [{**shapes, **{n: v[i] for n, v in sizes.items()}} for i in range(count)]


def _graph_shapes(
    graphs: Sequence[Sequence[onnx_proto.GraphTensor]],
    shapes: Mapping[str, Sequence[int]],
    constants: Mapping[str, Sequence[int]],
) -> list[onnx_proto.GraphTensor]:
    """check_tensors for each graph of the model (a graph pack's several), with the
    shapes and values of the tensors that graph has (a shape applies to every graph with
    a tensor of its name)."""
    if len(graphs) == 1:
        return check_tensors(graphs[0], shapes, constants)
    names = [{t.name for t in graph} for graph in graphs]
    known = set().union(*names)
    unknown = sorted((set(shapes) | set(constants)) - known)
    if unknown:
        listed = ", ".join(repr(n) for n in sorted(known)) or "none"
        raise ShapeError(
            "mismatch", f"no graph of the model has a tensor {unknown[0]!r} (its tensors: {listed})"
        )
    unsized: list[onnx_proto.GraphTensor] = []
    for graph, has in zip(graphs, names, strict=True):
        unsized += check_tensors(
            graph,
            {k: v for k, v in shapes.items() if k in has},
            {k: v for k, v in constants.items() if k in has},
        )
    return unsized
