"""``npud``: the command line. Configuration, logging and start-up failures live here."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import structlog
import trio

from npud import __version__
from npud.backend import select_profile
from npud.broker import Broker
from npud.config import DEFAULT_CONFIG, DEFAULT_SOCKET, ConfigError, load_config
from npud.fastrpc.errors import FastRpcError
from npud.logs import configure_logging
from npud.server import Daemon, StartupError, bind_socket

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

environment: NPUD_SOCKET is read by clients (npuctl, npu_client), not by npud.
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
    parser.add_argument("--version", action="version", version=f"npud {__version__}")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        config = load_config(args.config)
    except ConfigError as exc:
        print(f"npud: bad configuration: {exc}", file=sys.stderr)
        return 2
    configure_logging(args.log_format or config.daemon.log_format, config.daemon.log_level)
    profile = select_profile(config, args.backend)
    socket_path = Path(args.socket or config.daemon.socket)
    log.info(
        "starting",
        version=__version__,
        backend=profile.kind,
        why=profile.reason,
        socket=str(socket_path),
    )
    try:
        bound = bind_socket(socket_path, config.daemon.socket_mode_bits, config.daemon.socket_group)
    except StartupError as exc:
        return _fail(str(exc))
    try:
        broker = Broker(config, profile)
        trio.run(Daemon(config, broker, bound.sock).run)
    except FastRpcError as exc:
        return _fail(f"cannot start the NPU session: {exc}")
    except KeyboardInterrupt:
        return 0
    finally:
        bound.sock.close()
        bound.unlink_if_ours()
    return 0


def _fail(message: str) -> int:
    log.error("start-up failed", error=message)
    print(f"npud: {message}", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
