"""npuctl: look at npud and check the NPU through it.

Exit status (sysexits, :mod:`npu_client.cli`): 0 success; 1 failure (an error
from npud, a selftest step that did not pass); 64 usage error; 65 an input
file that holds no array; 66 a model or input file that cannot be read; 69 npud
not listening (or numpy missing for --input); 73 ``metrics --output``
cannot be written; 75 npud did not answer in time; 77 npud or its socket refused
this user; 130 interrupted; 141 stdout closed early (``npuctl status | head -1``).
"""

from __future__ import annotations

import argparse
import grp
import logging
import os
import pwd
import shutil
import stat
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Final

import msgspec

import npu_protocol
from npu_client import cli
from npu_client._blocking import Client, connect
from npu_client._chain_run import ChainArgs, render_chain, run_chain_once
from npu_client._errors import (
    ConnectFailed,
    DeviceNotFound,
    InvalidArgument,
    ModelFileUnreadable,
    ModelFormatError,
    ModelMalformed,
    NotPermitted,
    NpuError,
)
from npu_client._llm import LlmUnavailable
from npu_client._metrics import render, render_down
from npu_client._model_run import (
    RunArgs,
    RunUsageError,
    parse_assignment,
    parse_constant,
    parse_dims,
    render_run,
    run_once,
)
from npu_client._selftest import render_report, run_selftest
from npu_client._settings import DEFAULT_SOCKET_PATH, SOCKET_ENV
from npu_client._status_text import render_status
from npu_client._top import SORT_KEYS, Sample
from npu_client._top import frame as top_frame
from npu_client._top import render as render_top
from npu_client._version import __version__

EXIT_OK: Final = cli.EXIT_OK
EXIT_FAILURE: Final = cli.EXIT_FAILURE
EXIT_USAGE: Final = cli.EX_USAGE
EXIT_NOINPUT: Final = cli.EX_NOINPUT
EXIT_UNAVAILABLE: Final = cli.EX_UNAVAILABLE
EXIT_CANTCREAT: Final = cli.EX_CANTCREAT
EXIT_TEMPFAIL: Final = cli.EX_TEMPFAIL
EXIT_NOPERM: Final = cli.EX_NOPERM
EXIT_INTERRUPTED: Final = cli.EXIT_INTERRUPTED
EXIT_PIPE: Final = cli.EXIT_PIPE
NPUD_FAILED: Final = frozenset({EXIT_FAILURE, EXIT_UNAVAILABLE, EXIT_TEMPFAIL, EXIT_NOPERM})
"""The statuses that say npud did not answer or refused (metrics then says npud_up 0)."""

NPUCTL_NAME: Final = "npuctl"
"""The client name npuctl gives npud (its row in the status)."""

CLIENT_GROUP: Final = "npu"
"""The group whose members may connect to the system's npud (systemd/npud.socket)."""

DEFAULT_TIMEOUT: Final = 30.0
CLEAR: Final = "\x1b[H\x1b[2J"
"""Home the cursor and clear the screen (ANSI; every terminal emulator knows it)."""

Command = Callable[[Client, argparse.Namespace], int]


def build_parser() -> argparse.ArgumentParser:
    parser = cli.ArgumentParser(
        prog="npuctl",
        description="Show the state of npud, the Hexagon NPU broker, and test the NPU through it.",
        epilog=(
            "exit status: 0 success; 1 failure (an error from npud, a selftest step "
            "failed); 64 usage error; 65 an --input file holds no array; 66 a model or "
            "--input file cannot be read; 69 npud is not listening (or numpy, which --input "
            "needs, is not installed); 73 metrics --output cannot be written; 75 npud did not "
            "answer within --timeout; 77 npud or its socket refused you; 130 interrupted "
            "(Ctrl-C); 141 stdout closed before the output was written (npuctl status | "
            "head -1), quietly, as SIGPIPE ends other tools"
        ),
    )
    parser.add_argument(
        "--socket",
        metavar="PATH",
        type=_socket_path,
        help=f"npud's socket (default: ${SOCKET_ENV} if set, else {DEFAULT_SOCKET_PATH})",
    )
    parser.add_argument(
        "--timeout",
        metavar="SECONDS",
        type=_positive_seconds,
        default=DEFAULT_TIMEOUT,
        help=f"give up when npud does not answer within this long (default: {DEFAULT_TIMEOUT:g})",
    )
    parser.add_argument("--version", action="version", version=version_line())
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    status = commands.add_parser(
        "status",
        help="daemon, DSP, shell, session and per-client state",
        description=(
            "Show npud's version, uptime, backend and device, the DSP's capabilities, the "
            "shell verification result, the session epoch and restarts, totals, and one row "
            "per connected client."
        ),
    )
    status.add_argument(
        "--json",
        action="store_true",
        help="print the status record as JSON (keys are stable; see the client README)",
    )
    status.set_defaults(run=_status)

    selftest = commands.add_parser(
        "selftest",
        help="allocate, map, echo, fill and checksum through the DSP, and verify",
        description=(
            "Allocate 1 MiB, map it into the DSP, write a random pattern, run it through the "
            "echo skel and the test skel's fill and checksum, read back and verify, then "
            "unmap, close and free. Prints one line per step; exits 1 if any step failed."
        ),
    )
    selftest.add_argument("--json", action="store_true", help="print the report as JSON")
    selftest.set_defaults(run=_selftest)

    metrics = commands.add_parser(
        "metrics",
        help="the status as Prometheus metrics (text exposition format)",
        description=(
            "Print npud's status as Prometheus metrics: daemon uptime, DSP restarts and session "
            "epoch, totals, and per client (labelled pid, uid, name, priority) calls, buffers, "
            "bytes, mappings and handles; npud_up is 1, or 0 when npud did not answer (exit "
            "status 1). npuctl's own connection is left out of the per-client series."
        ),
        epilog=(
            "for node_exporter's textfile collector, run it from a timer with --output "
            "DIR/npud.prom (docs/deploy.md, Metrics)"
        ),
    )
    metrics.add_argument(
        "--output",
        metavar="FILE",
        type=Path,
        help="write FILE instead of stdout, atomically (a temporary file renamed over it)",
    )
    metrics.set_defaults(run=_metrics, on_failure=_metrics_down)

    top = commands.add_parser(
        "top",
        help="a live view of who uses the NPU: a row per client, refreshed every second",
        description=(
            "Show, refreshed every interval, one row per client: its class, calls per "
            "second and share of DSP time over the interval, its recent queue wait (median "
            "and 99th percentile), calls queued/running, deadline misses, calls refused as "
            "late, and its declared budget; above them the scheduler's mode, DSP utilisation "
            "and queues. On a terminal, fitted to its width and redrawn in place; into a "
            "pipe or a file, whole lines (nothing cut). npuctl's own connection is counted "
            "nowhere. Ctrl-C ends it."
        ),
        epilog=(
            "header: DSP busy is the daemon's average over its last 10 s, of all its slots "
            "(100%%: every slot busy all the time). columns: CL class (RT realtime, N normal, "
            "BG background); DSP%% share of the interval the client's calls were on the DSP, "
            "of one slot (100%%: one call running all the interval; a client with two calls "
            "running at once shows up to 200%%), summed as 'in all' in the header; Q/R calls "
            "queued/running; MISS finished after their deadline; LATE refused because their "
            "deadline passed before dispatch; BUDGET declared ms per period ms"
        ),
    )
    top.add_argument(
        "--once",
        action="store_true",
        help="print one frame (after one interval) and exit, for scripts",
    )
    top.add_argument(
        "--json", action="store_true", help="print each frame as one JSON object per line"
    )
    top.add_argument(
        "--sort",
        choices=SORT_KEYS,
        default="dsp",
        help="order of the rows (default: dsp, the largest share of DSP time first)",
    )
    top.add_argument(
        "--interval",
        metavar="SECONDS",
        type=_positive_seconds,
        default=1.0,
        help="time between frames, over which rates are measured (default: 1)",
    )
    top.add_argument(
        "--count",
        metavar="N",
        type=_positive_int,
        default=None,
        help="stop after N frames (default: until Ctrl-C; --once is --count 1)",
    )
    top.set_defaults(run=_top)

    run = commands.add_parser(
        "run",
        help="load a model, run it once, print its output shapes and the timings",
        description=(
            "Load MODEL (a file this user can read: npuctl opens it and passes its fd to "
            "npud), give each input the array of its --input file or zeros, run it once, and "
            "print each input's source, each output's data type and shape, and the times of "
            "the load, the run's round trip and its DSP time. The model is unloaded at the "
            "end. The emulator backend loads ONNX models, the kernel backend QNN model "
            "libraries."
        ),
        epilog=(
            "example (Silero VAD: on the emulator an --input file's array gives that "
            "input's shape, --shape the others'; Silero's outputs come out of a branch on "
            "sr's value, so the sample rate is fixed at load and the branch folded): "
            "npuctl run silero_vad.onnx --shape state=2,1,128 --constant sr=16000 "
            "--input input=chunk.npy"
        ),
    )
    run.add_argument("model", metavar="MODEL", type=Path, help="the model file")
    run.add_argument(
        "--input",
        metavar="NAME=FILE.npy",
        type=_assignment,
        action="append",
        default=[],
        help="set input NAME from a .npy file (needs numpy), whose shape is NAME's shape at "
        "load (ONNX models on the emulator); repeat per input",
    )
    run.add_argument(
        "--shape",
        metavar="NAME=D0,D1,...",
        type=_shape,
        action="append",
        default=[],
        help="give tensor NAME's whole shape, fixing its free dimensions (ONNX models); "
        "needed for inputs without --input and for outputs whose shape does not follow "
        "from the inputs' (an output whose size the data decides: its room, the largest; "
        "the report then gives the shape the run produced); a dimension given as several "
        "sizes, 1,1|2|4, makes a graph of each and the run takes the one its --input fits; "
        "repeat per tensor",
    )
    run.add_argument(
        "--constant",
        metavar="NAME=V[,V...]",
        type=_constant,
        action="append",
        default=[],
        help="fix input NAME to a value at load (ONNX models on the emulator): npud folds it "
        "into the model before shape inference, so outputs that hang on it get their shapes, "
        "and NAME is no longer an input; one number is a scalar, several a 1-D array; "
        "repeat per input",
    )
    run.add_argument(
        "--graph",
        metavar="NAME",
        help="run the model's graph NAME (a model may hold up to 8, e.g. an LLM's prefill "
        "and decode; on the emulator a graph pack); --input names that graph's inputs. "
        "Default: the first graph",
    )
    run.add_argument("--json", action="store_true", help="print the report as JSON")
    run.set_defaults(run=_run)
    _add_chain_command(commands)
    llm = commands.add_parser(
        "llm",
        help="load an LLM (a GGUF file) onto the NPU and write what it answers to a prompt",
        description=(
            "Load MODEL, a GGUF file, with llama.cpp on the NPU through npud (load_llm: "
            "llama.cpp's Hexagon backend in this process, a DSP process of its own in npud), "
            "write the text it generates after PROMPT as it comes, and unload it. Needs "
            "llama.cpp's libraries and llama-cpp-python (make llm in npud's source tree; "
            "$NPUD_LLAMA_LIB names their directory elsewhere)."
        ),
        epilog=(
            "example: npuctl llm tiny-llama-q4_0.gguf 'hello world' --max-tokens 32 "
            "--temperature 0. exit status as npuctl's, and: 64 a bad argument (a prompt "
            "longer than the context...), 65 not a GGUF file or one llama.cpp cannot load, "
            "66 MODEL cannot be read, 69 llama.cpp's libraries, llama-cpp-python or the NPU "
            "are missing (the message says which, and how to get them)"
        ),
    )
    llm.add_argument("model", metavar="MODEL", type=Path, help="the GGUF model file")
    llm.add_argument("prompt", metavar="PROMPT", help="the prompt; - reads it from stdin")
    llm.add_argument(
        "--max-tokens",
        metavar="N",
        type=_positive_int,
        default=256,
        help="stop after N tokens (default: 256)",
    )
    llm.add_argument(
        "--temperature",
        metavar="T",
        type=_non_negative_float,
        default=0.8,
        help="0: the likeliest token each time (greedy); above 0: drawn (default: 0.8)",
    )
    llm.add_argument(
        "--top-k", metavar="K", type=int, default=40, help="draw among the K likeliest (0: all)"
    )
    llm.add_argument(
        "--top-p", metavar="P", type=float, default=0.95, help="and the likeliest P of the mass"
    )
    llm.add_argument("--seed", metavar="N", type=int, help="the draw's seed (default: a new one)")
    llm.add_argument(
        "--stop",
        metavar="TEXT",
        action="append",
        default=[],
        help="end before TEXT (repeat for several)",
    )
    llm.add_argument(
        "--ctx",
        metavar="N",
        type=_positive_int,
        default=512,
        help="tokens of context, prompt and answer together (default: 512)",
    )
    llm.add_argument(
        "--json",
        action="store_true",
        help="print one JSON object at the end: the text, its tokens and the statistics",
    )
    llm.set_defaults(run=_llm)
    debug = commands.add_parser(
        "debug",
        help="inject a fault into the emulated DSP (root, emulator only)",
        description=(
            "Exercise npud's recovery from outside: a subsystem restart, slow invokes, an "
            "invoke that fails. Only root may, and only on the emulator backend (the kernel "
            "backend refuses with a clear error)."
        ),
    )
    debug.add_argument(
        "action",
        choices=("ssr", "latency", "fail-next-invoke", "clear"),
        help=(
            "ssr: a subsystem restart, the DSP away for --seconds (default 1), every domain "
            "restarts; with --domain, that domain's DSP process crashes and it restarts "
            "alone; latency: every later invoke takes --seconds longer; fail-next-invoke: the "
            "next invoke answers --code; clear: undo latency and pending failures"
        ),
    )
    debug.add_argument(
        "--domain",
        default="",
        metavar="NAME",
        help="for ssr: the domain whose DSP process crashes (a name npuctl status shows)",
    )
    debug.add_argument(
        "--seconds",
        type=_non_negative_seconds,
        default=None,
        help="the outage of ssr (default: 1), the latency added by latency (default: 0)",
    )
    debug.add_argument(
        "--code",
        type=_dsp_result,
        default=0x8000040E,
        help="the DSP result fail-next-invoke answers (default: 0x8000040E, AEE_EBADPARM)",
    )
    debug.set_defaults(run=_debug)
    return parser


def _assignment(text: str) -> tuple[str, str]:
    try:
        return parse_assignment(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _constant(text: str) -> tuple[str, int | float | tuple[int | float, ...]]:
    try:
        name, values = parse_assignment(text)
        return name, parse_constant(values)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _shape(text: str) -> tuple[str, tuple[int | tuple[int, ...], ...]]:
    try:
        name, dims = parse_assignment(text)
        return name, parse_dims(dims)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def version_line() -> str:
    """``npuctl X (npu-protocol Y, wire protocol N)``: X matches ``npud --version``."""
    return (
        f"npuctl {__version__} (npu-protocol {npu_protocol.__version__}, "
        f"wire protocol {npu_protocol.PROTOCOL_VERSION})"
    )


def _socket_path(text: str) -> str:
    if not text:
        raise argparse.ArgumentTypeError("the socket path is empty")
    return text


def _positive_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a positive number of seconds: {text!r}")
    return value


def _non_negative_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not 0 <= value < float("inf"):
        raise argparse.ArgumentTypeError(f"must be 0 or more seconds: {text!r}")
    return value


def _dsp_result(text: str) -> int:
    try:
        value = int(text, 0)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not 0 < value <= 0xFFFF_FFFF:
        raise argparse.ArgumentTypeError(f"a DSP result is a non-zero u32: {text!r}")
    return value


def _debug(client: Client, args: argparse.Namespace) -> int:
    if args.domain and args.action != "ssr":
        _error("--domain goes with ssr only")
        return EXIT_USAGE
    if args.action == "ssr":
        seconds = 1.0 if args.seconds is None else args.seconds
        detail = client.debug_fault("ssr", seconds, domain=args.domain)
    elif args.action == "latency":
        detail = client.debug_fault("latency", args.seconds or 0.0)
    elif args.action == "fail-next-invoke":
        detail = client.debug_fault("fail_next_invoke", code=args.code)
    else:
        detail = client.debug_fault("clear")
    print(detail)
    return EXIT_OK


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1: {text!r}")
    return value


def _top(client: Client, args: argparse.Namespace) -> int:
    frames = 1 if args.once else args.count
    redraw = not args.json and sys.stdout.isatty()
    me = (os.getpid(), NPUCTL_NAME)
    before = Sample(client.status(), time.monotonic())
    shown = 0
    while frames is None or shown < frames:
        time.sleep(args.interval)
        after = Sample(client.status(), time.monotonic())
        view = top_frame(before, after, sort=args.sort, exclude=me)
        if args.json:
            print(msgspec.json.encode(view).decode(), flush=True)
        else:
            text = render_top(view, width=shutil.get_terminal_size().columns if redraw else None)
            print(
                f"\x1b[H\x1b[2J{text}" if redraw else text + ("\n" if frames != 1 else ""),
                flush=True,
            )
        before = after
        shown += 1
    return EXIT_OK


def _status(client: Client, args: argparse.Namespace) -> int:
    status = client.status()
    if args.json:
        print(msgspec.json.encode(status).decode())
    else:
        print(render_status(status))
    return EXIT_OK


def _selftest(client: Client, args: argparse.Namespace) -> int:
    report = run_selftest(client)
    if args.json:
        print(msgspec.json.encode(report).decode())
    else:
        print(render_report(report))
    return EXIT_OK if report.ok else EXIT_FAILURE


LLM_STATUSES: Final[tuple[tuple[type[NpuError], int], ...]] = (
    (LlmUnavailable, cli.EX_UNAVAILABLE),
    (DeviceNotFound, cli.EX_UNAVAILABLE),
    (ModelFileUnreadable, cli.EX_NOINPUT),
    (ModelFormatError, cli.EX_DATAERR),
    (ModelMalformed, cli.EX_DATAERR),
    (InvalidArgument, cli.EX_USAGE),
)
"""npuctl llm's exit status for the errors of load_llm and its generation."""


def _llm(client: Client, args: argparse.Namespace) -> int:
    # llama.cpp's warnings are the library user's to see; a command shows only errors.
    logging.getLogger("npu_client.llm").setLevel(logging.ERROR)
    prompt = sys.stdin.read() if args.prompt == "-" else args.prompt
    sampling = {
        "max_tokens": args.max_tokens,
        "temperature": args.temperature,
        "top_k": args.top_k,
        "top_p": args.top_p,
        "seed": args.seed,
        "stop": args.stop,
    }
    try:
        with client.load_llm(args.model, n_ctx=args.ctx) as llm:
            if args.json:
                tokens = list(llm.tokens(prompt, **sampling))
                report = {
                    "model": str(args.model),
                    "text": llm.detokenize(tokens),
                    "tokens": tokens,
                    "statistics": msgspec.to_builtins(llm.statistics()),
                }
                print(msgspec.json.encode(report).decode())
                return EXIT_OK
            for piece in llm.stream(prompt, **sampling):
                sys.stdout.write(piece)
                sys.stdout.flush()
            sys.stdout.write("\n")
    except NpuError as exc:
        status = next((code for kind, code in LLM_STATUSES if isinstance(exc, kind)), None)
        if status is None:
            raise  # npud's: said by the caller
        _error(exc.message)
        return status
    return EXIT_OK


def _non_negative_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not 0 <= value < float("inf"):
        raise argparse.ArgumentTypeError(f"must be 0 or more: {text!r}")
    return value


def _run(client: Client, args: argparse.Namespace) -> int:
    run_args = RunArgs(
        args.model,
        inputs={name: Path(path) for name, path in args.input},
        shapes=dict(args.shape),
        graph=args.graph,
        constants=dict(args.constant),
    )
    try:
        report = run_once(client, run_args)
    except RunUsageError as exc:
        _error(str(exc))
        return exc.exit_status
    except (NpuError, TimeoutError):
        raise  # npud's answer, or none in time (both OSErrors too): said by the caller
    except OSError as exc:
        _error(f"cannot open {exc.filename or args.model}: {exc.strerror}")
        return EXIT_NOINPUT
    if args.json:
        print(msgspec.json.encode(report).decode())
    else:
        print(render_run(report))
    return EXIT_OK


def _add_chain_command(commands: Any) -> None:
    """``npuctl chain`` (its own function: build_parser is long enough)."""
    chain = commands.add_parser(
        "chain",
        help="load several models, run them once as one chain, print the output shapes and times",
        description=(
            "Load each MODEL (npuctl opens each file and passes its fd to npud), run them "
            "once as one chain, in the order given, in one request (several models per "
            "chunk, as a wake-word pipeline runs them): each model is a step named by its "
            "file name without the suffix, --feed feeds a step's input from an earlier "
            "step's output, and every other input is the array of its --input file or "
            "zeros. Prints each input's source, the outputs' data types and shapes (the last "
            "step's, or --output's), and the times of the loads, the chain's round trip and "
            "its DSP time; the models are unloaded at the end. Needs npud with protocol "
            "version 7."
        ),
        epilog=(
            "example (openWakeWord's three models per chunk): npuctl chain melspectrogram.onnx "
            "embedding_model.onnx hey_jarvis.onnx --feed embedding_model:input_1="
            "melspectrogram:output --feed hey_jarvis:x.1=embedding_model:conv2d_19 --input "
            "melspectrogram:input=chunk.npy"
        ),
    )
    chain.add_argument(
        "models", metavar="MODEL", type=Path, nargs="+", help="the model files, in step order"
    )
    chain.add_argument(
        "--feed",
        metavar="STEP:INPUT=STEP:OUTPUT",
        type=_assignment,
        action="append",
        default=[],
        help="feed a step's input from an earlier step's output; repeat per input",
    )
    chain.add_argument(
        "--input",
        metavar="STEP:INPUT=FILE.npy",
        type=_assignment,
        action="append",
        default=[],
        help="set a step's input from a .npy file (needs numpy), whose shape is the input's "
        "shape at load (ONNX models on the emulator); repeat per input",
    )
    chain.add_argument(
        "--shape",
        metavar="STEP:NAME=D0,D1,...",
        type=_shape,
        action="append",
        default=[],
        help="give a step's tensor NAME's whole shape at load, as npuctl run --shape does; "
        "repeat per tensor",
    )
    chain.add_argument(
        "--output",
        metavar="STEP:OUTPUT",
        action="append",
        default=[],
        help="print this output (default: every output of the last step); repeat per output",
    )
    chain.add_argument("--json", action="store_true", help="print the report as JSON")
    chain.set_defaults(run=_chain)


def _chain(client: Client, args: argparse.Namespace) -> int:
    chain_args = ChainArgs(
        args.models,
        feeds=list(args.feed),
        inputs={name: Path(path) for name, path in args.input},
        shapes=dict(args.shape),
        outputs=list(args.output),
    )
    try:
        report = run_chain_once(client, chain_args)
    except RunUsageError as exc:
        _error(str(exc))
        return exc.exit_status
    except (NpuError, TimeoutError):
        raise  # npud's answer, or none in time (both OSErrors too): said by the caller
    except OSError as exc:
        _error(f"cannot open {exc.filename}: {exc.strerror}")
        return EXIT_NOINPUT
    if args.json:
        print(msgspec.json.encode(report).decode())
    else:
        print(render_chain(report))
    return EXIT_OK


def _metrics(client: Client, args: argparse.Namespace) -> int:
    _write_metrics(render(client.status(), exclude=(os.getpid(), NPUCTL_NAME)), args.output)
    return EXIT_OK


WATCHING: Final[frozenset[Command]] = frozenset({_status, _top, _metrics})
"""Commands that only read the status: their connection says hello.watch, so npud opens
no DSP process for them (for a user other than root, it would open one of its own)."""


def _metrics_down(args: argparse.Namespace) -> None:
    """npud did not answer: say so in the metrics too, so a stale file does not linger."""
    _write_metrics(render_down(), args.output)


class OutputError(Exception):
    """--output could not be written; the message says which file and why."""


def _write_metrics(text: str, output: Path | None) -> None:
    if output is None:
        sys.stdout.write(text)
        return
    # The collector may read at any moment: never let it see half a file.
    try:
        with tempfile.NamedTemporaryFile(
            "w", dir=output.parent, prefix=f".{output.name}.", delete=False, encoding="utf-8"
        ) as tmp:
            tmp.write(text)
    except OSError as exc:
        raise OutputError(f"cannot write {output}: {exc.strerror}") from None
    try:
        os.chmod(tmp.name, 0o644)
        os.replace(tmp.name, output)
    except OSError as exc:
        os.unlink(tmp.name)
        raise OutputError(f"cannot write {output}: {exc.strerror}") from None


def main(argv: Sequence[str] | None = None) -> int:
    """Run npuctl with ``argv`` (default: the command line); returns the exit status
    (a reader that closes stdout early ends it quietly: :func:`npu_client.cli.run`)."""
    return cli.run(lambda: _main(argv))


def _main(argv: Sequence[str] | None) -> int:
    args = build_parser().parse_args(argv)
    run: Command = args.run
    try:
        code = _connect_and_run(run, args)
        on_failure: Callable[[argparse.Namespace], None] | None = getattr(args, "on_failure", None)
        if code in NPUD_FAILED and on_failure is not None:
            on_failure(args)
    except OutputError as exc:
        _error(str(exc))
        return EXIT_CANTCREAT
    return code


def _connect_and_run(run: Command, args: argparse.Namespace) -> int:
    try:
        # Commands that only look open no DSP process (one per user) for it.
        watch = run in WATCHING
        with connect(args.socket, name=NPUCTL_NAME, timeout=args.timeout, watch=watch) as client:
            return run(client, args)
    except ConnectFailed as exc:
        _error(str(exc))
        if isinstance(exc.__cause__, PermissionError):
            _error(f"hint: {permission_hint(exc.path)}")
            return EXIT_NOPERM
        return EXIT_UNAVAILABLE
    except NpuError as exc:
        _error(f"{exc.message} ({exc.name}, error {exc.code})")
        if isinstance(exc, NotPermitted):
            return EXIT_NOPERM
    except TimeoutError:
        _error(f"npud did not answer within {args.timeout:g} s")
        return EXIT_TEMPFAIL
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    return EXIT_FAILURE


def permission_hint(path: str) -> str:
    """What a person can do when the socket at ``path`` refused them (EACCES)."""
    try:
        st = os.stat(path)
    except OSError:  # the directory refused us: /run/npud is npud:npu 0750 under systemd
        owner = f"its directory {os.path.dirname(path) or '.'} is closed to you"
        root_only = False
    else:
        owner = (
            f"the socket is {_user_name(st.st_uid)}:{_group_name(st.st_gid)} "
            f"{stat.S_IMODE(st.st_mode):04o}"
        )
        root_only = st.st_uid == 0 and st.st_gid == 0
    system = (
        f"to use the system's npud, join the {CLIENT_GROUP} group "
        f"(sudo usermod -aG {CLIENT_GROUP} $USER, then log in again)"
    )
    own = (
        "or run your own: `make run` as yourself (no sudo) picks a socket of your own and "
        "prints it, `make run SOCKET=PATH` takes yours; then export NPUD_SOCKET=PATH"
    )
    if root_only:
        return (
            f"{owner}: a daemon started as root (`sudo make run`) serves root only; "
            f"stop it and {own.removeprefix('or ')}; {system}"
        )
    return f"{owner}; {system}, {own}"


def _user_name(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def _group_name(gid: int) -> str:
    try:
        return grp.getgrgid(gid).gr_name
    except KeyError:
        return str(gid)


def _error(message: str) -> None:
    print(f"npuctl: {message}", file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
