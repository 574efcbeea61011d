"""Logging, configured once in ``main``: JSON lines for the journal, readable text on a TTY.

``npud.fastrpc`` logs through the standard library (it knows nothing of
structlog); both end up in the same renderer, so every line has the same
shape. Connection handlers bind the client's pid, uid and name onto their
logger so each line says whose request it was.

Event names are stable keys an operator can search for: values go in fields
(``log.info("client welcomed", priority=...)``; from the standard library,
``log.info("fastrpc session opened", extra={"device": ...})``), never into the
event text.

When stderr is the journal (systemd sets ``$JOURNAL_STREAM`` to its device and
inode), every line starts with its syslog priority, ``<3>`` for an error,
``<4>`` for a warning, ``<6>`` for info, ``<7>`` for debug, which journald
strips and files (``SyslogLevelPrefix=`` keeps its default, yes), so
``journalctl -u npud -p warning`` finds refused connections and failed reloads.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Mapping
from typing import Final, Literal, TextIO

import structlog

JOURNAL_STREAM_ENV: Final = "JOURNAL_STREAM"

_SHARED: list[structlog.typing.Processor] = [
    structlog.contextvars.merge_contextvars,
    structlog.stdlib.add_log_level,
    structlog.stdlib.add_logger_name,
    structlog.stdlib.ExtraAdder(),
    structlog.processors.TimeStamper(fmt="iso", utc=True),
]

# syslog(3) priorities: LOG_CRIT 2, LOG_ERR 3, LOG_WARNING 4, LOG_INFO 6, LOG_DEBUG 7.
_PRIORITIES: Final = (
    (logging.CRITICAL, 2),
    (logging.ERROR, 3),
    (logging.WARNING, 4),
    (logging.INFO, 6),
)
_DEBUG_PRIORITY: Final = 7


def syslog_priority(levelno: int) -> int:
    """The syslog priority of a :mod:`logging` level number."""
    for threshold, priority in _PRIORITIES:
        if levelno >= threshold:
            return priority
    return _DEBUG_PRIORITY


def stderr_is_journal(
    stream: TextIO | None = None, environ: Mapping[str, str] | None = None
) -> bool:
    """True when ``stream`` (stderr) is the journal's stream socket, per ``$JOURNAL_STREAM``.

    systemd sets the variable to ``DEVICE:INODE`` of the stream it connects to
    stdout/stderr; a child whose stderr was redirected elsewhere inherits the
    variable, so it is compared with what the stream really is.
    """
    value = (os.environ if environ is None else environ).get(JOURNAL_STREAM_ENV, "")
    device, sep, inode = value.partition(":")
    if not sep or not device.isdigit() or not inode.isdigit():
        return False
    try:
        st = os.fstat((sys.stderr if stream is None else stream).fileno())
    except (OSError, ValueError):  # closed, or not backed by a file descriptor
        return False
    return (st.st_dev, st.st_ino) == (int(device), int(inode))


class JournalPrefixFormatter(logging.Formatter):
    """Prefix each line of what ``inner`` formats with the record's ``<N>`` syslog priority.

    A JSON event is one line; a console traceback is several, and each gets
    the prefix so none of them falls to journald's default priority.
    """

    def __init__(self, inner: logging.Formatter) -> None:
        super().__init__()
        self._inner = inner

    def format(self, record: logging.LogRecord) -> str:
        prefix = f"<{syslog_priority(record.levelno)}>"
        return "\n".join(prefix + line for line in self._inner.format(record).split("\n"))


def configure_logging(fmt: Literal["auto", "json", "console"], level: str = "info") -> None:
    use_json = fmt == "json" or (fmt == "auto" and not sys.stderr.isatty())
    renderer: structlog.typing.Processor = (
        structlog.processors.JSONRenderer()
        if use_json
        else structlog.dev.ConsoleRenderer(colors=False)
    )
    formatter: logging.Formatter = structlog.stdlib.ProcessorFormatter(
        foreign_pre_chain=_SHARED,
        processors=[
            structlog.stdlib.ProcessorFormatter.remove_processors_meta,
            structlog.processors.format_exc_info if use_json else _identity,
            renderer,
        ],
    )
    if stderr_is_journal():
        formatter = JournalPrefixFormatter(formatter)
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(formatter)
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    structlog.configure(
        processors=[*_SHARED, structlog.stdlib.ProcessorFormatter.wrap_for_formatter],
        logger_factory=structlog.stdlib.LoggerFactory(),
        wrapper_class=structlog.stdlib.BoundLogger,
        cache_logger_on_first_use=True,
    )


def set_level(level: str) -> None:
    logging.getLogger().setLevel(level.upper())


def print_error(message: str, *, stream: TextIO | None = None) -> None:
    """Write one line for people and ``systemctl status``, at error priority in the journal.

    For the start-up failures ``main`` reports before (or instead of) logging.
    """
    out = sys.stderr if stream is None else stream
    prefix = f"<{syslog_priority(logging.ERROR)}>" if stderr_is_journal(out) else ""
    print(prefix + message, file=out, flush=True)


def _identity(
    _logger: object, _name: str, event: structlog.typing.EventDict
) -> structlog.typing.EventDict:
    return event
