"""``npud``: the command line. Configuration, logging and start-up failures live here."""

from __future__ import annotations

import argparse
import dataclasses
import socket
import sys
from pathlib import Path
from typing import Final

import structlog
import trio

from npud import __version__, doctor, trace_cli
from npud.backend import Profile, device_present, select_profile
from npud.broker import Broker
from npud.config import DEFAULT_CONFIG, DEFAULT_SOCKET, Config, ConfigError, load_config
from npud.fastrpc.errors import RpcError
from npud.fastrpc.trace import TraceWriter
from npud.logs import configure_logging, print_error
from npud.sd import ActivationError, Notifier, activated_socket
from npud.server import BoundSocket, Daemon, StartupError, bind_socket

log = structlog.get_logger("npud")

DESCRIPTION = """\
npud owns the FastRPC session to the Hexagon NPU (the CDSP) and brokers it to
local clients over a Unix socket: it verifies and loads the DSP shell, hands out
DMA-BUFs, maps them into the DSP and runs remote calls for its clients.

Without a device (no /dev/fastrpc-cdsp*) it runs on the built-in emulator of the
kernel driver and the DSP, with a development shell signed by a development key.
"""

EPILOG = """\
exit status: 0 after a clean stop (SIGTERM/SIGINT); 1 when start-up fails (the
one-line message says what and how to fix it); 2 for a bad command line or config.

signals: SIGTERM/SIGINT stop cleanly (clients are told, calls on the DSP get
daemon.shutdown_grace seconds); SIGHUP re-reads the config file: [access], the
limits and log_level apply without dropping clients, other keys need a restart.

systemd: socket activation (LISTEN_FDS, one AF_UNIX stream socket) is used when
present, otherwise npud binds its own socket; with NOTIFY_SOCKET it reports
READY, STATUS, RELOADING, STOPPING and, with WatchdogSec=, WATCHDOG pings while
healthy.

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
    parser = argparse.ArgumentParser(
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


SUBCOMMANDS: Final = {"doctor": doctor.main, "trace": trace_cli.main}
"""Commands npud dispatches by hand before parsing its own options."""


def main(argv: list[str] | None = None) -> int:
    arguments = sys.argv[1:] if argv is None else argv
    if arguments[:1] and arguments[0] in SUBCOMMANDS:
        return SUBCOMMANDS[arguments[0]](arguments[1:])
    args = build_parser().parse_args(arguments)
    try:
        config = load_config(args.config)
    except ConfigError as exc:
        print_error(f"npud: bad configuration: {exc}")
        return 2
    configure_logging(args.log_format or config.daemon.log_format, config.daemon.log_level)
    profile = select_profile(config, args.backend)
    if profile.kind == "kernel" and not device_present(profile.nodes):
        return _fail(
            f"no FastRPC device node ({', '.join(profile.nodes)}): is the CDSP up "
            "(cat /sys/class/remoteproc/*/state)? `npud doctor` explains; "
            "--backend emulator runs without a device"
        )
    try:
        activated = activated_socket()
    except ActivationError as exc:
        return _fail(f"socket activation: {exc}")
    socket_path = Path(activated.path if activated else (args.socket or config.daemon.socket))
    log.info(
        "starting",
        version=__version__,
        backend=profile.kind,
        why=profile.reason,
        socket=str(socket_path),
        socket_activated=activated is not None,
    )
    bound: BoundSocket | None = None
    if activated is not None:
        listener = activated.sock  # systemd owns the socket file
    else:
        try:
            bound = bind_socket(
                socket_path, config.daemon.socket_mode_bits, config.daemon.socket_group
            )
        except StartupError as exc:
            return _fail(str(exc))
        listener = bound.sock
    notifier = Notifier()
    try:
        return _run_daemon(config, profile, listener, notifier, args)
    finally:
        listener.close()
        if bound is not None:
            bound.unlink_if_ours()
        notifier.close()


def _run_daemon(
    config: Config,
    profile: Profile,
    listener: socket.socket,
    notifier: Notifier,
    args: argparse.Namespace,
) -> int:
    """Serve until stopped; the trace (``--trace`` or daemon.trace) lives as long."""
    config_path = args.config

    def reload_config() -> Config:
        return load_config(config_path)

    trace_path = args.trace or (Path(config.daemon.trace) if config.daemon.trace else None)
    trace: TraceWriter | None = None
    if trace_path is not None:
        try:
            trace = TraceWriter(trace_path, backend=profile.kind)
        except OSError as exc:
            return _fail(f"cannot write the trace {trace_path}: {exc.strerror}")
        profile = dataclasses.replace(profile, trace=trace)
        log.info("tracing FastRPC calls", file=str(trace_path))
    try:
        broker = Broker(config, profile)
        daemon = Daemon(config, broker, listener, notifier=notifier, reload_config=reload_config)
        trio.run(daemon.run)
    except RpcError as exc:
        notifier.send(f"STATUS=start-up failed: {exc}")
        return _fail(f"cannot start the NPU session: {exc}")
    except KeyboardInterrupt:
        return 0
    finally:
        if trace is not None:
            trace.close()
    return 0


def _fail(message: str) -> int:
    """Exactly one line, for people and for `systemctl status` alike (an error in the journal)."""
    print_error(f"npud: {message}")
    return 1


if __name__ == "__main__":
    sys.exit(main())
