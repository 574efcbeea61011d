"""``npud``: the command line. Configuration, logging and start-up failures live here.

Start-up order: the shell-signature verifier's child process is started right
after the command line is parsed, and only then are the daemon's modules
imported, so the child's interpreter and ``cryptography`` load meanwhile
(``npud.fastrpc.trust.shell_verifier``). On the emulator the PD zygote is started
as soon as the configuration is read and the profile chosen (both cheap), before
logging and the daemon are imported (``Profile.zygote_started``), for the same
reason: its numpy and onnxruntime load while the daemon imports. What no
client needs before its first model load or its DSP's first heap growth (the
model code, the IDL parse) is imported on that first use. ``npud doctor`` is
imported only for ``npud doctor``, ``npud trace`` only for ``npud trace``.
"""

from __future__ import annotations

import argparse
import socket
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from npud import __version__
from npud.fastrpc.trust.shell_verifier import ShellVerifier
from npud.ops import cli
from npud.ops.config import DEFAULT_CONFIG, DEFAULT_SOCKET

if TYPE_CHECKING:
    from npud.daemon.server import BoundSocket
    from npud.fastrpc.recording.trace import TraceWriter
    from npud.ops.backend import Profile
    from npud.ops.config import Config

DESCRIPTION = """\
npud owns the FastRPC session to the Hexagon NPU (the CDSP) and brokers it to
local clients over a Unix socket: it verifies and loads the DSP shell, hands out
DMA-BUFs, maps them into the DSP and runs remote calls for its clients.

Without a device (no /dev/fastrpc-cdsp*) it runs on the built-in emulator of the
kernel driver and the DSP, with a development shell signed by a development key.
"""

EPILOG = """\
exit status: sysexits, each failure one line on stderr saying what and how to fix
it; what the command line or the configuration decides is decided before
"starting" is logged. 0 after a clean stop (SIGTERM/SIGINT); 64 a bad command
line (--socket naming something that is not a socket included); 69 the NPU is not
there (no device node, the FastRPC session does not open); 71
the system refused the emulator (fork, sandbox); 73 the socket or the trace file
cannot be created; 74 the socket's path cannot be inspected; 75 another npud is
listening on the socket; 78 a bad configuration (the file, its socket path or
group, [emulator], socket activation's fds, a DSP shell its verification refuses);
141 stdout closed early (npud doctor | head -1).

signals: SIGTERM/SIGINT stop cleanly (clients are told, calls on the DSP get
daemon.shutdown_grace_s seconds); SIGHUP re-reads the config file: [access], the
limits and log_level apply without dropping clients, other keys need a restart.

systemd: socket activation (LISTEN_FDS, one AF_UNIX stream socket) is used when
present, otherwise npud binds its own socket; with NOTIFY_SOCKET it reports
READY, STATUS, RELOADING, STOPPING and, with WatchdogSec=, WATCHDOG pings while
healthy. It never waits on that socket: when its reader lets the queue fill, STATUS
and WATCHDOG messages are dropped (a warning says how many) and READY, RELOADING
and STOPPING are retried for 5 s.

logs: one line per event on stderr, JSON unless stderr is a terminal; event names
are stable keys and values are fields. When stderr is the journal ($JOURNAL_STREAM)
each line starts with its syslog priority: journalctl -u npud -p warning.

environment: NPUD_SOCKET is read by clients (npuctl, npu_client, npud doctor), not
by the daemon.

npud doctor [--root DIR] [--config PATH] [--socket PATH] [--json]: check the NPU
installation and the running daemon, one line per check with its fix (npud doctor --help).

npud trace record|replay: record a FastRPC trace of a fixed scenario, or replay a trace
against this npud and report the first divergence (npud trace --help).
"""


def build_parser() -> argparse.ArgumentParser:
    parser = cli.ArgumentParser(
        prog="npud",
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--config",
        type=Path,
        default=None,
        metavar="PATH",
        help=f"TOML configuration file (default: {DEFAULT_CONFIG} if it exists, else defaults)",
    )
    parser.add_argument(
        "--socket",
        default=None,
        metavar="PATH",
        help=f"listening socket (default: daemon.socket of the config, {DEFAULT_SOCKET})",
    )
    parser.add_argument(
        "--backend",
        choices=("auto", "kernel", "emulator"),
        default=None,
        help="auto: the kernel driver where /dev/fastrpc-cdsp* exists, else the emulator "
        "(default: backend.kind of the config, auto)",
    )
    parser.add_argument(
        "--log-format",
        choices=("json", "console"),
        default=None,
        help="json for the journal, console for people (default: json unless stderr is a terminal)",
    )
    parser.add_argument(
        "--trace",
        type=Path,
        default=None,
        metavar="FILE",
        help="record every FastRPC driver call, session operation and reverse-RPC call to FILE "
        "(docs/trace-format.md; it holds buffer and file bytes: keep it private) "
        "(default: daemon.trace of the config, none)",
    )
    parser.add_argument("--version", action="version", version=f"npud {__version__}")
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run npud (or ``npud doctor``, ``npud trace``) with ``argv``; returns the exit
    status (sysexits: the epilog; a reader that closes stdout early ends it quietly)."""
    return cli.run(lambda: _main(sys.argv[1:] if argv is None else argv))


def _main(arguments: list[str]) -> int:
    if arguments[:1] == ["doctor"]:
        from npud.ops import doctor  # noqa: PLC0415  (a tool: the daemon never loads it)

        return doctor.main(arguments[1:])
    if arguments[:1] == ["trace"]:
        from npud.ops import trace_cli  # noqa: PLC0415  (a tool: the daemon never loads it)

        return trace_cli.main(arguments[1:])
    args = build_parser().parse_args(arguments)
    verifier = ShellVerifier()
    verifier.start()
    try:
        return _start(args, verifier)
    finally:
        verifier.close()  # a no-op once the shell was verified


def _start(args: argparse.Namespace, verifier: ShellVerifier) -> int:
    # Imported here, after the verifier started: see the module docstring.
    from npud.ops.backend import device_present, select_profile  # noqa: PLC0415  (light)
    from npud.ops.config import ConfigError, load_config  # noqa: PLC0415

    renamed: list[str] = []  # logged once logging is configured, to the journal too
    try:
        config = load_config(args.config, warn=renamed.append)
    except ConfigError as exc:
        from npud.ops.logs import print_error  # noqa: PLC0415

        print_error(f"npud: bad configuration: {exc}")
        return cli.EX_CONFIG
    profile = select_profile(config, args.backend)
    with profile.zygote_started():  # the emulator's, first: it imports while the daemon does
        from npud.ops.logs import configure_logging  # noqa: PLC0415  (structlog: after the zygote)

        configure_logging(args.log_format or config.daemon.log_format, config.daemon.log_level)
        _log_renamed(renamed)
        if profile.kind == "kernel" and not device_present(profile.nodes):
            return _fail(
                f"no FastRPC device node ({', '.join(profile.nodes)}): is the CDSP up "
                "(cat /sys/class/remoteproc/*/state)? `npud doctor` explains; "
                "--backend emulator runs without a device",
                cli.EX_UNAVAILABLE,
            )
        profile.lend_verifier(verifier)
        return _serve(args, config, profile)


def _serve(args: argparse.Namespace, config: Config, profile: Profile) -> int:
    # Imported here, after the verifier started: see the module docstring.
    import structlog  # noqa: PLC0415

    # What can be refused for how npud was called or configured is decided before
    # "starting" is logged: the socket, then the trace file.
    listening = _listen(args, config)
    if isinstance(listening, int):
        return listening
    trace: TraceWriter | None = None
    try:
        try:
            profile, trace = _traced(args, config, profile)
        except _TraceError as exc:
            return _fail(str(exc), cli.EX_CANTCREAT)
        log = structlog.get_logger("npud")
        log.info(
            "starting",
            version=__version__,
            backend=profile.kind,
            why=profile.reason,
            socket=str(listening.path),
            socket_activated=listening.bound is None,
        )
        if trace is not None:
            log.info("tracing FastRPC calls", file=str(trace.path))
        return _run(args, config, profile, listening.sock)
    finally:
        listening.sock.close()
        if listening.bound is not None:
            listening.bound.unlink_if_ours()
        if trace is not None:
            trace.close()


@dataclass
class _Listening:
    sock: socket.socket
    path: Path
    bound: BoundSocket | None
    """The socket npud bound itself (None: systemd's, from socket activation)."""


def _listen(args: argparse.Namespace, config: Config) -> _Listening | int:
    """The socket to serve, or the exit status when there is none (said on stderr)."""
    from npud.daemon.sd import ActivationError, activated_socket  # noqa: PLC0415
    from npud.daemon.server import StartupError, bind_socket  # noqa: PLC0415

    try:
        activated = activated_socket()
    except ActivationError as exc:
        return _fail(f"socket activation: {exc}", cli.EX_CONFIG)
    if activated is not None:  # systemd owns the socket file
        return _Listening(activated.sock, Path(activated.path), None)
    path = Path(args.socket or config.daemon.socket)
    try:
        bound = bind_socket(path, config.daemon.socket_mode_bits, config.daemon.socket_group)
    except StartupError as exc:
        return _fail(str(exc), _socket_status(exc, named=args.socket is not None))
    return _Listening(bound.sock, path, bound)


def _run(
    args: argparse.Namespace, config: Config, profile: Profile, listener: socket.socket
) -> int:
    """Serve until stopped: 0, or the exit status of a start-up that failed."""
    import trio  # noqa: PLC0415

    from npud.daemon.broker import Broker  # noqa: PLC0415
    from npud.daemon.sd import Notifier  # noqa: PLC0415
    from npud.daemon.server import Daemon  # noqa: PLC0415
    from npud.fastrpc.kernel.errors import RpcError, ShellVerifyError  # noqa: PLC0415
    from npud.ops.backend import EmulatorStartError  # noqa: PLC0415
    from npud.ops.config import load_config  # noqa: PLC0415

    config_path = args.config

    def reload_config() -> Config:
        renamed: list[str] = []
        config = load_config(config_path, warn=renamed.append)
        _log_renamed(renamed)
        return config

    notifier = Notifier()
    try:
        broker = Broker(config, profile)
        daemon = Daemon(config, broker, listener, notifier=notifier, reload_config=reload_config)
        trio.run(daemon.run)
    except RpcError as exc:
        notifier.send(f"STATUS=start-up failed: {exc}")
        # A shell its verification refuses is the installation's state, not a missing NPU.
        status = cli.EX_CONFIG if isinstance(exc, ShellVerifyError) else cli.EX_UNAVAILABLE
        return _fail(f"cannot start the NPU session: {exc}", status)
    except EmulatorStartError as exc:
        notifier.send(f"STATUS=start-up failed: {exc}")
        configured = isinstance(exc.__cause__, ValueError)  # [emulator] names what is not there
        return _fail(
            f"cannot start the emulator: {exc}", cli.EX_CONFIG if configured else cli.EX_OSERR
        )
    except KeyboardInterrupt:
        return 0
    finally:
        notifier.close()
    return 0


def _socket_status(exc: Exception, *, named: bool) -> int:
    """The exit status for a socket npud cannot listen on (``named``: --socket gave it)."""
    from npud.daemon.server import SocketPathError  # noqa: PLC0415  (imported already)

    if isinstance(exc, SocketPathError):
        return cli.EX_USAGE if named else cli.EX_CONFIG
    return getattr(exc, "exit_status", cli.EX_CANTCREAT)


def _log_renamed(lines: list[str]) -> None:
    """The config's keys that have new names (config_renames), one warning each."""
    import structlog  # noqa: PLC0415  (after the verifier started)

    for line in lines:
        structlog.get_logger("npud").warning("renamed configuration key", detail=line)


class _TraceError(Exception):
    """The trace file cannot be written; ``str()`` is the one-line reason."""


def _traced(
    args: argparse.Namespace, config: Config, profile: Profile
) -> tuple[Profile, TraceWriter | None]:
    """The profile with ``--trace`` (or daemon.trace) open, and the writer (its owner
    closes it); the profile unchanged and None without a trace."""
    import dataclasses  # noqa: PLC0415

    from npud.fastrpc.recording.trace import TraceWriter  # noqa: PLC0415  (only when tracing)

    path = args.trace or (Path(config.daemon.trace) if config.daemon.trace else None)
    if path is None:
        return profile, None
    try:
        trace = TraceWriter(path, backend=profile.kind)
    except FileExistsError:
        raise _TraceError(
            f"cannot write the trace {path}: it exists (npud writes a new file only: "
            "move the old one away or name another)"
        ) from None
    except OSError as exc:
        raise _TraceError(f"cannot write the trace {path}: {exc.strerror}") from None
    return dataclasses.replace(profile, trace=trace), trace


def _fail(message: str, status: int) -> int:
    """Exactly one line, for people and for `systemctl status` alike (an error in the
    journal); returns ``status``, the exit status (sysexits: the epilog)."""
    from npud.ops.logs import print_error  # noqa: PLC0415  (structlog: after the verifier started)

    print_error(f"npud: {message}")
    return status


if __name__ == "__main__":
    sys.exit(main())
