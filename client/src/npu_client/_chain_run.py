"""``npuctl chain``: load several models, run them once as one chain, report shapes and times.

The command line form of :meth:`npu_client.Client.chain`: each MODEL is a step
named by its file's stem (``mel.onnx`` is step ``mel``), run in the order
given; ``--feed embedding:input_1=mel:frames`` feeds a step's input from an
earlier step's output; every other input is given from its ``--input`` file
or is zeros, as ``npuctl run`` gives them. The outputs printed are the last
step's, or those named with ``--output``.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec

from npu_client._blocking import Client
from npu_client._chain import Step
from npu_client._model_run import RunUsageError, TensorLine, _load_npy, tensor_and_time_lines


class ChainReport(msgspec.Struct, frozen=True):
    steps: list[str]
    """Each step as ``name (file)``, in order."""
    load_ms: float
    """The loads of every model, one after the other."""
    run_ms: float
    """The chain's round trip as this process saw it."""
    dsp_us: int
    """The chain's DSP time as npud measured it."""
    inputs: list[TensorLine] = msgspec.field(default_factory=list)
    """Every input of every step, by ``step:input``; ``source`` is the .npy file,
    "zeros", or the ``step:output`` that feeds it."""
    outputs: list[TensorLine] = msgspec.field(default_factory=list)


@dataclass
class ChainArgs:
    models: list[Path]
    feeds: list[tuple[str, str]] = field(default_factory=list)
    """(``step:input``, ``step:output``) pairs (--feed)."""
    inputs: dict[str, Path] = field(default_factory=dict)
    """``step:input`` -> .npy file (--input)."""
    shapes: dict[str, tuple[int | tuple[int, ...], ...]] = field(default_factory=dict)
    """``step:tensor`` -> its whole shape at load (--shape)."""
    outputs: list[str] = field(default_factory=list)
    """``step:output`` to print (--output); empty: the last step's every output."""


def _split(key: str, steps: list[str], what: str) -> tuple[str, str]:
    step, colon, tensor = key.partition(":")
    if not colon or not tensor:
        raise RunUsageError(f"{what} {key!r} is not STEP:TENSOR")
    if step not in steps:
        raise RunUsageError(
            f"{what} {key!r} names step {step!r}; the steps are {', '.join(map(repr, steps))}"
            " (each model's file name without its suffix)"
        )
    return step, tensor


@dataclass
class _Parsed:
    names: list[str]
    given: dict[str, dict[str, tuple[Path, Any]]]
    shapes: dict[str, dict[str, tuple[int | tuple[int, ...], ...]]]
    feeds: dict[str, dict[str, str]]


def _parse(client: Client, args: ChainArgs) -> _Parsed:
    names = [path.stem for path in args.models]
    taken = sorted({n for n in names if names.count(n) > 1 or ":" in n or not n})
    if taken:
        raise RunUsageError(
            f"step name {taken[0]!r} is taken twice, empty or has a colon: each MODEL's file"
            " name without its suffix names its step; copy or link the file under another name"
        )
    parsed = _Parsed(names, {n: {} for n in names}, {n: {} for n in names}, {n: {} for n in names})
    for key, path in args.inputs.items():
        step, tensor = _split(key, names, "--input")
        parsed.given[step][tensor] = (path, _load_npy(path))
    for key, dims in args.shapes.items():
        step, tensor = _split(key, names, "--shape")
        parsed.shapes[step][tensor] = dims
    if client.backend == "emulator":  # an --input array's shape is its input's, as for run
        for step, given in parsed.given.items():
            for tensor, (_, array) in given.items():
                parsed.shapes[step].setdefault(tensor, tuple(int(d) for d in array.shape))
    for target, source in args.feeds:
        step, tensor = _split(target, names, "--feed")
        _split(source, names, "--feed source")
        parsed.feeds[step][tensor] = source
    return parsed


def _give_inputs(parsed: _Parsed, models: dict[str, Any]) -> list[TensorLine]:
    """Every input no step feeds from its file (zeros otherwise); a line for each input."""
    lines = []
    for name in parsed.names:
        model, given, fed = models[name], parsed.given[name], parsed.feeds[name]
        known = {spec.name for spec in model.inputs}
        unknown = sorted(set(given) - known)
        if unknown:
            raise RunUsageError(
                f"step {name!r} has no input {unknown[0]!r} (its inputs: "
                f"{', '.join(repr(n) for n in sorted(known)) or 'none'})"
            )
        for spec in model.inputs:
            if spec.name in fed:
                source = fed[spec.name]
            elif spec.name in given:
                path, array = given[spec.name]
                model.set_input(spec.name, array)
                source = str(path)
            else:
                model.input_view(spec.name)  # the arena starts zeroed
                source = "zeros"
            lines.append(TensorLine(f"{name}:{spec.name}", spec.dtype, tuple(spec.shape), source))
    return lines


def run_chain_once(client: Client, args: ChainArgs) -> ChainReport:
    """Load every model, give the inputs no step feeds their files' arrays (zeros
    otherwise), run the chain once, unload the models."""
    parsed = _parse(client, args)
    names = parsed.names
    started = time.perf_counter()
    with contextlib.ExitStack() as stack:
        models = {
            name: stack.enter_context(client.load_model(path, shapes=parsed.shapes[name] or None))
            for name, path in zip(names, args.models, strict=True)
        }
        loaded = time.perf_counter()
        outputs = args.outputs or [f"{names[-1]}:{t.name}" for t in models[names[-1]].outputs]
        chain = client.chain(
            [Step(name, models[name], inputs=parsed.feeds[name]) for name in names], outputs
        )
        inputs = _give_inputs(parsed, models)
        before = time.perf_counter()
        result = chain.run()
        after = time.perf_counter()
        lines = []
        for key in chain.outputs:
            step, tensor = key.split(":", 1)
            spec = next(s for s in models[step].outputs if s.name == tensor)
            shape = tuple(int(d) for d in getattr(result[key], "shape", spec.shape))
            room = tuple(spec.shape) if shape != tuple(spec.shape) else None
            lines.append(TensorLine(key, spec.dtype, shape, room=room))
        return ChainReport(
            steps=[f"{name} ({path.name})" for name, path in zip(names, args.models, strict=True)],
            load_ms=(loaded - started) * 1000,
            run_ms=(after - before) * 1000,
            dsp_us=chain.last_dsp_us,
            inputs=inputs,
            outputs=lines,
        )


def render_chain(report: ChainReport) -> str:
    lines = [f"chain    {' -> '.join(report.steps)}"]
    lines += tensor_and_time_lines(
        report.inputs, report.outputs, report.load_ms, report.run_ms, report.dsp_us
    )
    return "\n".join(lines)
