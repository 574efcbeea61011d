"""An ONNX model's tensor shapes with the ones its client gave, checked before the DSP.

The emulated DSP fixes an ONNX model's free dimensions from the shapes in its model
URI, and refuses a model with one left free; but what it says goes to the DSP's log,
and a client sees one generic code. The same check, done here on the model's own
declarations (:func:`npud.formats.onnx_proto.graph_io`), lets the refusal say which
tensor, which dimension, and what to give, in the terms a client uses: ``shapes=``
in the client libraries, ``--shape`` in ``npuctl run``.

Every input must be sized here: a dimension is known when the model fixes it, when
the client gives it, or when it is a named dimension (``dim_param``) that a given
shape binds. Outputs need not be: what these rules leave free of an output, the
emulated DSP infers from the inputs' shapes (onnxruntime's shape inference, see
:mod:`npud.sim.portal_qnn`); :func:`check_shapes` returns those outputs, so that a
DSP refusal can name them (:func:`unsized_outputs_refusal`). A QNN model library
(the device) has fixed shapes; this is for ONNX models only.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Literal

from npud.formats import onnx_proto

ShapeFailure = Literal["mismatch", "free"]


class ShapeError(ValueError):
    """``mismatch``: a given shape that does not fit the model; ``free``: a dimension
    nothing fixes. The message says which and what to give."""

    def __init__(self, kind: ShapeFailure, message: str) -> None:
        super().__init__(message)
        self.kind = kind


@dataclasses.dataclass(frozen=True)
class _Resolved:
    tensor: onnx_proto.GraphTensor
    dims: tuple[int | None, ...]


def check_shapes(
    source: onnx_proto.Source,
    given: Mapping[str, Sequence[int]],
    constants: Mapping[str, Sequence[int]] | None = None,
    budget: onnx_proto.Budget | None = None,
) -> list[onnx_proto.GraphTensor]:
    """Raise ShapeError unless the model's inputs, with ``given``, have every dimension
    fixed; the outputs left for the DSP to infer (a dimension these rules leave free),
    each with the dimensions these rules do fix filled in. ``constants`` are the shapes
    of the values inputs are fixed to (they size those inputs, as a given shape does).
    A model that declares no shapes at all is left to the runtime. ``budget`` bounds
    the walk's time (onnx_proto.CheckTimeoutError)."""
    return check_tensors(onnx_proto.graph_io(source, budget), given, constants)


def check_tensors(
    tensors: Sequence[onnx_proto.GraphTensor],
    given: Mapping[str, Sequence[int]],
    constants: Mapping[str, Sequence[int]] | None = None,
) -> list[onnx_proto.GraphTensor]:
    """:func:`check_shapes` on a graph's inputs and outputs already read (graph_io): a
    load of several sizes checks each on one walk of the file."""
    declared = [t for t in tensors if t.dims is not None]
    names = {t.name for t in tensors}
    unknown = sorted(set(given) - names)
    if unknown:
        known = ", ".join(repr(n) for n in sorted(names)) or "none"
        raise ShapeError(
            "mismatch", f"the model has no tensor {unknown[0]!r} (its tensors: {known})"
        )
    given = _with_constants(tensors, given, constants or {})
    bound = _bind(declared, given)
    resolved = [_resolve(t, given, bound) for t in declared]
    inputs = [r for r in resolved if r.tensor.kind == "input"]
    free = [r for r in inputs if None in r.dims]
    if free:
        outputs = [r for r in resolved if r.tensor.kind == "output"]
        raise ShapeError("free", _free_message(free, inputs, outputs))
    unshaped = [t for t in tensors if t.kind == "output" and t.dims is None and t.name not in given]
    return [_filled(r) for r in resolved if r.tensor.kind == "output" and None in r.dims] + unshaped


def _with_constants(
    tensors: Sequence[onnx_proto.GraphTensor],
    given: Mapping[str, Sequence[int]],
    constants: Mapping[str, Sequence[int]],
) -> Mapping[str, Sequence[int]]:
    """``given`` with the shapes of the values inputs are fixed to; ShapeError for a value
    of no input, or one whose shape disagrees with a shape given for the same input."""
    inputs = [t.name for t in tensors if t.kind == "input"]
    merged = dict(given)
    for name, shape in constants.items():
        if name not in inputs:
            listed = ", ".join(repr(n) for n in inputs) or "none"
            raise ShapeError(
                "mismatch", f"the model has no input {name!r} to fix (its inputs: {listed})"
            )
        if name in given and tuple(given[name]) != tuple(shape):
            raise ShapeError(
                "mismatch",
                f"input {name!r} is given the shape {list(given[name])} and a value of shape"
                f" {list(shape)}",
            )
        merged[name] = shape
    return merged


def rooms(
    tensors: Sequence[onnx_proto.GraphTensor], given: Mapping[str, Sequence[int]]
) -> frozenset[str]:
    """The outputs whose given shape is a room, not their shape: the model leaves a
    dimension of theirs free that no input names, so the data decides their size (a
    TTS voice's audio) and a run may fill less than the shape given. ``tensors``: the
    graph's inputs and outputs (onnx_proto.graph_io)."""
    named = {
        name
        for t in tensors
        if t.kind == "input"
        for name in (onnx_proto.dim_name(d) for d in t.dims or ())
        if name is not None
    }
    return frozenset(
        t.name
        for t in tensors
        if t.kind == "output"
        and t.name in given
        and (
            t.dims is None
            or any(
                not (isinstance(d, int) and d > 0) and onnx_proto.dim_name(d) not in named
                for d in t.dims
            )
        )
    )


def unsized_outputs_refusal(outputs: Sequence[onnx_proto.GraphTensor]) -> str:
    """What a client is told when the DSP could not size ``outputs`` (left to inference)."""
    described = [_free_dims(t.name, t.dims) for t in outputs]
    if len(outputs) == 1:
        which = f"output {described[0]} {'does' if ' dimension ' in described[0] else 'do'} not"
    else:
        which = f"outputs {', '.join(described)} may not"
    example = ", ".join(f"{t.name!r}: [{_dims(t, ', ')}]" for t in outputs)
    flags = " ".join(f"--shape {t.name}={_dims(t, ',')}" for t in outputs)
    it, its = ("it", "its whole shape") if len(outputs) == 1 else ("them", "their whole shapes")
    return (
        f"{which} follow from the input shapes given (the model leaves {it} free and shape"
        f" inference cannot size {it}): give {its} at load, with N the sizes your"
        f" data produces: shapes={{{example}}} (npuctl run {flags}); where the data"
        f" decides a size, give the largest: a room, which each run fills in part and"
        f" reports the shape it produced"
    )


def _filled(resolved: _Resolved) -> onnx_proto.GraphTensor:
    """The tensor with the dimensions the rules fixed given their sizes (a named one
    that a given shape bound, in particular); the others as the model declares them."""
    assert resolved.tensor.dims is not None
    dims = tuple(
        size if size is not None else declared
        for size, declared in zip(resolved.dims, resolved.tensor.dims, strict=True)
    )
    return dataclasses.replace(resolved.tensor, dims=dims)


def _dims(tensor: onnx_proto.GraphTensor, separator: str) -> str:
    if tensor.dims is None:  # the model does not even say its rank
        return separator.join(["D0", "D1", "..."])
    return separator.join(str(d) if isinstance(d, int) and d > 0 else "N" for d in tensor.dims)


def _bind(
    declared: list[onnx_proto.GraphTensor], given: Mapping[str, Sequence[int]]
) -> dict[str, int]:
    """Check each given shape against its tensor; what it says of named dimensions
    (an empty or ``?`` dim_param names nothing: onnx_proto.dim_name)."""
    bound: dict[str, int] = {}
    for tensor in declared:
        if tensor.name not in given:
            continue
        assert tensor.dims is not None
        shape = list(given[tensor.name])
        if len(shape) != len(tensor.dims):
            raise ShapeError(
                "mismatch",
                f"{tensor.kind} {tensor.name!r} has {len(tensor.dims)} dimensions"
                f" {_show(tensor.dims)}; the shape given has {len(shape)}: {shape}",
            )
        for axis, (want, have) in enumerate(zip(tensor.dims, shape, strict=True)):
            if isinstance(want, int) and want > 0 and want != have:
                raise ShapeError(
                    "mismatch",
                    f"{tensor.kind} {tensor.name!r} dimension {axis} is {want};"
                    f" the shape given says {have}",
                )
            name = onnx_proto.dim_name(want)
            if name is not None and bound.setdefault(name, have) != have:
                raise ShapeError(
                    "mismatch",
                    f"dimension {name!r} is given as {bound[name]} and as {have}"
                    f" ({tensor.kind} {tensor.name!r} dimension {axis})",
                )
    return bound


def _resolve(
    tensor: onnx_proto.GraphTensor, given: Mapping[str, Sequence[int]], bound: dict[str, int]
) -> _Resolved:
    assert tensor.dims is not None
    if tensor.name in given:
        return _Resolved(tensor, tuple(given[tensor.name]))
    dims = tuple(_size(dim, bound) for dim in tensor.dims)
    return _Resolved(tensor, dims)


def _size(dim: onnx_proto.Dim, bound: Mapping[str, int]) -> int | None:
    if isinstance(dim, int):
        return dim if dim > 0 else None
    name = onnx_proto.dim_name(dim)
    return bound.get(name) if name is not None else None


def _free_dims(
    name: str,
    dims: Sequence[onnx_proto.Dim] | None,
    sizes: Sequence[int | None] | None = None,
) -> str:
    """``'x' dimensions 0 ('batch') and 2``: a tensor and every dimension of it left free
    (``sizes``: what the rules fixed; without it, the declared dimensions that are not
    positive sizes), each with its name where the model names it."""
    if dims is None:
        return repr(name)
    if sizes is None:
        sizes = [d if isinstance(d, int) and d > 0 else None for d in dims]
    axes = []
    for axis, (dim, size) in enumerate(zip(dims, sizes, strict=True)):
        if size is None:
            named = onnx_proto.dim_name(dim)
            axes.append(f"{axis} ({named!r})" if named is not None else str(axis))
    what = "dimension" if len(axes) == 1 else "dimensions"
    return f"{name!r} {what} {_join(axes)}"


def _free_message(free: list[_Resolved], inputs: list[_Resolved], outputs: list[_Resolved]) -> str:
    described = [_free_dims(r.tensor.name, r.tensor.dims, r.dims) for r in free]
    example = ", ".join(f"{r.tensor.name!r}: {_placeholder(r)}" for r in free)
    flags = " ".join(
        f"--shape {r.tensor.name}={_placeholder(r)[1:-1].replace(', ', ',')}" for r in free
    )
    named = any(
        onnx_proto.dim_name(dim) is not None
        for r in free
        for dim, size in zip(r.tensor.dims or (), r.dims, strict=False)
        if size is None
    )
    sizes = "your data's sizes for each name and N" if named else "N the sizes for your data"
    fixed = ", ".join(f"{r.tensor.name} {_show(r.dims)}" for r in inputs if r not in free)
    known = f" (fixed already: {fixed})" if fixed else ""
    return (
        f"{_several('input', described)} free: give each tensor's whole shape at load, with"
        f" {sizes}: shapes={{{example}}} (npuctl run {flags}){known};"
        f" {_outputs_clause(inputs, outputs)}"
    )


def _several(kind: str, described: Sequence[str]) -> str:
    """``input 'x' dimension 0 is`` / ``inputs 'a' dimension 0, 'b' dimensions 0 and 1 are``."""
    if len(described) == 1:
        verb = "is" if " dimension " in described[0] else "are"
        return f"{kind} {described[0]} {verb}"
    return f"{kind}s {', '.join(described)} are"


def _outputs_clause(inputs: list[_Resolved], outputs: list[_Resolved]) -> str:
    """What the outputs will need once the inputs are sized: nothing when every
    dimension of theirs is fixed or named in an input (the inputs' sizes fix them);
    otherwise which dimensions are left to shape inference, which may not size them."""
    names = {
        name
        for r in inputs
        for name in (onnx_proto.dim_name(d) for d in r.tensor.dims or ())
        if name is not None
    }
    left = []
    for r in outputs:
        assert r.tensor.dims is not None
        sizes = [
            size
            if size is not None or onnx_proto.dim_name(dim) not in names
            else 1  # an input's name: fixed once the inputs are
            for dim, size in zip(r.tensor.dims, r.dims, strict=True)
        ]
        if None in sizes:
            left.append(_free_dims(r.tensor.name, r.tensor.dims, sizes))
    if not left:
        return "output shapes follow from the inputs'"
    return (
        f"{_several('output', left)} not fixed by the inputs' shapes: shape inference sizes"
        " what follows from them; a size the data decides needs a room, the largest shape"
        " given at load"
    )


def _placeholder(resolved: _Resolved) -> str:
    """The shape to give: the sizes fixed, a named dimension's name, N for the others."""
    declared = resolved.tensor.dims or (None,) * len(resolved.dims)
    return (
        "["
        + ", ".join(
            str(size) if size is not None else onnx_proto.dim_name(dim) or "N"
            for size, dim in zip(resolved.dims, declared, strict=True)
        )
        + "]"
    )


def _show(dims: Sequence[onnx_proto.Dim]) -> str:
    return "[" + ", ".join("?" if d is None else str(d) for d in dims) + "]"


def _join(items: Sequence[object]) -> str:
    texts = [str(item) for item in items]
    return texts[0] if len(texts) == 1 else ", ".join(texts[:-1]) + " and " + texts[-1]
