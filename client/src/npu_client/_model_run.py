"""``npuctl run``: load a model, run it once on given or zero inputs, report shapes and times."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec

from npu_client import _models, cli
from npu_client._blocking import Client
from npu_client._errors import QnnError


class RunUsageError(Exception):
    """An --input or --shape that cannot be used; the message says why, and
    ``exit_status`` is npuctl's (64 usage, 65 a file that is no array, 66 unreadable,
    69 numpy missing)."""

    def __init__(self, message: str, exit_status: int = cli.EX_USAGE) -> None:
        super().__init__(message)
        self.exit_status = exit_status


class TensorLine(msgspec.Struct, frozen=True):
    name: str
    dtype: str
    shape: tuple[int, ...]
    source: str = ""
    """Inputs: the .npy file, or "zeros"."""
    room: tuple[int, ...] | None = None
    """Outputs whose size the data decided: the room the load gave them (``shape`` is
    what the run produced)."""


class RunReport(msgspec.Struct, frozen=True):
    model: str
    description: str
    load_ms: float
    run_ms: float
    """The run's round trip as this process saw it."""
    dsp_us: int
    """The run's DSP time as npud measured it."""
    inputs: list[TensorLine] = msgspec.field(default_factory=list)
    outputs: list[TensorLine] = msgspec.field(default_factory=list)
    graph: str = ""
    """The graph that ran (--graph); empty: the model's first."""
    graphs: list[str] = msgspec.field(default_factory=list)
    """Every graph's name, when the model has more than one."""


@dataclass
class RunArgs:
    model: Path
    inputs: dict[str, Path] = field(default_factory=dict)
    shapes: dict[str, tuple[int | tuple[int, ...], ...]] = field(default_factory=dict)
    """--shape: a dimension may be several sizes (``1|2|4``), a graph each."""
    graph: str | None = None
    """The graph to run, by name (--graph); None: the first."""
    constants: dict[str, tuple[int | float, ...] | int | float] = field(default_factory=dict)
    """Inputs fixed to values at load (--constant): a scalar, or a flat tuple."""


def parse_constant(text: str) -> int | float | tuple[int | float, ...]:
    """``16000`` (a scalar) or ``0.667,1,0.8`` (a flat array): integers stay integers
    unless a float is among them."""
    items = text.split(",")
    try:
        values: list[int | float] = [int(v) for v in items]
    except ValueError:
        try:
            values = [float(v) for v in items]
        except ValueError:
            raise ValueError(f"values are numbers separated by commas, got {text!r}") from None
    return values[0] if len(items) == 1 else tuple(values)


def parse_assignment(text: str) -> tuple[str, str]:
    """``NAME=VALUE`` (argparse type for --input and --shape)."""
    name, equals, value = text.partition("=")
    if not equals or not name or not value:
        raise ValueError(f"expected NAME=VALUE, got {text!r}")
    return name, value


def parse_dims(text: str) -> tuple[int | tuple[int, ...], ...]:
    """``1,576``; a dimension may be several sizes, ``1,1|2|4`` (a graph each)."""
    try:
        choices = [tuple(int(size) for size in d.split("|")) for d in text.split(",")]
    except ValueError:
        raise ValueError(
            f"dimensions are integers separated by commas (several sizes of one by |), got {text!r}"
        ) from None
    if any(size < 1 for choice in choices for size in choice):
        raise ValueError(f"dimensions must be at least 1, got {text!r}")
    return tuple(choice[0] if len(choice) == 1 else choice for choice in choices)


def run_once(client: Client, args: RunArgs) -> RunReport:
    """Load ``args.model``, set each input of the graph (``args.graph``; the first by
    default) from its .npy file (zeros otherwise), run that graph once."""
    arrays = {name: _load_npy(path) for name, path in args.inputs.items()}
    started = time.perf_counter()
    shapes = load_shapes(client.backend, args, arrays)
    fixed = dict(args.constants)
    with client.load_model(args.model, shapes=shapes, constants=fixed or None) as model:
        loaded = time.perf_counter()
        index = model._run_graph(args.graph, arrays or None)  # several sizes: by shape
        graph = model.graphs[index]
        chosen = graph.name if index else args.graph
        known = {spec.name for spec in graph.inputs}
        unknown = sorted(set(arrays) - known)
        if unknown:
            of = f"graph {args.graph!r}" if args.graph else "the model"
            raise RunUsageError(
                f"{of} has no input {unknown[0]!r} (its inputs: "
                f"{', '.join(repr(n) for n in sorted(known)) or 'none'})"
            )
        inputs = []
        for spec in graph.inputs:
            if spec.name in arrays:
                model.set_input(spec.name, arrays[spec.name], graph=chosen)
                source = str(args.inputs[spec.name])
            else:
                model.input_view(spec.name, graph=chosen)  # the arena starts zeroed
                source = "zeros"
            inputs.append(TensorLine(spec.name, spec.dtype, tuple(spec.shape), source))
        before = time.perf_counter()
        try:
            model.execute(graph=chosen)
        except QnnError as exc:
            raise _with_zeros_hint(exc, inputs) from None
        after = time.perf_counter()
        return RunReport(
            model=model.name,
            description=model.info().description,
            load_ms=(loaded - started) * 1000,
            run_ms=(after - before) * 1000,
            dsp_us=model.last_dsp_us,
            inputs=inputs,
            outputs=[_output_line(model, s, chosen) for s in graph.outputs],
            graph=graph.name,
            graphs=[g.name for g in model.graphs] if len(model.graphs) > 1 else [],
        )


def _output_line(model: Any, spec: Any, graph: str | None) -> TensorLine:
    """An output as the run produced it, with its room when the data decided its size."""
    shape = tuple(model.output_shape(spec.name, graph=graph))
    room = tuple(spec.shape) if shape != tuple(spec.shape) else None
    return TensorLine(spec.name, spec.dtype, shape, room=room)


def _with_zeros_hint(exc: QnnError, inputs: list[TensorLine]) -> QnnError:
    """The run's failure, saying which inputs were zeros: a zero where the model takes
    a rate, a length or a scale (Silero VAD's sr) fails it deep inside, far from the
    cause."""
    zeros = [t.name for t in inputs if t.source == "zeros"]
    if not zeros:
        return exc
    names = ", ".join(repr(n) for n in zeros)
    first = zeros[0]
    hint = (
        f"; the inputs {names} were all zeros, which the model may not take"
        if len(zeros) > 1
        else f"; the input {names} was zeros, which the model may not take"
    )
    hint += (
        f" (give each a value: --input {first}=FILE.npy, or fix it at load with"
        f" --constant {first}=VALUE)"
    )
    return QnnError(f"{exc.message}{hint}", code=exc.code, fields=exc.fields)


def load_shapes(
    backend: str, args: RunArgs, arrays: dict[str, Any]
) -> dict[str, tuple[int | tuple[int, ...], ...]]:
    """The shapes to load with: each --shape, and on the emulator (ONNX models, whose
    dimensions may be free) each --input array's own shape; a QNN model library's are
    fixed, so the kernel backend gets the --shape ones alone (none, in the usual case)."""
    shapes = dict(args.shapes)
    if backend != "emulator":
        return shapes
    for name, array in arrays.items():
        shape = tuple(int(d) for d in array.shape)
        if any(isinstance(d, tuple) for d in shapes.get(name, ())):
            continue  # several sizes: the run takes the graph the array fits
        if name in shapes and shapes[name] != shape:
            raise RunUsageError(
                f"--shape {name}={','.join(map(str, shapes[name]))} disagrees with the shape of"
                f" {args.inputs[name]}: {list(shape)} (give one or make them agree)"
            )
        shapes[name] = shape
    return shapes


def _load_npy(path: Path) -> Any:
    numpy = _models.numpy_module()
    if numpy is None:
        raise RunUsageError(
            "--input reads .npy files with numpy: pip install 'npu-client[numpy]'",
            cli.EX_UNAVAILABLE,
        )
    try:
        return numpy.load(path, allow_pickle=False)
    except OSError as exc:
        raise RunUsageError(f"cannot read {path}: {exc}", cli.EX_NOINPUT) from None
    except ValueError as exc:
        raise RunUsageError(f"cannot read {path}: {exc}", cli.EX_DATAERR) from None


def render_run(report: RunReport) -> str:
    lines = [f"model    {report.model} ({report.description})"]
    if report.graphs:
        names = ", ".join(repr(name) for name in report.graphs)
        lines.append(f"graph    {report.graph!r} of {names}")
    lines += tensor_and_time_lines(
        report.inputs, report.outputs, report.load_ms, report.run_ms, report.dsp_us
    )
    return "\n".join(lines)


def tensor_and_time_lines(
    inputs: list[TensorLine],
    outputs: list[TensorLine],
    load_ms: float,
    run_ms: float,
    dsp_us: int,
) -> list[str]:
    """The lines a run and a chain both print: each input and output, then the times."""
    lines = [f"input    {t.name} {t.dtype} {list(t.shape)} <- {t.source}" for t in inputs]
    lines += [
        f"output   {t.name} {t.dtype} {list(t.shape)}"
        + (f" (room {list(t.room)})" if t.room is not None else "")
        for t in outputs
    ]
    lines.append(
        f"time     load {load_ms:.1f} ms, run {run_ms:.2f} ms (DSP {dsp_us / 1000:.2f} ms)"
    )
    return lines
