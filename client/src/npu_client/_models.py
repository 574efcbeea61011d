"""A model loaded in npud, as this process sees it: its tensors and its mapped arena.

npud allocates one DMA-BUF per model, the *arena*, holding every input and
every output at the offsets the load reply gives (PROTOCOL.md section 7.9).
:class:`ModelState` maps it once and does everything that needs no request:
writing inputs in place, reading outputs in place, the checks of dtype,
shape and size, and knowing which inputs have a value and whether the outputs
are from a successful run. The blocking ``Model`` and the trio ``TrioModel``
add the requests (run, info, unload) on top, so a run sends only its
fixed-size request.

numpy is optional (the ``numpy`` extra): with it, inputs may be arrays (or
anything ``numpy.asarray`` takes) and outputs come back as arrays; without
it, inputs are bytes-like objects of exactly the tensor's size and outputs
come back as ``bytes``; :attr:`ModelState.inputs` / ``outputs`` give the
name, dtype, shape and offset of each.
"""

from __future__ import annotations

import contextlib
import functools
import mmap
import os
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import IO, TYPE_CHECKING, Any, Final

from npu_client._errors import (
    InputNotSet,
    InvalidTensorIndex,
    ModelNotLoaded,
    NoOutputs,
    TensorMismatch,
    code_message,
)
from npu_client._memory import _map_shared
from npu_client.transport import OwnedFd
from npu_protocol import (
    ErrorCode,
    GraphInfo,
    ModelConstant,
    ModelInfo,
    TensorInfo,
    format_message,
)

if TYPE_CHECKING:
    from types import ModuleType


@functools.cache
def numpy_module() -> ModuleType | None:
    """numpy, imported on first use; None without the numpy extra (bytes in, bytes out).

    Not at import: npud imports this package for its transport and never runs a
    model on the client side, and numpy would cost it ~40 ms of start and ~10 MiB.
    """
    try:
        import numpy  # noqa: PLC0415
    except ImportError:
        return None
    return numpy


ModelSource = str | os.PathLike[str] | IO[bytes] | int
"""What ``load_model`` takes: a path, an open binary file, or an fd (each stays the caller's)."""
TensorValue = Any
"""An input's value: a numpy array (or what ``numpy.asarray`` takes), or bytes-like."""


@contextmanager
def model_file(source: object) -> Iterator[tuple[int, str]]:
    """The fd to send for ``source`` and the name to show. A path is opened here, with
    this process's permissions (and closed when the block ends); a file object's or
    an int's fd stays the caller's."""
    if isinstance(source, str | os.PathLike):
        path = os.fspath(source)
        fd = OwnedFd(os.open(path, os.O_RDONLY | os.O_CLOEXEC))
        with fd:
            yield fd.fileno(), os.path.basename(path)[:1024]
        return
    if isinstance(source, int) and not isinstance(source, bool):
        yield source, f"fd {source}"
        return
    fileno = getattr(source, "fileno", None)
    if fileno is None:
        raise TypeError(
            f"load_model takes a path, an open binary file or an fd, not {type(source).__name__}"
        )
    name = getattr(source, "name", "")
    yield fileno(), os.path.basename(name)[:1024] if isinstance(name, str) else ""


MAX_GRAPHS: Final = 8
"""Graphs a model holds at most: sizes asked of a dimension make one each."""


def check_shapes(shapes: object) -> dict[str, tuple[int, ...]]:
    """``shapes`` (tensor name -> dimensions) as the request carries them; a dimension
    given as several sizes is :func:`split_shapes`'s."""
    fixed, sizes = split_shapes(shapes)
    if sizes:
        raise ValueError("shapes: several sizes of a dimension need a load (load_model)")
    return fixed


def split_shapes(
    shapes: object,
) -> tuple[dict[str, tuple[int, ...]], dict[str, tuple[tuple[int, ...], ...]]]:
    """``shapes`` as the request carries them: the whole shapes, and the tensors with a
    dimension given as several sizes (a list, tuple or range of them: ``(1, [1, 2, 4])``)
    as their shapes, one per size, each making a graph of the model. Several tensors
    with sizes must have as many (graph i takes the i-th of each); at most 8."""
    if shapes is None:
        return {}, {}
    if not isinstance(shapes, Mapping):
        raise TypeError("shapes must map tensor names to dimensions")
    checked: dict[str, tuple[int, ...]] = {}
    sizes: dict[str, tuple[tuple[int, ...], ...]] = {}
    for name, given in shapes.items():
        if not isinstance(name, str):
            raise TypeError(f"shapes: tensor names are str, not {type(name).__name__}")
        dims = tuple(given)
        choices = [tuple(d) if isinstance(d, list | tuple | range) else (d,) for d in dims]
        flat = [d for choice in choices for d in choice]
        if not all(isinstance(d, int) and not isinstance(d, bool) and d >= 1 for d in flat) or (
            not all(choices)
        ):
            raise ValueError(f"shapes: {name!r} needs positive integer dimensions, got {dims}")
        varied = [
            axis
            for axis, choice in enumerate(choices)
            if len(choice) > 1 or (isinstance(dims[axis], list | tuple | range))
        ]
        if not varied:
            checked[name] = tuple(flat)
            continue
        if len(varied) > 1:
            raise ValueError(f"shapes: {name!r} gives several sizes in more than one dimension")
        axis = varied[0]
        sizes[name] = tuple(
            tuple(size if i == axis else choices[i][0] for i in range(len(dims)))
            for size in choices[axis]
        )
    counts = {len(variants) for variants in sizes.values()}
    if len(counts) > 1 or any(n > MAX_GRAPHS for n in counts):
        raise ValueError(
            f"shapes: several sizes make a graph each, at most {MAX_GRAPHS}, and as many for"
            f" every tensor given them; got {sorted(counts)}"
        )
    return checked, sizes


MAX_CONSTANT_VALUES: Final = 256
_CONSTANT_DTYPES: Final = frozenset(
    {"bool", "float32", "float64"}
    | {f"{sign}int{bits}" for sign in ("", "u") for bits in (8, 16, 32, 64)}
)


def check_constants(constants: object) -> dict[str, ModelConstant]:
    """``constants`` (input name -> value) as the request carries them: a bool, int or
    float, a (nested) sequence of them, or a numpy array or scalar; at most 256 values
    each. Python ints travel as int64, floats as float64 (npud converts them to the
    input's own type within their kind)."""
    if constants is None:
        return {}
    if not isinstance(constants, Mapping):
        raise TypeError("constants must map input names to values")
    checked: dict[str, ModelConstant] = {}
    for name, value in constants.items():
        if not isinstance(name, str) or not name:
            raise TypeError(f"constants: input names are non-empty str, not {name!r}")
        dtype, shape, values = _constant_values(name, value)
        if not values or len(values) > MAX_CONSTANT_VALUES:
            raise ValueError(
                f"constants: {name!r} has {len(values)} values (1..{MAX_CONSTANT_VALUES}:"
                " a value the model's shapes hang on, not data)"
            )
        checked[name] = ModelConstant(dtype=dtype, shape=shape, values=values)
    return checked


def _constant_values(
    name: str, value: object
) -> tuple[str, tuple[int, ...], tuple[int | float, ...]]:
    numpy = numpy_module()
    if numpy is not None and not isinstance(value, str | bytes):
        array = numpy.asarray(value)
        if array.dtype == numpy.float16:
            array = array.astype(numpy.float32)
        if array.dtype.name not in _CONSTANT_DTYPES:
            raise TypeError(
                f"constants: {name!r} is {array.dtype} (integers, floats or bools are taken)"
            )
        flat = array.reshape(-1).tolist()
        values = tuple(int(v) if isinstance(v, bool) else v for v in flat)
        return array.dtype.name, tuple(int(d) for d in array.shape), values
    items: list[object] = list(value) if isinstance(value, list | tuple) else [value]
    bools = [v for v in items if isinstance(v, bool)]
    ints = [v for v in items if isinstance(v, int) and not isinstance(v, bool)]
    numbers = [v for v in items if isinstance(v, int | float) and not isinstance(v, bool)]
    if len(bools) == len(items):
        return "bool", _shape_of(value), tuple(int(v) for v in bools)
    if len(ints) == len(items):
        return "int64", _shape_of(value), tuple(ints)
    if len(numbers) == len(items):
        return "float64", _shape_of(value), tuple(float(v) for v in numbers)
    raise TypeError(
        f"constants: {name!r} must be a bool, int, float or a flat sequence of them"
        " (nested ones and arrays need numpy)"
    )


def _shape_of(value: object) -> tuple[int, ...]:
    return (len(value),) if isinstance(value, list | tuple) else ()


def pick_graph(state: ModelState, inputs: Mapping[str, object] | None) -> int | None:
    """The graph of a model loaded with several sizes whose inputs take ``inputs``'
    shapes (the first such), or None when the model was not (TensorMismatch when no
    graph takes them)."""
    if not state.sized or not inputs:
        return None
    numpy = numpy_module()

    def shape_of(value: object) -> tuple[int, ...] | int:
        if numpy is not None:
            return tuple(int(d) for d in numpy.shape(value))
        if isinstance(value, bytes | bytearray | memoryview):
            return memoryview(value).nbytes  # without numpy: bytes of exactly the size
        return -1

    given = {name: shape_of(value) for name, value in inputs.items()}
    for index, graph in enumerate(state.graphs):
        specs = {spec.name: spec for spec in graph.inputs}
        if all(
            name in specs
            and (
                shape == tuple(specs[name].shape)
                if isinstance(shape, tuple)
                else shape == specs[name].nbytes
            )
            for name, shape in given.items()
        ):
            return index
    sized = sorted({name for name in given if name in state.sized})
    taken = "; ".join(
        f"{name}: "
        + ", ".join(
            str(list(spec.shape))
            for graph in state.graphs
            for spec in graph.inputs
            if spec.name == name
        )
        for name in sized
    )
    shown = ", ".join(
        f"{n} {list(s)}" if isinstance(s, tuple) else f"{n} of {s} bytes" for n, s in given.items()
    )
    detail = (
        f"no graph of model {state.id} takes these inputs' shapes ({shown});"
        f" its graphs take {taken or 'others'}: pad the data to the next size loaded"
    )
    return _raise_mismatch(detail)


def _raise_mismatch(detail: str) -> int:
    raise TensorMismatch(
        format_message(ErrorCode.TENSOR_MISMATCH, detail=detail), fields={"detail": detail}
    )


def ignored_sizes(state: ModelState, sizes: Mapping[str, tuple[tuple[int, ...], ...]]) -> bool:
    """An npud that predates several sizes ignored them: the model has fewer graphs."""
    count = len(next(iter(sizes.values()))) if sizes else 0
    return count > len(state.graphs)


def ignored_constants(state: ModelState, constants: Mapping[str, object]) -> list[str]:
    """The inputs ``constants`` fixed that the loaded model still has: an npud that
    predates constants ignored them (a load that fixes one takes the input away)."""
    kept = {spec.name for graph in state.graphs for spec in graph.inputs}
    return sorted(name for name in constants if name in kept)


class ModelState:
    """One loaded model's id, tensors and arena mapping; owns the arena's fd."""

    def __init__(self, model_id: int, info: ModelInfo, fd: OwnedFd, epoch: int) -> None:
        """Takes ownership of ``fd`` (closed here if it cannot be mapped)."""
        try:
            memory = _map_shared(fd.fileno(), info.arena_bytes)
        except BaseException:
            fd.close()
            raise
        self.id = model_id
        self.info = info
        self.epoch = epoch
        self._fd = fd
        self._mmap: mmap.mmap | None = memory
        self._gone = ""
        self.graphs: tuple[GraphInfo, ...] = info.graphs or (
            GraphInfo(name="", inputs=info.inputs, outputs=info.outputs),
        )
        """Every graph (a daemon before protocol version 5 reports the first alone)."""
        self._inputs = [{spec.name: spec for spec in g.inputs} for g in self.graphs]
        self._outputs = [{spec.name: spec for spec in g.outputs} for g in self.graphs]
        self._set: list[set[str]] = [set() for _ in self.graphs]
        self._has_outputs = [False] * len(self.graphs)
        self.sized: frozenset[str] = frozenset()
        """The inputs the load gave several sizes (a graph each): run picks by shape."""
        self._produced: list[dict[str, tuple[int, ...]]] = [{} for _ in self.graphs]
        """Each graph's outputs whose last run filled less than their room, by name."""
        self.last_dsp_us = 0
        """The DSP time of the last run, µs, as the daemon measured it."""
        self._views: dict[int, Any] = {}  # by offset: tensors of two graphs may share a name

    # --- what the model is --------------------------------------------------------------

    @property
    def inputs(self) -> tuple[TensorInfo, ...]:
        return self.info.inputs

    @property
    def outputs(self) -> tuple[TensorInfo, ...]:
        return self.info.outputs

    @property
    def unloaded(self) -> bool:
        return self._mmap is None

    def graph_index(self, graph: str | None) -> int:
        """The index of the graph named ``graph`` (None or "": the first);
        InvalidTensorIndex, naming the model's graphs, when it has none of that name."""
        if not graph:
            return 0
        for index, info in enumerate(self.graphs):
            if info.name == graph:
                return index
        names = ", ".join(repr(g.name) for g in self.graphs if g.name) or "none with a name"
        index_text = f"graph {graph!r} (the model's graphs: {names})"
        raise InvalidTensorIndex(
            code_message(ErrorCode.INVALID_TENSOR_INDEX, index=index_text),
            fields={"index": index_text},
        )

    def check_loaded(self) -> None:
        if self._mmap is None:
            raise ModelNotLoaded(
                code_message(ErrorCode.MODEL_NOT_LOADED, self._gone, model=self.id),
                fields={"model": self.id},
            )

    # --- inputs -------------------------------------------------------------------------

    def input_view(self, name: str, graph: int = 0) -> Any:
        """A writable view of input ``name`` of graph ``graph`` in the arena: a numpy
        array of its dtype and shape, or a memoryview without numpy. Taking it counts as
        giving the input a value."""
        spec = self._tensor(self._inputs[graph], name, "input")
        self._set[graph].add(spec.name)
        return self._view(spec)

    def set_input(self, name: str, value: TensorValue, graph: int = 0) -> None:
        """Copy ``value`` into input ``name`` of graph ``graph``: exactly its shape, and
        its dtype or one of the same kind (:func:`_cast_refusal`); or, bytes-like,
        exactly its size."""
        spec = self._tensor(self._inputs[graph], name, "input")
        numpy = numpy_module()
        if numpy is not None and not isinstance(value, bytes | bytearray | memoryview):
            array = numpy.asarray(value)
            want = numpy.dtype(spec.dtype)
            if array.shape != tuple(spec.shape):
                raise _mismatch(spec, f"{array.dtype} {list(array.shape)}")
            refusal = _cast_refusal(numpy, array, want)
            if refusal:
                raise _mismatch(spec, f"{array.dtype} {list(array.shape)}: {refusal}")
            self._view(spec)[...] = array
        else:
            try:
                raw = memoryview(value).cast("B")
            except TypeError:
                raise TypeError(
                    f"input {spec.name!r} takes a bytes-like value (numpy is not installed),"
                    f" not {type(value).__name__}"
                ) from None
            if len(raw) != spec.nbytes:
                raise _mismatch(spec, f"{len(raw)} bytes")
            self._memory()[spec.offset : spec.offset + spec.nbytes] = raw
        self._set[graph].add(spec.name)

    def before_run(self, graph: int = 0) -> None:
        """Every input of graph ``graph`` has a value (InputNotSet otherwise); its
        outputs are invalid until the run succeeds."""
        self.check_loaded()
        done = self._set[graph]
        missing = [repr(s.name) for s in self.graphs[graph].inputs if s.name not in done]
        if missing:
            of = f" of graph {self.graphs[graph].name!r}" if graph else ""
            detail = (
                f"input {', '.join(missing)}{of} of model {self.id} has no value: set it"
                " (set_input, input_view or run's inputs) before running"
            )
            raise InputNotSet(
                format_message(ErrorCode.INPUT_NOT_SET, detail=detail), fields={"detail": detail}
            )
        self._has_outputs[graph] = False

    def after_run(self, dsp_us: int, graph: int = 0, shapes: Sequence[Sequence[int]] = ()) -> None:
        """The run succeeded; ``shapes`` is every output's shape as it produced it (empty:
        each has its TensorInfo shape)."""
        self._has_outputs[graph] = True
        self.last_dsp_us = dsp_us
        specs = self.graphs[graph].outputs
        self._produced[graph] = {
            spec.name: tuple(shape)
            for spec, shape in zip(specs, shapes, strict=False)
            if tuple(shape) != tuple(spec.shape)
            and _elements(shape) * _itemsize(spec) <= spec.nbytes  # never past its room
        }

    def output_shape(self, name: str, graph: int = 0) -> tuple[int, ...]:
        """Output ``name``'s shape as the graph's last successful run produced it: less
        than its TensorInfo shape (its room) when the data decided its size."""
        spec = self._tensor(self._outputs[graph], name, "output")
        return self._produced[graph].get(spec.name, tuple(spec.shape))

    # --- outputs ------------------------------------------------------------------------

    def output_view(self, name: str, graph: int = 0) -> Any:
        """A view of output ``name`` of graph ``graph`` in the arena (numpy array, or
        memoryview without numpy); the graph's next run overwrites it."""
        return self._view(self._tensor(self._outputs[graph], name, "output"))

    def get_output(self, name: str, graph: int = 0) -> Any:
        """A copy of output ``name`` of graph ``graph``'s last successful run: a numpy
        array, or bytes."""
        spec = self._tensor(self._outputs[graph], name, "output")
        if not self._has_outputs[graph]:
            of = f"graph {self.graphs[graph].name!r} of " if graph else ""
            detail = (
                f"{of}model {self.id} has not run successfully since it was loaded or last failed"
            )
            raise NoOutputs(
                format_message(ErrorCode.NO_OUTPUTS, detail=detail), fields={"detail": detail}
            )
        shape = self._produced[graph].get(spec.name)
        numpy = numpy_module()
        if shape is not None:  # the data filled the start of its room
            nbytes = _elements(shape) * _itemsize(spec)
            data = self._memory()[spec.offset : spec.offset + nbytes]
            if numpy is None:
                return bytes(data)
            return numpy.frombuffer(data, numpy.dtype(spec.dtype)).reshape(shape).copy()
        if numpy is not None:
            return self._view(spec).copy()
        return bytes(self._memory()[spec.offset : spec.offset + spec.nbytes])

    def inputs_set(self, graph: int = 0) -> frozenset[str]:
        """The inputs of graph ``graph`` given a value so far (a chain checks its own)."""
        return frozenset(self._set[graph])

    def read(self, spec: TensorInfo, shape: Sequence[int]) -> bytes:
        """A copy of the bytes of tensor ``spec`` at ``shape`` (as a chain produced it:
        never past its room) from the arena."""
        nbytes = min(_elements(shape) * _itemsize(spec), spec.nbytes)
        return bytes(self._memory()[spec.offset : spec.offset + nbytes])

    def all_outputs(self, graph: int = 0) -> dict[str, Any]:
        return {s.name: self.get_output(s.name, graph) for s in self.graphs[graph].outputs}

    # --- ownership ----------------------------------------------------------------------

    def release_local(self, reason: str) -> None:
        """Close the mapping and the arena's fd; idempotent. ``reason`` ends the
        message of later uses ("no model is loaded: model N: ...")."""
        if self._mmap is not None:
            self._gone = reason
        memory, self._mmap = self._mmap, None
        self._views.clear()
        if memory is not None:
            # A view the caller still holds keeps the mapping until it goes.
            with contextlib.suppress(BufferError):
                memory.close()
        self._fd.close()

    def __repr__(self) -> str:
        state = "unloaded" if self.unloaded else f"{len(self.inputs)} in, {len(self.outputs)} out"
        return f"<model {self.id} {self.info.name!r} {state}>"

    # --- internals ----------------------------------------------------------------------

    def _memory(self) -> mmap.mmap:
        self.check_loaded()
        assert self._mmap is not None
        return self._mmap

    def _tensor(self, table: dict[str, TensorInfo], name: object, what: str) -> TensorInfo:
        self.check_loaded()
        spec = table.get(name) if isinstance(name, str) else None
        if spec is None:
            names = ", ".join(repr(n) for n in table) or "none"
            index = f"{what} {name!r} (the model's {what}s: {names})"
            raise InvalidTensorIndex(
                code_message(ErrorCode.INVALID_TENSOR_INDEX, index=index), fields={"index": index}
            )
        return spec

    def _view(self, spec: TensorInfo) -> Any:
        view = self._views.get(spec.offset)
        if view is None:
            memory = self._memory()
            numpy = numpy_module()
            if numpy is not None:
                view = numpy.ndarray(
                    tuple(spec.shape), numpy.dtype(spec.dtype), buffer=memory, offset=spec.offset
                )
            else:
                view = memoryview(memory)[spec.offset : spec.offset + spec.nbytes]
            self._views[spec.offset] = view
        return view


def _elements(shape: Sequence[int]) -> int:
    count = 1
    for size in shape:
        count *= size
    return count


def _itemsize(spec: TensorInfo) -> int:
    """Bytes per element of ``spec`` (its nbytes over its elements)."""
    elements = _elements(spec.shape)
    return spec.nbytes // elements if elements else 0


_KINDS: Final = {"f": "floating point", "i": "integer", "u": "integer", "b": "boolean"}


def _cast_refusal(numpy: Any, array: Any, want: Any) -> str:
    """Why ``array`` may not go into a tensor of dtype ``want`` ("" when it may).

    Within a kind only: floats to any float (float64 to float32 is the usual case),
    integers to an integer type that holds every value given. Never across kinds:
    int16 audio taken as float32 would arrive unscaled (1005.0 for 1005), a float
    taken as an integer truncated; the caller converts, and the message says how.
    """
    have = array.dtype
    if have == want:
        return ""
    kind, wanted = _KINDS.get(have.kind, have.kind), _KINDS.get(want.kind, want.kind)
    if kind != wanted:
        how = f"convert it first (array.astype({str(want)!r}))"
        if have == numpy.dtype("int16") and wanted == "floating point":
            # 16-bit PCM is what int16 arrays usually hold; a model takes it in [-1, 1).
            how = (
                "scale it as the model expects and convert it first: for 16-bit audio"
                f" samples, array.astype({str(want)!r}) / 32768"
            )
        elif kind == "integer" and wanted == "floating point":
            how = f"convert it first, values as they are (array.astype({str(want)!r}))"
        article = "an" if kind[0] in "aeiou" else "a"
        return f"{article} {kind} array is not taken as {wanted} ({have} to {want}): {how}"
    if kind == "integer" and not numpy.can_cast(have, want, casting="safe") and array.size:
        info = numpy.iinfo(want)
        if array.min() < info.min or array.max() > info.max:
            return f"its values do not fit in {want} ({info.min}..{info.max})"
    return ""


def _mismatch(spec: TensorInfo, got: str) -> TensorMismatch:
    takes = f"{spec.dtype} {list(spec.shape)} ({spec.nbytes} bytes)"
    detail = f"input {spec.name!r} takes {takes}; got {got}"
    return TensorMismatch(
        format_message(ErrorCode.TENSOR_MISMATCH, detail=detail), fields={"detail": detail}
    )
