"""npuctl's command line: the argparse parser of its options and subcommands (the
man page and the bash completion are generated from it: scripts/generate_docs.py)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any, Final

import npu_protocol
from npu_client import _npuctl_args as arg
from npu_client import _npuctl_commands as command
from npu_client import cli
from npu_client._settings import DEFAULT_SOCKET_PATH, SOCKET_ENV
from npu_client._top import SORT_KEYS
from npu_client._version import __version__

DEFAULT_TIMEOUT: Final = 30.0


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
        type=arg.socket_path,
        help=f"npud's socket (default: ${SOCKET_ENV} if set, else {DEFAULT_SOCKET_PATH})",
    )
    parser.add_argument(
        "--timeout",
        metavar="SECONDS",
        type=arg.positive_seconds,
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
    status.set_defaults(run=command.status)

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
    selftest.set_defaults(run=command.selftest)

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
    metrics.set_defaults(run=command.metrics, on_failure=command.metrics_down)

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
        type=arg.positive_seconds,
        default=1.0,
        help="time between frames, over which rates are measured (default: 1)",
    )
    top.add_argument(
        "--count",
        metavar="N",
        type=arg.positive_int,
        default=None,
        help="stop after N frames (default: until Ctrl-C; --once is --count 1)",
    )
    top.set_defaults(run=command.top)

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
        type=arg.assignment,
        action="append",
        default=[],
        help="set input NAME from a .npy file (needs numpy), whose shape is NAME's shape at "
        "load (ONNX models on the emulator); repeat per input",
    )
    run.add_argument(
        "--shape",
        metavar="NAME=D0,D1,...",
        type=arg.shape,
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
        type=arg.constant,
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
    run.set_defaults(run=command.run)
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
        type=arg.positive_int,
        default=256,
        help="stop after N tokens (default: 256)",
    )
    llm.add_argument(
        "--temperature",
        metavar="T",
        type=arg.non_negative_float,
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
        type=arg.positive_int,
        default=512,
        help="tokens of context, prompt and answer together (default: 512)",
    )
    llm.add_argument(
        "--json",
        action="store_true",
        help="print one JSON object at the end: the text, its tokens and the statistics",
    )
    llm.set_defaults(run=command.llm)
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
        type=arg.non_negative_seconds,
        default=None,
        help="the outage of ssr (default: 1), the latency added by latency (default: 0)",
    )
    debug.add_argument(
        "--code",
        type=arg.dsp_result,
        default=0x8000040E,
        help="the DSP result fail-next-invoke answers (default: 0x8000040E, AEE_EBADPARM)",
    )
    debug.set_defaults(run=command.debug)
    return parser


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
        type=arg.assignment,
        action="append",
        default=[],
        help="feed a step's input from an earlier step's output; repeat per input",
    )
    chain.add_argument(
        "--input",
        metavar="STEP:INPUT=FILE.npy",
        type=arg.assignment,
        action="append",
        default=[],
        help="set a step's input from a .npy file (needs numpy), whose shape is the input's "
        "shape at load (ONNX models on the emulator); repeat per input",
    )
    chain.add_argument(
        "--shape",
        metavar="STEP:NAME=D0,D1,...",
        type=arg.shape,
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
    chain.set_defaults(run=command.chain)


def version_line() -> str:
    """``npuctl X (npu-protocol Y, wire protocol N)``: X matches ``npud --version``."""
    return (
        f"npuctl {__version__} (npu-protocol {npu_protocol.__version__}, "
        f"wire protocol {npu_protocol.PROTOCOL_VERSION})"
    )
