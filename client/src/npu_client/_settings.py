"""Where npud listens, what a client calls itself, and which priority it asks for."""

from __future__ import annotations

import os
import re
import stat
import sys
from typing import Final, Literal

from npu_protocol import Priority

DEFAULT_SOCKET_PATH: Final = "/run/npud/npud.sock"
"""npud's default socket (``[daemon] socket`` in its config)."""

SOCKET_ENV: Final = "NPUD_SOCKET"
"""Environment variable that overrides :data:`DEFAULT_SOCKET_PATH`."""

MAX_NAME_LENGTH: Final = 64
_NAME: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:@+-]{0,63}")
_NOT_NAME_CHAR: Final = re.compile(r"[^A-Za-z0-9._:@+-]")
_FALLBACK_NAME: Final = "python"


def socket_path(path: str | os.PathLike[str] | None = None) -> str:
    """``path`` if given, else ``$NPUD_SOCKET`` if set and non-empty, else the default."""
    if path is not None:
        resolved = os.fspath(path)
        if not resolved:
            raise ValueError("the socket path is empty")
        return resolved
    return os.environ.get(SOCKET_ENV) or DEFAULT_SOCKET_PATH


def client_name(name: str | None = None) -> str:
    """``name`` checked against the protocol's rule, or one made from the program name.

    The protocol allows 1 to 64 characters from ``A-Z a-z 0-9 . _ : @ + -``,
    starting with a letter or digit. The default is the program's name (the
    basename of ``sys.argv[0]`` without ``.py``; the package for ``python -m``)
    with other characters replaced by ``-``, clipped to 64.
    """
    if name is None:
        return default_client_name()
    if not isinstance(name, str):
        raise TypeError(f"name must be a str, not {type(name).__name__}")
    if not _NAME.fullmatch(name):
        raise ValueError(
            f"client name {name!r} is not allowed: use 1 to {MAX_NAME_LENGTH} characters "
            "from A-Z a-z 0-9 . _ : @ + -, starting with a letter or digit"
        )
    return name


def default_client_name() -> str:
    argv0 = sys.argv[0] if sys.argv else ""
    program = os.path.basename(argv0)
    if program == "__main__.py":  # python -m package: the package says more
        program = os.path.basename(os.path.dirname(argv0))
    program = program.removesuffix(".py")
    cleaned = _NOT_NAME_CHAR.sub("-", program).lstrip("._:@+-")[:MAX_NAME_LENGTH]
    return cleaned or _FALLBACK_NAME


def priority_class(priority: Priority | str) -> Priority:
    """``priority`` as a :class:`Priority`; a clear ValueError for anything else."""
    try:
        return Priority(priority)
    except ValueError:
        choices = ", ".join(member.value for member in Priority)
        raise ValueError(f"unknown priority {priority!r}: choose one of {choices}") from None


SocketOrigin = Literal["argument", "environment", "default"]
"""Who named the socket: the caller (``--socket``, ``connect(path)``), $NPUD_SOCKET, or
nobody (the default)."""


def socket_origin(path: str | os.PathLike[str] | None) -> SocketOrigin:
    """Who names the socket :func:`socket_path` resolves ``path`` to."""
    if path is not None:
        return "argument"
    return "environment" if os.environ.get(SOCKET_ENV) else "default"


def connect_failure_message(path: str, exc: OSError, origin: SocketOrigin = "default") -> str:
    """One line for people: what failed, and what to try. The hint suggests
    $NPUD_SOCKET only when nobody named the path: a path the caller gave is the one
    to check."""
    reason = exc.strerror or str(exc) or type(exc).__name__
    not_a_socket = _not_a_socket(path)
    if not_a_socket:
        reason = f"it is {not_a_socket}, not a socket"
        hint = "name npud's socket itself (npud.sock, by default)"
        if origin == "default":
            hint += f"; set {SOCKET_ENV} if npud listens elsewhere"
    elif isinstance(exc, PermissionError):
        hint = (
            "is your user in the socket's group "
            "(npu under systemd, else socket_group in npud's config)?"
        )
    elif isinstance(exc, TimeoutError):
        hint = "npud is not accepting connections; is it overloaded or stopped?"
    elif origin == "argument":
        hint = "is npud running, and is that path its socket?"
    elif origin == "environment":
        hint = f"is npud running? {SOCKET_ENV} names that path: is it npud's socket?"
    else:
        hint = f"is npud running? set {SOCKET_ENV} to its socket path if it listens elsewhere"
    return f"cannot connect to npud at {path}: {reason}; {hint}"


def _not_a_socket(path: str) -> str:
    """ "a directory" or "a regular file" etc. when ``path`` exists but is no socket;
    empty when it is a socket, is missing, or cannot be looked at."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return ""
    if stat.S_ISSOCK(mode):
        return ""
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISREG(mode):
        return "a regular file"
    return "a special file"
