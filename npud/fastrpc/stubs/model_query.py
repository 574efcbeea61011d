"""A model URI's query as portal_qnn's model_load takes it: the shapes, constant
values and sizes asked of the load (``shape.``, ``value.``, ``sizes.`` items)."""

from __future__ import annotations

import urllib.parse
from collections.abc import Mapping, Sequence

from npud.fastrpc.stubs.model_errors import ModelError, ModelFailure
from npud.fastrpc.stubs.portal_limits import MAX_GRAPHS, MAX_RANK, MAX_URI_BYTES
from npud.formats.onnx_values import DTYPES as CONSTANT_DTYPES
from npud.formats.onnx_values import Constant


def model_uri_query(
    shapes: Mapping[str, Sequence[int]],
    constants: Mapping[str, Constant] | None = None,
    sizes: Mapping[str, Sequence[Sequence[int]]] | None = None,
) -> str:
    """The query that fixes free dimensions and inputs' values (the emulator's
    npud/sim/model_uri.py reads it): ``shape.<name>=<dims>`` and
    ``value.<name>=<dtype>:<dims>:<values>``."""
    items = []
    for name, dims in shapes.items():
        if not isinstance(name, str) or not name:
            raise ModelError(ModelFailure.TENSOR_MISMATCH, f"shape for {name!r}: not a name")
        if len(dims) > MAX_RANK or not all(
            isinstance(d, int) and not isinstance(d, bool) and 0 < d < 1 << 32 for d in dims
        ):
            raise ModelError(
                ModelFailure.TENSOR_MISMATCH,
                f"shape of {name!r} must be at most {MAX_RANK} dimensions, each 1..2^32-1",
            )
        encoded = urllib.parse.quote(name, safe="")
        items.append(f"shape.{encoded}={','.join(str(d) for d in dims)}")
    for name, variants in (sizes or {}).items():
        encoded = urllib.parse.quote(name, safe="")
        items.append(f"sizes.{encoded}=" + ";".join(",".join(map(str, s)) for s in variants))
    for name, constant in (constants or {}).items():
        items.append(f"value.{urllib.parse.quote(name, safe='')}={_constant_text(name, constant)}")
    return "?" + "&".join(items) if items else ""


def check_uri_length(uri: str) -> None:
    """ModelError unless ``uri`` (with its NUL) fits model_load's model_uri."""
    if len(uri.encode("utf-8")) + 1 > MAX_URI_BYTES:
        raise ModelError(
            ModelFailure.TENSOR_MISMATCH,
            f"the shapes and values make the model URI {len(uri)} bytes; at most"
            f" {MAX_URI_BYTES - 1}",
        )


def check_sizes(
    sizes: Mapping[str, Sequence[Sequence[int]]], shapes: Mapping[str, Sequence[int]]
) -> dict[str, tuple[tuple[int, ...], ...]]:
    """``sizes`` as the URI carries them; ModelError when they cannot make graphs."""
    checked = {name: tuple(tuple(s) for s in variants) for name, variants in sizes.items()}
    counts = {len(variants) for variants in checked.values()}
    if len(counts) > 1 or any(not 1 <= n <= MAX_GRAPHS for n in counts):
        raise ModelError(
            ModelFailure.TENSOR_MISMATCH,
            f"sizes: 1..{MAX_GRAPHS} shapes per tensor (a model holds at most {MAX_GRAPHS}"
            f" graphs), as many for every tensor; got {sorted(counts)}",
        )
    both = sorted(set(checked) & set(shapes))
    if both:
        raise ModelError(
            ModelFailure.TENSOR_MISMATCH, f"{both[0]!r} is given both a shape and sizes"
        )
    for name, variants in checked.items():
        if len(set(variants)) != len(variants):
            raise ModelError(ModelFailure.TENSOR_MISMATCH, f"sizes of {name!r} repeat a shape")
    return checked


def _constant_text(name: str, constant: Constant) -> str:
    """``<dtype>:<dims>:<values>``; ModelError when the value is not one."""
    if not isinstance(name, str) or not name:
        raise ModelError(ModelFailure.TENSOR_MISMATCH, f"value for {name!r}: not a name")
    count = 1
    for size in constant.shape:
        count *= size
    kinds = {"b": (int,), "f": (int, float)}.get(constant.dtype[:1], (int,))
    if (
        constant.dtype not in CONSTANT_DTYPES
        or len(constant.shape) > MAX_RANK
        or count != len(constant.values)
        or not all(isinstance(v, kinds) and not isinstance(v, bool) for v in constant.values)
        or (constant.dtype == "bool" and not all(v in (0, 1) for v in constant.values))
    ):
        raise ModelError(
            ModelFailure.TENSOR_MISMATCH,
            f"value of {name!r}: {len(constant.values)} {constant.dtype} values for shape"
            f" {list(constant.shape)} (one per element of the shape, of an integer, float32,"
            " float64 or bool type)",
        )
    dims = ",".join(str(d) for d in constant.shape)
    return f"{constant.dtype}:{dims}:{','.join(repr(v) for v in constant.values)}"
