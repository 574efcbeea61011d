"""Every walk npud makes of a model file before it reaches the DSP, in one function.

:func:`walk_model_file` checks the file's kind and contents
(:func:`npud.fastrpc.stubs.model_format.check_model_file`) and, for ONNX, the shapes a
load gives (:mod:`npud.fastrpc.stubs.model_shapes`), within one
:class:`~npud.formats.onnx_proto.Budget`. It raises what the walks raise
(ModelFileError, ShapeError, DamagedError, CheckTimeoutError, LimitError, OSError);
:meth:`npud.fastrpc.stubs.portal_qnn.PortalQnn.check` turns them into ModelErrors.
The module imports little, so that npud.model_check's child process starts fast.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from npud.fastrpc.stubs.model_format import ModelFormat, Sniffed, check_model_file, members
from npud.fastrpc.stubs.model_shapes import ShapeError, check_shapes
from npud.formats import onnx_proto


def walk_model_file(
    fd: int,
    backend: str,
    shapes: Mapping[str, Sequence[int]],
    budget: onnx_proto.Budget | None = None,
) -> tuple[Sniffed, list[onnx_proto.GraphTensor]]:
    """The file on ``fd`` (borrowed) and the outputs left for the DSP to size."""
    sniffed = check_model_file(fd, backend, budget)
    if sniffed.format is not ModelFormat.ONNX:
        return sniffed, []
    graphs = members(fd, sniffed.size, budget)
    if len(graphs) == 1:
        return sniffed, check_shapes(graphs[0], shapes, budget)
    return sniffed, _pack_shapes(graphs, shapes, budget)


def _pack_shapes(
    graphs: Sequence[onnx_proto.Source],
    shapes: Mapping[str, Sequence[int]],
    budget: onnx_proto.Budget | None,
) -> list[onnx_proto.GraphTensor]:
    """check_shapes for each graph of a graph pack, with the shapes of the tensors that
    graph has (a shape applies to every graph with a tensor of its name)."""
    names = [{t.name for t in onnx_proto.graph_io(graph, budget)} for graph in graphs]
    known = set().union(*names)
    unknown = sorted(set(shapes) - known)
    if unknown:
        listed = ", ".join(repr(n) for n in sorted(known)) or "none"
        raise ShapeError(
            "mismatch", f"no graph of the model has a tensor {unknown[0]!r} (its tensors: {listed})"
        )
    unsized: list[onnx_proto.GraphTensor] = []
    for graph, has in zip(graphs, names, strict=True):
        unsized += check_shapes(graph, {k: v for k, v in shapes.items() if k in has}, budget)
    return unsized
