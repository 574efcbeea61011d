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
import os
import pwd
import stat
import sys
from collections.abc import Callable, Sequence
from typing import Final

from npu_client import cli
from npu_client._blocking import connect
from npu_client._errors import ConnectFailed, NotPermitted, NpuError
from npu_client._npuctl_commands import (
    LLM_STATUSES,
    NPUCTL_NAME,
    WATCHING,
    Command,
    OutputError,
)
from npu_client._npuctl_commands import error as _error
from npu_client._npuctl_parser import DEFAULT_TIMEOUT, build_parser, version_line

__all__ = [
    "CLIENT_GROUP",
    "DEFAULT_TIMEOUT",
    "EXIT_CANTCREAT",
    "EXIT_FAILURE",
    "EXIT_INTERRUPTED",
    "EXIT_NOINPUT",
    "EXIT_NOPERM",
    "EXIT_OK",
    "EXIT_PIPE",
    "EXIT_TEMPFAIL",
    "EXIT_UNAVAILABLE",
    "EXIT_USAGE",
    "LLM_STATUSES",
    "NPUCTL_NAME",
    "NPUD_FAILED",
    "WATCHING",
    "OutputError",
    "build_parser",
    "main",
    "permission_hint",
    "version_line",
]

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

CLIENT_GROUP: Final = "npu"
"""The group whose members may connect to the system's npud (systemd/npud.socket)."""


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


if __name__ == "__main__":
    sys.exit(main())
