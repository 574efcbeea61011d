"""What npud's commands share: exit statuses, usage errors, a closed stdout.

The same conventions as ``npuctl``'s (:mod:`npu_client.cli` explains them):
sysexits statuses (Python's ``os.EX_*``), usage errors exiting 64, and a
reader that closes stdout early ending the command quietly with 141. They are
written out again here rather than imported because ``npud`` parses its
command line before anything else loads (``npud.daemon.main``: the shell verifier's
child starts first), and importing ``npu_client`` would load the whole client
library first; ``tests/unit/test_cli.py`` holds the two to the same behaviour.
"""

from __future__ import annotations

import argparse
import os
import select
import signal
import sys
from collections.abc import Callable
from typing import Final, NoReturn

EXIT_OK: Final = os.EX_OK
EXIT_FAILURE: Final = 1
EX_USAGE: Final = os.EX_USAGE
EX_DATAERR: Final = os.EX_DATAERR
EX_NOINPUT: Final = os.EX_NOINPUT
EX_UNAVAILABLE: Final = os.EX_UNAVAILABLE
EX_OSERR: Final = os.EX_OSERR
EX_CANTCREAT: Final = os.EX_CANTCREAT
EX_IOERR: Final = os.EX_IOERR
EX_TEMPFAIL: Final = os.EX_TEMPFAIL
EX_NOPERM: Final = os.EX_NOPERM
EX_CONFIG: Final = os.EX_CONFIG
EXIT_INTERRUPTED: Final = 128 + signal.SIGINT
EXIT_PIPE: Final = 128 + signal.SIGPIPE


class ArgumentParser(argparse.ArgumentParser):
    """argparse's parser whose usage errors exit with ``EX_USAGE`` (64), not 2; its
    subparsers are of this class too."""

    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        self.exit(EX_USAGE, f"{self.prog}: error: {message}\n")


def run(main: Callable[[], int]) -> int:
    """``main()``'s exit status, or ``EXIT_PIPE`` (silently, stdout then /dev/null) when
    the reader of stdout closed it early; a BrokenPipeError of anything else propagates."""
    try:
        try:
            code = main()
        except SystemExit as exc:
            # argparse's --help and --version: it swallows the write's EPIPE itself.
            if exc.code in (0, None) and stdout_closed():
                raise BrokenPipeError from None
            raise
        sys.stdout.flush()
    except BrokenPipeError:
        if not stdout_closed():
            raise
        devnull = os.open(os.devnull, os.O_WRONLY)
        try:
            os.dup2(devnull, sys.stdout.fileno())
        finally:
            os.close(devnull)
        return EXIT_PIPE
    return code


def parse_status(exc: SystemExit) -> int:
    """The status of argparse's own exit (--help, a usage error), for a command that
    returns it rather than exiting; raises BrokenPipeError for help that went to a closed
    stdout (argparse swallows the write's EPIPE), which :func:`run` turns into 141."""
    if exc.code in (0, None) and stdout_closed():
        raise BrokenPipeError
    return exc.code if isinstance(exc.code, int) else EX_USAGE


def stdout_closed() -> bool:
    """The reader of stdout has gone (a pipe or socket whose other end is closed)."""
    try:
        fd = sys.stdout.fileno()
    except (AttributeError, OSError, ValueError):
        return False
    poller = select.poll()
    poller.register(fd, 0)  # POLLERR and POLLHUP are always reported
    return any(events & (select.POLLERR | select.POLLHUP) for _, events in poller.poll(0))
