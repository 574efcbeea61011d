"""``npud trace``: record a FastRPC trace of a fixed scenario, or replay one against today's code.

``npud trace record`` opens a session on the chosen backend through a
TracingDriver and runs a scenario: ``echo`` (remotectl open of the echo skel,
an inline echo, a DMA-BUF mapped and echoed through, everything closed) or
``model`` (portal_qnn: a model file loaded from a lent descriptor, run once
on zeros, unloaded). ``npud trace replay`` plays a trace back
(npud.fastrpc.replay) and names the first divergence. The format is
docs/trace-format.md; ``npud --trace FILE`` records a whole daemon run.
"""

from __future__ import annotations

import argparse
import logging
import os
import stat
import struct
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Final, Literal

from npud.backend import select_profile
from npud.config import ConfigError, load_config
from npud.fastrpc.errors import RpcError
from npud.fastrpc.invoke_args import Capacity, Inline, Slice
from npud.fastrpc.portal_qnn import PortalQnn
from npud.fastrpc.replay import DEFAULT_TIMEOUT, TraceFormatError, replay
from npud.fastrpc.session import FastRpcSession
from npud.fastrpc.trace import TraceWriter, TracingDriver
from npud.fastrpc.trace_format import DEFAULT_CAPTURE_LIMIT
from npud.logs import print_error

ECHO_URI: Final = "file:///libecho_skel.so?echo_skel_handle_invoke&_modver=1.0&_dom=cdsp"
ECHO_SC: Final = 0x02020100
MESSAGE: Final = b"npud trace: echo"

DESCRIPTION = """\
Record a FastRPC trace of a fixed scenario on this machine's backend, or replay
a trace against this npud's session code and report the first divergence (the
call number and the field). The trace format is specified in docs/trace-format.md.
"""

EPILOG = """\
exit status: 0 success (record: the scenario passed; replay: no divergence); 1 the
scenario failed or the replay diverged; 2 bad usage, an unreadable config or trace.

examples: npud trace record --backend emulator --scenario echo echo.jsonl;
npud trace replay echo.jsonl. The emulator's fixture in tests/emulator/traces is
made with the first command.
"""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="npud trace",
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    record = commands.add_parser(
        "record",
        help="run a scenario on a traced session and write the trace",
        description="Run a scenario on a traced session and write the trace.",
    )
    record.add_argument(
        "output",
        type=Path,
        metavar="TRACE",
        help="the trace file to write: a new file, mode 0600 (it holds buffers' bytes)",
    )
    record.add_argument(
        "--replace",
        action="store_true",
        help="remove an existing regular file at TRACE first (never a symlink's target)",
    )
    record.add_argument(
        "--scenario",
        choices=("echo", "model"),
        default="echo",
        help="echo: the echo skel, inline and through a mapped DMA-BUF; model: portal_qnn "
        "loads --model, runs it once on zeros, unloads (default: echo)",
    )
    record.add_argument(
        "--model", type=Path, metavar="FILE", help="the model file of --scenario model"
    )
    record.add_argument(
        "--backend",
        choices=("auto", "kernel", "emulator"),
        default=None,
        help="as npud's --backend (default: backend.kind of the config, auto)",
    )
    record.add_argument(
        "--config", type=Path, default=None, metavar="PATH", help="as npud's --config"
    )
    record.add_argument(
        "--capture-limit",
        type=int,
        default=DEFAULT_CAPTURE_LIMIT,
        metavar="BYTES",
        help="buffers up to this size are recorded whole, larger ones as length and SHA-256 "
        f"(default: {DEFAULT_CAPTURE_LIMIT})",
    )
    play = commands.add_parser(
        "replay",
        help="play a trace back against this npud's session code",
        description="Play a trace back against this npud's session code and print the first "
        "divergence: the call number, the field, what the trace has and what the session did.",
    )
    play.add_argument("trace", type=Path, metavar="TRACE", help="the trace file to replay")
    play.add_argument(
        "--library-path",
        type=Path,
        default=None,
        metavar="DIR",
        help="serve the DSP's file reads from DIR (default: the files the trace holds)",
    )
    play.add_argument(
        "--timeout",
        type=float,
        default=DEFAULT_TIMEOUT,
        metavar="SECONDS",
        help=f"how long a replayed call waits for its turn (default: {DEFAULT_TIMEOUT:g})",
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "replay":
        return _replay(args)
    return _record(args)


def _replay(args: argparse.Namespace) -> int:
    # The replayed sessions run on recorded answers: after a divergence they fail in
    # every way, and their logs are consequences, not causes. The report says it all.
    logging.getLogger("npud").setLevel(logging.CRITICAL)
    try:
        report = replay(
            args.trace,
            library_path=[args.library_path] if args.library_path else None,
            timeout=args.timeout,
        )
    except (OSError, TraceFormatError) as exc:
        print_error(f"npud trace replay: {exc}")
        return 2
    print(report.summary())
    return 0 if report.ok else 1


def _record(args: argparse.Namespace) -> int:
    if args.scenario == "model" and args.model is None:
        print_error("npud trace record: --scenario model needs --model FILE")
        return 2
    try:
        config = load_config(args.config)
    except ConfigError as exc:
        print_error(f"npud trace record: bad configuration: {exc}")
        return 2
    profile = select_profile(config, args.backend)
    try:
        shell = profile.verify_shell()
        if args.replace:
            _remove_regular(args.output)
        writer = TraceWriter(args.output, backend=profile.kind, capture_limit=args.capture_limit)
    except FileExistsError:
        print_error(f"npud trace record: {args.output} exists (--replace removes it first)")
        return 1
    except _NotReplacedError as exc:
        print_error(f"npud trace record: {exc}")
        return 1
    except (OSError, RpcError) as exc:
        print_error(f"npud trace record: {exc}")
        return 1
    try:
        driver = TracingDriver(profile.make_driver(), writer)
        with FastRpcSession.open(
            driver, nodes=profile.nodes, library_path=profile.library_path
        ) as session:
            session.load_shell(shell.data)
            if args.scenario == "echo":
                echo_scenario(session)
            else:
                model_scenario(session, args.model)
    except (RpcError, OSError, ValueError) as exc:
        print_error(f"npud trace record: the {args.scenario} scenario failed: {exc}")
        return 1
    finally:
        writer.close()
    print(f"{args.output}: {args.scenario} scenario on the {profile.kind} backend recorded")
    return 0


def echo_scenario(session: FastRpcSession) -> None:
    """The echo skel, inline and through a mapped DMA-BUF; ValueError when a byte is wrong."""
    handle = session.remote_open(ECHO_URI)
    prim = struct.pack("<II", len(MESSAGE), len(MESSAGE))
    result = session.invoke(
        handle, ECHO_SC, [Inline(prim), Inline(MESSAGE)], [Capacity(len(MESSAGE))]
    )
    if result.rc != 0 or result.output(0) != MESSAGE:
        raise ValueError(f"inline echo returned 0x{result.rc:08X}, {result.output(0)!r}")
    buffer = session.alloc(4096)
    try:
        session.map(buffer)
        buffer.view()[: len(MESSAGE)] = MESSAGE
        result = session.invoke(
            handle,
            ECHO_SC,
            [Inline(prim), Slice(buffer, 0, len(MESSAGE))],
            [Slice(buffer, 2048, len(MESSAGE))],
        )
        echoed = bytes(buffer.view()[2048 : 2048 + len(MESSAGE)])
        if result.rc != 0 or echoed != MESSAGE:
            raise ValueError(f"DMA-BUF echo returned 0x{result.rc:08X}, {echoed!r}")
        session.unmap(buffer)
    finally:
        session.free(buffer)
    session.remote_close(handle)


def model_scenario(session: FastRpcSession, model: Path) -> None:
    """portal_qnn: load ``model`` from a lent descriptor, run it once on zeros, unload."""
    backend: Literal["kernel", "emulator"] = "emulator" if model.suffix == ".onnx" else "kernel"
    fd = os.open(model, os.O_RDONLY | os.O_CLOEXEC)
    try:
        with PortalQnn.open(session, backend=backend) as portal:
            loaded = portal.load(fd)
            graph = loaded.graphs[0]
            size = sum(spec.nbytes for spec in (*graph.inputs, *graph.outputs))
            buffer = session.alloc(max(size, 1) + 4096 * (len(graph.inputs) + len(graph.outputs)))
            try:
                offset = 0
                for index, spec in enumerate(graph.inputs):
                    portal.set_input(loaded.slot, index, Slice(buffer, offset, spec.nbytes))
                    offset += spec.nbytes
                portal.execute(loaded.slot)
                for index, spec in enumerate(graph.outputs):
                    portal.get_output(loaded.slot, index, Slice(buffer, offset, spec.nbytes))
                    offset += spec.nbytes
            finally:
                session.free(buffer)
            portal.unload(loaded.slot)
    finally:
        os.close(fd)


if __name__ == "__main__":
    sys.exit(main())


class _NotReplacedError(Exception):
    """--replace met something other than a regular file."""


def _remove_regular(path: Path) -> None:
    """Remove ``path`` when it is a regular file (not following a symlink);
    _NotReplacedError when it is anything else."""
    try:
        status = os.lstat(path)
    except FileNotFoundError:
        return
    if not stat.S_ISREG(status.st_mode):
        raise _NotReplacedError(f"{path} exists and is not a regular file; not replaced")
    os.unlink(path)
