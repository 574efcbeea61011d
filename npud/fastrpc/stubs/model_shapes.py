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
    budget: onnx_proto.Budget | None = None,
) -> list[onnx_proto.GraphTensor]:
    """Raise ShapeError unless the model's inputs, with ``given``, have every dimension
    fixed; the outputs left for the DSP to infer (a dimension these rules leave free).
    A model that declares no shapes at all is left to the runtime. ``budget`` bounds
    the walk's time (onnx_proto.CheckTimeoutError)."""
    tensors = onnx_proto.graph_io(source, budget)
    declared = [t for t in tensors if t.dims is not None]
    names = {t.name for t in tensors}
    unknown = sorted(set(given) - names)
    if unknown:
        known = ", ".join(repr(n) for n in sorted(names)) or "none"
        raise ShapeError(
            "mismatch", f"the model has no tensor {unknown[0]!r} (its tensors: {known})"
        )
    bound = _bind(declared, given)
    resolved = [_resolve(t, given, bound) for t in declared]
    inputs = [r for r in resolved if r.tensor.kind == "input"]
    free = [r for r in inputs if None in r.dims]
    if free:
        raise ShapeError("free", _free_message(free, inputs))
    unshaped = [t for t in tensors if t.kind == "output" and t.dims is None and t.name not in given]
    return [r.tensor for r in resolved if r.tensor.kind == "output" and None in r.dims] + unshaped


def unsized_outputs_refusal(outputs: Sequence[onnx_proto.GraphTensor]) -> str:
    """What a client is told when the DSP could not size ``outputs`` (left to inference)."""
    names = _join([repr(t.name) for t in outputs])
    which = (
        f"output {names} has a dimension that does not"
        if len(outputs) == 1
        else f"outputs {names} have dimensions that may not"
    )
    example = ", ".join(f"{t.name!r}: [{_dims(t, ', ')}]" for t in outputs)
    flags = " ".join(f"--shape {t.name}={_dims(t, ',')}" for t in outputs)
    it, its = ("it", "its whole shape") if len(outputs) == 1 else ("them", "their whole shapes")
    return (
        f"{which} follow from the input shapes given (the model leaves {it} free and shape"
        f" inference cannot size {it}): give {its} at load, with N the sizes your"
        f" data produces: shapes={{{example}}} (npuctl run {flags})"
    )


def _dims(tensor: onnx_proto.GraphTensor, separator: str) -> str:
    if tensor.dims is None:  # the model does not even say its rank
        return separator.join(["D0", "D1", "..."])
    return separator.join(str(d) if isinstance(d, int) and d > 0 else "N" for d in tensor.dims)


def _bind(
    declared: list[onnx_proto.GraphTensor], given: Mapping[str, Sequence[int]]
) -> dict[str, int]:
    """Check each given shape against its tensor; what it says of named dimensions."""
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
            if isinstance(want, int) and want != have:
                raise ShapeError(
                    "mismatch",
                    f"{tensor.kind} {tensor.name!r} dimension {axis} is {want};"
                    f" the shape given says {have}",
                )
            if isinstance(want, str) and bound.setdefault(want, have) != have:
                raise ShapeError(
                    "mismatch",
                    f"dimension {want!r} is given as {bound[want]} and as {have}"
                    f" ({tensor.kind} {tensor.name!r} dimension {axis})",
                )
    return bound


def _resolve(
    tensor: onnx_proto.GraphTensor, given: Mapping[str, Sequence[int]], bound: dict[str, int]
) -> _Resolved:
    assert tensor.dims is not None
    if tensor.name in given:
        return _Resolved(tensor, tuple(given[tensor.name]))
    dims = tuple(
        dim
        if isinstance(dim, int) and dim > 0
        else bound.get(dim)
        if isinstance(dim, str)
        else None
        for dim in tensor.dims
    )
    return _Resolved(tensor, dims)


def _free_message(free: list[_Resolved], resolved: list[_Resolved]) -> str:
    first = free[0]
    axes = [axis for axis, size in enumerate(first.dims) if size is None]
    what = f"dimension {axes[0]} is" if len(axes) == 1 else f"dimensions {_join(axes)} are"
    named = first.tensor.dims[axes[0]] if first.tensor.dims else None
    label = f" ({named!r})" if isinstance(named, str) else ""
    others = [r.tensor.name for r in free[1:]]
    verb = "has free dimensions" if len(others) == 1 else "have free dimensions"
    also = f"; {_join([repr(n) for n in others])} {verb} too" if others else ""
    example = ", ".join(f"{r.tensor.name!r}: {_placeholder(r.dims)}" for r in free)
    flags = " ".join(
        f"--shape {r.tensor.name}={','.join('N' if d is None else str(d) for d in r.dims)}"
        for r in free
    )
    sizes = ", ".join(f"{r.tensor.name} {_show(r.dims)}" for r in resolved if r not in free)
    known = f" (fixed already: {sizes})" if sizes else ""
    return (
        f"{first.tensor.kind} {first.tensor.name!r} {what} free{label}{also}: give each"
        f" tensor's whole shape at load, with N the sizes for your data: shapes={{{example}}}"
        f" (npuctl run {flags}){known}; output shapes follow from the inputs'"
    )


def _placeholder(dims: tuple[int | None, ...]) -> str:
    return "[" + ", ".join("N" if d is None else str(d) for d in dims) + "]"


def _show(dims: Sequence[onnx_proto.Dim]) -> str:
    return "[" + ", ".join("?" if d is None else str(d) for d in dims) + "]"


def _join(items: Sequence[object]) -> str:
    texts = [str(item) for item in items]
    return texts[0] if len(texts) == 1 else ", ".join(texts[:-1]) + " and " + texts[-1]
