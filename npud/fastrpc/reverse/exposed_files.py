"""Descriptors the daemon lends the DSP under names it generates, for the time of one load.

The daemon never opens a path a client names: a client opens its model file
with its own permissions and passes the fd. To let the DSP's loader read it
through the reverse-RPC listener like any other file, the fd is *exposed*:
registered under a fresh, unguessable name (``npud-fd-<32 hex digits>`` plus
an optional suffix) that ``apps_std`` resolves to that descriptor and to
nothing else. The name is what ``model_load`` is given.

* A name that is not registered is not found, even if a file of that name
  lies on the DSP library path: names with the prefix never reach the
  search path (:func:`is_exposed_name`).
* The DSP cannot walk out of it: it reads the bytes of that one descriptor
  (by offset, with ``pread``); a name is matched whole, and apps_std refuses
  names with a directory part anyway.
* Ownership: :meth:`ExposedFiles.expose` duplicates the caller's fd (the
  caller keeps its own); the :class:`ExposedFile` owns the duplicate and
  :meth:`ExposedFile.close` unregisters the name and closes it, exactly once.
  Reads that the DSP makes after that fail (EBADF), so a later fd that reuses
  the number is never read.

Thread-safe: exposures come and go on the daemon's threads while the listener
thread reads.
"""

from __future__ import annotations

import errno
import fcntl
import os
import secrets
import stat
import threading
from collections.abc import Callable
from types import TracebackType
from typing import Final

EXPOSED_PREFIX: Final = "npud-fd-"
MAX_SUFFIX: Final = 16


def is_exposed_name(name: str) -> bool:
    """Names in the exposed namespace: resolved by the registry only."""
    return name.startswith(EXPOSED_PREFIX)


def check_readable_file(fd: int) -> os.stat_result:
    """The fd's stat, if it is a regular file opened for reading; ValueError says why not.

    OSError (EBADF) when ``fd`` is not an open descriptor.
    """
    flags = fcntl.fcntl(fd, fcntl.F_GETFL)
    if flags & getattr(os, "O_PATH", 0):
        raise ValueError("the descriptor was opened with O_PATH: it cannot be read")
    if flags & os.O_ACCMODE == os.O_WRONLY:
        raise ValueError("the descriptor was opened write-only: it cannot be read")
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):
        raise ValueError(f"not a regular file ({_kind(info.st_mode)})")
    return info


def _kind(mode: int) -> str:
    for test, name in (
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISFIFO, "a pipe"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
    ):
        if test(mode):
            return name
    return "not a file"


class ExposedFile:
    """One lent descriptor, readable by the DSP under :attr:`name` until :meth:`close`."""

    def __init__(self, registry: ExposedFiles, name: str, fd: int) -> None:
        self._registry = registry
        self.name = name
        self._fd = fd
        self._lock = threading.Lock()
        self.bytes_read = 0
        self.on_close: Callable[[], None] | None = None
        """Called once when the exposure ends (the session's trace records it)."""

    @property
    def closed(self) -> bool:
        return self._fd < 0

    def size(self) -> int:
        with self._lock:
            return os.fstat(self._checked_fd()).st_size

    def stat(self) -> os.stat_result:
        """The descriptor's fstat; OSError(EBADF) once closed."""
        with self._lock:
            return os.fstat(self._checked_fd())

    def pread(self, offset: int, count: int) -> bytes:
        """Up to ``count`` bytes at ``offset``; OSError(EBADF) once closed."""
        with self._lock:
            data = os.pread(self._checked_fd(), count, offset)
            self.bytes_read += len(data)
            return data

    def _checked_fd(self) -> int:
        if self._fd < 0:
            raise OSError(errno.EBADF, f"{self.name} is no longer exposed")
        return self._fd

    def close(self) -> None:
        """Unregister the name and close the duplicate; idempotent."""
        self._registry.forget(self)
        with self._lock:
            fd, self._fd = self._fd, -1
        if fd >= 0:
            os.close(fd)
            if self.on_close is not None:
                self.on_close()

    def __enter__(self) -> ExposedFile:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<ExposedFile {self.name}{' closed' if self.closed else ''}>"


class ExposedFiles:
    """The registry of one FastRPC session's exposed descriptors, by name."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._files: dict[str, ExposedFile] = {}

    def expose(self, fd: int, *, suffix: str = "") -> ExposedFile:
        """Lend a duplicate of ``fd`` (a regular file open for reading; the caller
        keeps ``fd``) under a new name ending in ``suffix`` (e.g. ``".onnx"``).

        ValueError when the descriptor cannot serve (not a regular file, not
        readable) or the suffix is not a plain extension; OSError from fstat/dup.
        """
        if len(suffix) > MAX_SUFFIX or not all(c.isalnum() or c in "._-" for c in suffix):
            raise ValueError(f"suffix {suffix!r} is not a plain file-name extension")
        check_readable_file(fd)
        duplicate = os.dup(fd)  # not inheritable: os.dup's default
        name = f"{EXPOSED_PREFIX}{secrets.token_hex(16)}{suffix}"
        exposed = ExposedFile(self, name, duplicate)
        with self._lock:
            self._files[name] = exposed
        return exposed

    def lookup(self, name: str) -> ExposedFile | None:
        with self._lock:
            return self._files.get(name)

    def forget(self, exposed: ExposedFile) -> None:
        with self._lock:
            if self._files.get(exposed.name) is exposed:
                del self._files[exposed.name]

    def close_all(self) -> int:
        """Close every exposure still registered (the session is ending); returns how many."""
        with self._lock:
            files = list(self._files.values())
        for exposed in files:
            exposed.close()
        return len(files)

    def __len__(self) -> int:
        with self._lock:
            return len(self._files)
