"""``npud trace``: record a FastRPC trace of a fixed scenario, or replay one against today's code.

``npud trace record`` opens a session on the chosen backend through a
TracingDriver and runs a scenario: ``echo`` (remotectl open of the echo skel,
an inline echo, a DMA-BUF mapped and echoed through, everything closed),
``model`` (portal_qnn: a model file loaded from a lent descriptor, run once
on zeros, unloaded), ``fidelity`` (what only a device can say: the DSP's
UNSIGNED_PD_SUPPORT, which listener and remotectl interfaces answered, what
static handles 9 and 10, which no module is known for, answer, then the echo
scenario; it prints the apps_std calls the loader made, in order) or
``suspend`` (inline echoes for ``--duration`` seconds, meant to run across a
system suspend: it prints every call that failed and the longest one, then
loads a skel, which needs the listener that waited through the suspend, and
the calls the session counts as interrupted).
``npud trace replay`` plays a trace back (npud.fastrpc.recording.replay) and names the
first divergence. The format is
docs/trace-format.md; ``npud --trace FILE`` records a whole daemon run.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import stat
import struct
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Final, Literal

from npu_protocol import describe_result
from npud.fastrpc.kernel.errors import RpcError
from npud.fastrpc.kernel.invoke_args import Capacity, Inline, Slice
from npud.fastrpc.kernel.trace_hooks import DEFAULT_CAPTURE_LIMIT
from npud.fastrpc.recording.replay import DEFAULT_TIMEOUT, TraceFormatError, replay
from npud.fastrpc.recording.trace import TraceWriter, TracingDriver
from npud.fastrpc.session import PROBED_STATIC_HANDLES, FastRpcSession
from npud.fastrpc.stubs.portal_qnn import PortalQnn
from npud.ops import cli
from npud.ops.backend import select_profile
from npud.ops.config import ConfigError, load_config
from npud.ops.logs import print_error

ECHO_URI: Final = "file:///libecho_skel.so?echo_skel_handle_invoke&_modver=1.0&_dom=cdsp"
ECHO_SC: Final = 0x02020100
MESSAGE: Final = b"npud trace: echo"
SUSPEND_CALL_GAP: Final = 0.01
"""Seconds between the suspend scenario's calls: a call is always in flight or about to
be, and the trace stays a few thousand calls long."""

DESCRIPTION = """\
Record a FastRPC trace of a fixed scenario on this machine's backend, or replay
a trace against this npud's session code and report the first divergence (the
call number and the field). The trace format is specified in docs/trace-format.md.
"""

EPILOG = """\
exit status: 0 success (record: the scenario passed; replay: no divergence); 1 the
scenario failed or the replay diverged; 64 bad usage; 65 a trace that is not one;
66 a trace that cannot be read; 69 the NPU (or its shell) is not there; 73 the output
exists or cannot be written; 78 a bad configuration; 141 stdout closed early.

examples: npud trace record --backend emulator --scenario echo echo.jsonl;
npud trace replay echo.jsonl. The emulator's fixture in tests/emulator/traces is
made with the first command.
"""


def build_parser() -> argparse.ArgumentParser:
    parser = cli.ArgumentParser(
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
        choices=("echo", "model", "fidelity", "suspend"),
        default="echo",
        help="echo: the echo skel, inline and through a mapped DMA-BUF; model: portal_qnn "
        "loads --model, runs it once on zeros, unloads; fidelity: the DSP's answers only a "
        "device can give (UNSIGNED_PD_SUPPORT, listener and remotectl interfaces, absent "
        "static handles), then echo, and the apps_std calls the loader made; suspend: inline "
        "echoes for --duration seconds, to run across a system suspend (default: echo)",
    )
    record.add_argument(
        "--duration",
        type=float,
        default=30.0,
        metavar="SECONDS",
        help="how long --scenario suspend calls the DSP (default: 30)",
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
    """Run ``npud trace`` with ``argv``; returns the exit status (the epilog)."""
    return cli.run(lambda: _main(argv))


def _main(argv: Sequence[str] | None) -> int:
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
    except OSError as exc:
        print_error(f"npud trace replay: {exc}")
        return cli.EX_NOINPUT
    except TraceFormatError as exc:
        print_error(f"npud trace replay: {exc}")
        return cli.EX_DATAERR
    print(report.summary())
    return 0 if report.ok else 1


def _record(args: argparse.Namespace) -> int:
    if args.scenario == "model" and args.model is None:
        print_error("npud trace record: --scenario model needs --model FILE")
        return cli.EX_USAGE
    try:
        config = load_config(args.config)
    except ConfigError as exc:
        print_error(f"npud trace record: bad configuration: {exc}")
        return cli.EX_CONFIG
    profile = select_profile(config, args.backend)
    try:
        shell = profile.verify_shell()
        if args.replace:
            _remove_regular(args.output)
        writer = TraceWriter(args.output, backend=profile.kind, capture_limit=args.capture_limit)
    except FileExistsError:
        print_error(f"npud trace record: {args.output} exists (--replace removes it first)")
        return cli.EX_CANTCREAT
    except _NotReplacedError as exc:
        print_error(f"npud trace record: {exc}")
        return cli.EX_CANTCREAT
    except OSError as exc:
        print_error(f"npud trace record: {exc}")
        return cli.EX_CANTCREAT
    except RpcError as exc:
        print_error(f"npud trace record: {exc}")
        return cli.EX_UNAVAILABLE
    try:
        driver = TracingDriver(profile.make_driver(), writer)
        with FastRpcSession.open(
            driver, nodes=profile.nodes, library_path=profile.library_path
        ) as session:
            session.load_shell(shell.data)
            _run_scenario(session, args)
    except (RpcError, OSError, ValueError) as exc:
        print_error(f"npud trace record: the {args.scenario} scenario failed: {exc}")
        return 1
    finally:
        writer.close()
    if args.scenario == "fidelity":
        for line in apps_std_calls(args.output):
            print(line)
    print(f"{args.output}: {args.scenario} scenario on the {profile.kind} backend recorded")
    return 0


def _run_scenario(session: FastRpcSession, args: argparse.Namespace) -> None:
    if args.scenario == "echo":
        echo_scenario(session)
    elif args.scenario == "fidelity":
        fidelity_scenario(session)
    elif args.scenario == "suspend":
        suspend_scenario(session, args.duration)
    else:
        model_scenario(session, args.model)


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


def fidelity_scenario(session: FastRpcSession) -> None:
    """Print what only the device can say (docs/hardware.md, "What only a device can
    tell"); all of it is in the trace too."""
    caps = session.capabilities
    print(f"capability API: {'yes' if caps.available else 'no (EOPNOTSUPP)'}")
    print(f"UNSIGNED_PD_SUPPORT: {caps.raw.get(1, 0)}")
    for handle in sorted(PROBED_STATIC_HANDLES):
        answer = session.probe_static_handle(handle)
        print(f"static handle {handle} (no module): {describe_result(answer)}")
    echo_scenario(session)
    stats = session.statistics()
    print(f"listener: {stats.listener or '?'} (retries {stats.listener_retries})")
    print(f"remotectl: {stats.remotectl or '?'}")
    print(f"paths refused: {stats.refused_paths}")


def suspend_scenario(session: FastRpcSession, duration: float) -> None:
    """Inline echoes for ``duration`` seconds (suspend the machine meanwhile): prints each
    call that failed and the longest call; the trace has every call's ``dur``."""
    handle = session.remote_open(ECHO_URI)
    prim = struct.pack("<II", len(MESSAGE), len(MESSAGE))
    calls, longest, failures = 0, 0.0, 0
    end = time.monotonic() + duration
    while time.monotonic() < end:
        started = time.monotonic()
        try:
            result = session.invoke(
                handle, ECHO_SC, [Inline(prim), Inline(MESSAGE)], [Capacity(len(MESSAGE))]
            )
            outcome = "" if result.rc == 0 else describe_result(result.rc)
        except RpcError as exc:
            outcome = f"{exc.code.name}: {exc}"
        took = time.monotonic() - started
        calls += 1
        longest = max(longest, took)
        if outcome:
            failures += 1
            print(f"call {calls} after {took:.3f} s: {outcome}")
        time.sleep(SUSPEND_CALL_GAP)
    stats = session.statistics()
    print(f"{calls} calls, {failures} failed, the longest {longest:.3f} s")
    print(f"listener: running={stats.listener_running} stopped={stats.listener_stopped_because!r}")
    session.remote_close(handle)
    # The listener waited in next2 through the suspend: a skel load now needs reverse
    # calls, and one the interrupted next2 took instead of the restarted one is lost.
    started = time.monotonic()
    try:
        session.remote_close(session.remote_open(ECHO_URI))
        loaded = "ok"
    except RpcError as exc:
        loaded = f"{exc.code.name}: {exc}"
    print(f"load after the suspend: {loaded} in {time.monotonic() - started:.3f} s")
    print(f"interrupted contexts: {session.statistics().interrupted_contexts}")


def apps_std_calls(trace: Path) -> list[str]:
    """The reverse calls of a trace, in order: ``apps_std fopen_with_env libecho_skel.so -> 0``."""
    lines: list[str] = []
    with open(trace, encoding="utf-8") as file:
        for text in file:
            record = json.loads(text)
            if record.get("kind") != "reverse":
                continue
            named = f" {record['file']}" if record.get("file") else ""
            lines.append(
                f"reverse: {record.get('module')} {record.get('name')}{named}"
                f" -> {record.get('result')}"
            )
    return lines


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
