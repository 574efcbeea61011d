"""`make run`'s supervisor: run npud in the foreground and say "serving" only once it is.

npud tells systemd it is ready by sending READY=1 to $NOTIFY_SOCKET (sd_notify), after
it has read its configuration, opened its DSP session and bound its socket. This
binds a notification socket of its own, runs the command with NOTIFY_SOCKET naming
it, and prints the --ready lines when READY=1 arrives; if the command ends first, it
says so instead. It goes on reading (and discarding) what npud sends until npud
ends. It exits with the command's status (128 + N for signal N).

Standard library only: run-dev.sh runs it with the system's python3, apart from the
venv that npud runs in.

    run_until_ready.py [--prog NAME] [--ready LINE]... -- COMMAND [ARG...]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import selectors
import signal
import socket
import subprocess
import sys
import tempfile
from collections.abc import Callable
from types import FrameType


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="run_until_ready.py")
    parser.add_argument("--prog", default="run_until_ready", help="prefix of the lines printed")
    parser.add_argument("--ready", action="append", default=[], help="a line to print once ready")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- COMMAND [ARG...]")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("no command given")

    def say(line: str) -> None:
        print(f"{args.prog}: {line}", file=sys.stderr, flush=True)

    def announce() -> None:
        for line in args.ready:
            say(line)

    with (
        tempfile.TemporaryDirectory(prefix="npud-run-") as private,
        socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as notify,
    ):
        notify.bind(os.path.join(private, "notify"))
        status, ready = _supervise(command, notify, announce)
    if not ready:
        say(f"npud ended before it was ready ({_describe(status)})")
    return status


def _supervise(
    command: list[str], notify: socket.socket, on_ready: Callable[[], None]
) -> tuple[int, bool]:
    """Run ``command`` until it ends, calling ``on_ready`` when it says READY=1;
    (its status, whether it said so)."""
    env = {**os.environ, "NOTIFY_SOCKET": notify.getsockname()}
    # Ctrl-C reaches npud itself (the terminal signals the whole process group): we
    # only wait for it to stop. A handler, not SIG_IGN, so that npud does not inherit
    # an ignored SIGINT (exec resets handlers, but keeps SIG_IGN).
    signal.signal(signal.SIGINT, _ignore)
    try:
        child = subprocess.Popen(command, env=env)
    except OSError as exc:
        print(f"cannot run {command[0]}: {exc.strerror}", file=sys.stderr)
        return 127, False

    def forward(signum: int, _frame: FrameType | None) -> None:
        child.send_signal(signum)

    for signum in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, forward)
    ready = False
    ended = os.pidfd_open(child.pid)
    try:
        with selectors.DefaultSelector() as selector:
            selector.register(notify, selectors.EVENT_READ)
            selector.register(ended, selectors.EVENT_READ)
            # Read the socket for as long as the child runs, not only until READY=1:
            # npud sends STATUS= lines every few seconds, and a queue nobody reads
            # fills up (ten datagrams), after which npud drops them.
            while True:
                events = {key.fileobj for key, _ in selector.select()}
                # Read what was sent before the child ended, too.
                if _said_ready(notify) and not ready:
                    ready = True
                    on_ready()
                if ended in events:
                    break
    finally:
        os.close(ended)
    return _status(child.wait()), ready


def _said_ready(notify: socket.socket) -> bool:
    """Whether any datagram waiting on ``notify`` holds READY=1 (reads them all, so the
    queue never fills)."""
    said = False
    while True:
        try:
            datagram = notify.recv(4096, socket.MSG_DONTWAIT)
        except BlockingIOError:
            return said
        said = said or b"READY=1" in datagram.split(b"\n")


def _ignore(_signum: int, _frame: FrameType | None) -> None:
    pass


def _status(returncode: int) -> int:
    return 128 - returncode if returncode < 0 else returncode


def _describe(status: int) -> str:
    if status > 128:
        with contextlib.suppress(ValueError):  # a number that names no signal
            return f"killed by {signal.Signals(status - 128).name}"
    return f"exit status {status}"


if __name__ == "__main__":
    sys.exit(main())
