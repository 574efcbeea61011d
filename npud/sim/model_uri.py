"""A portal_qnn model URI: the file name and what its query asks of the load
(``shape.``, ``value.`` and ``sizes.`` items; see npud.sim.portal_qnn)."""

from __future__ import annotations

import dataclasses
import urllib.parse
from collections.abc import Mapping

import numpy as np

from npud.formats.onnx_values import Constant
from npud.sim.qnn_limits import MAX_GRAPHS, SHAPE_PREFIX, SIZES_PREFIX, VALUE_DTYPES, VALUE_PREFIX


@dataclasses.dataclass(frozen=True)
class ModelQuery:
    """What a model URI's query asks of the load."""

    shapes: dict[str, tuple[int, ...]] = dataclasses.field(default_factory=dict)
    constants: dict[str, Constant] = dataclasses.field(default_factory=dict)
    sizes: dict[str, tuple[tuple[int, ...], ...]] = dataclasses.field(default_factory=dict)
    """Inputs' several whole shapes: graph i of the model takes the i-th of each."""


def parse_model_uri(uri: str) -> tuple[str, ModelQuery]:
    """The file name and what the query asks; ValueError when malformed."""
    name, _, query = uri.partition("?")
    if not name:
        raise ValueError("no file name")
    asked = ModelQuery()
    if query:
        for item in query.split("&"):
            key, equals, value = item.partition("=")
            prefixes = (SHAPE_PREFIX, VALUE_PREFIX, SIZES_PREFIX)
            prefix = next((p for p in prefixes if key.startswith(p)), None)
            if not equals or prefix is None:
                raise ValueError(
                    f"query item {item!r} is not shape.<name>=<dims>,"
                    " value.<name>=<dtype>:<dims>:<values> or sizes.<name>=<dims>;<dims>..."
                )
            tensor = urllib.parse.unquote(key[len(prefix) :], errors="strict")
            tables: dict[str, Mapping[str, object]] = {
                SHAPE_PREFIX: asked.shapes,
                VALUE_PREFIX: asked.constants,
                SIZES_PREFIX: asked.sizes,
            }
            taken = tables[prefix]
            if not tensor or tensor in taken:
                raise ValueError(f"{prefix[:-1]} for {tensor!r} is empty or given twice")
            if prefix == VALUE_PREFIX:
                asked.constants[tensor] = _parse_value(tensor, value)
            elif prefix == SIZES_PREFIX:
                asked.sizes[tensor] = tuple(_parse_dims(tensor, part) for part in value.split(";"))
            else:
                asked.shapes[tensor] = _parse_dims(tensor, value)
    counts = {len(shapes) for shapes in asked.sizes.values()}
    if len(counts) > 1 or any(not 1 <= n <= MAX_GRAPHS for n in counts):
        raise ValueError(f"sizes give 1..{MAX_GRAPHS} shapes, as many for every tensor")
    if set(asked.sizes) & set(asked.shapes):
        raise ValueError("a tensor has both a shape and sizes")
    return name, asked


def _parse_dims(tensor: str, text: str) -> tuple[int, ...]:
    dims = tuple(int(d) for d in text.split(",")) if text else ()
    if any(d <= 0 for d in dims):
        raise ValueError(f"shape of {tensor!r} has a dimension below 1")
    return dims


def _parse_value(tensor: str, text: str) -> Constant:
    """``<dtype>:<d0>,<d1>...:<v0>,<v1>...`` (no dims: a scalar)."""
    parts = text.split(":")
    if len(parts) != 3 or parts[0] not in VALUE_DTYPES or not parts[2]:
        raise ValueError(f"value of {tensor!r} is not <dtype>:<dims>:<values>")
    dtype, dims_text, values_text = parts
    dims = tuple(int(d) for d in dims_text.split(",")) if dims_text else ()
    if any(d <= 0 for d in dims):
        raise ValueError(f"value of {tensor!r} has a dimension below 1")
    parse = float if dtype.startswith("float") else int
    values = tuple(parse(v) for v in values_text.split(","))
    if len(values) != int(np.prod(dims, dtype=np.int64)):
        raise ValueError(f"value of {tensor!r} has {len(values)} values for shape {list(dims)}")
    return Constant(dtype, dims, values)
