"""What npu's command-line tools share: exit statuses, usage errors, a closed stdout.

``npuctl`` and npud's commands (``npud``, ``npud doctor``, ``npud trace``,
``npud-sign-shell``) exit with the statuses of BSD's ``sysexits.h`` (the
values of Python's ``os.EX_*``), so a script or a systemd unit can tell a
mistake in how a tool was called from a daemon that is not there. Each tool's
``--help`` (and man page) says which it uses for what:

======  ====================  ==================================================
status  name                  meaning
======  ====================  ==================================================
0       ``EXIT_OK``           done
1       ``EXIT_FAILURE``      it ran and the answer is no: a check or step
                              failed, npud refused a request
64      ``EX_USAGE``          a bad command line (the message says which
                              argument)
65      ``EX_DATAERR``        an input file's contents are wrong
66      ``EX_NOINPUT``        an input file is missing or unreadable
69      ``EX_UNAVAILABLE``    what it needs is not there: npud not listening,
                              no NPU, a library not installed
71      ``EX_OSERR``          the system refused (fork, a sandbox)
73      ``EX_CANTCREAT``      an output file (or npud's socket) cannot be made
74      ``EX_IOERR``          reading a path failed
75      ``EX_TEMPFAIL``       try again later: npud did not answer in time, or
                              another npud holds the socket
77      ``EX_NOPERM``         not allowed (npud, or its socket's permissions)
78      ``EX_CONFIG``         a bad configuration
130     ``EXIT_INTERRUPTED``  Ctrl-C
141     ``EXIT_PIPE``         stdout was closed early (``npuctl status |
                              head -1``)
======  ====================  ==================================================

A tool decides its status before it logs anything as started (npud checks its
configuration, socket and trace file first).

``EXIT_PIPE`` is what a shell reports for a program that SIGPIPE ended, as
``cat`` is in ``cat big | head -1``: the reader has all it wanted, so nothing
is said on stderr (:func:`run`).
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
    """argparse's parser whose usage errors exit with ``EX_USAGE`` (64), not 2.

    Its subparsers are of this class too (argparse makes them with the parent's).
    """

    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        self.exit(EX_USAGE, f"{self.prog}: error: {message}\n")


def run(main: Callable[[], int]) -> int:
    """``main()``'s exit status, or ``EXIT_PIPE`` (silently) when stdout was closed.

    A reader that stops early (``| head``, ``| grep -q``) closes the pipe;
    writing to it then raises BrokenPipeError. Like a C program that SIGPIPE
    ends, the tool stops quietly: no traceback, no message, and stdout is
    pointed at /dev/null so that the interpreter's last flush cannot raise
    again. A BrokenPipeError from anything but stdout (a socket) is not
    swallowed.
    """
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
        _silence_stdout()
        return EXIT_PIPE
    return code


def stdout_closed() -> bool:
    """The reader of stdout has gone (a pipe or socket whose other end is closed)."""
    try:
        fd = sys.stdout.fileno()
    except (AttributeError, OSError, ValueError):  # replaced by something without an fd
        return False
    poller = select.poll()
    poller.register(fd, 0)  # POLLERR and POLLHUP are always reported
    return any(events & (select.POLLERR | select.POLLHUP) for _, events in poller.poll(0))


def _silence_stdout() -> None:
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, sys.stdout.fileno())
    finally:
        os.close(devnull)
