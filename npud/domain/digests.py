"""The SHA-256 of model files, remembered by what the file is.

A shared model load is found by the digest of the model's bytes (``npud.requests.models``), and
hashing them is most of what a shared load costs: about 40 ms of a 48 MiB model. The
second client of a model nearly always loads the very file the first one did (the same
wheel, the same path), so the digest is remembered under the file's identity: device,
inode, size, and the times of its last modification and last change.

Why the identity may stand for the content: any write to a file moves its ctime, and no
one can set a ctime back (``utimensat`` sets the other times and stamps ctime with the
present). Two guards close what is left:

* the digest is remembered only when the identity was the same before and after the
  bytes were read (a write during the reading is noticed);
* and only for a file whose last change is at least :data:`QUIET_SECONDS` old: a
  filesystem stamps times at a coarse clock's granularity, so a write landing within the
  same tick as the one before could leave ctime as it was.

The identity includes the device, so a client can only ever hit a digest taken of a file
it has open itself (and can read): the cache shares nothing between users that the files
did not. Each domain has its own, bounded (:data:`ENTRIES`, least recently used out).
"""

from __future__ import annotations

import collections
import hashlib
import os
import threading
import time
from typing import Final

CHUNK: Final = 1 << 20
ENTRIES: Final = 64
QUIET_SECONDS: Final = 1.0

Identity = tuple[int, int, int, int, int, int]


def identity(stat: os.stat_result, size: int) -> Identity:
    """What a file is, for the digest of its first ``size`` bytes."""
    return (stat.st_dev, stat.st_ino, stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns, size)


def sha256_of(fd: int, size: int) -> tuple[str, int]:
    """The SHA-256 of the first ``size`` bytes of the file open on ``fd``, read with pread
    (the caller's offset stays), and how many bytes there were (fewer when the file
    shrank meanwhile). Raises OSError."""
    digest = hashlib.sha256()
    offset = 0
    while offset < size and (chunk := os.pread(fd, min(CHUNK, size - offset), offset)):
        digest.update(chunk)
        offset += len(chunk)
    return digest.hexdigest(), offset


class FileDigests:
    """See the module docstring. Thread-safe: the loader lanes of every domain share
    nothing but each domain's own instance, and its lock is held only around the table."""

    def __init__(self, entries: int = ENTRIES, quiet_seconds: float = QUIET_SECONDS) -> None:
        self._entries = entries
        self._quiet_ns = int(quiet_seconds * 1e9)
        self._known: collections.OrderedDict[Identity, tuple[str, int]] = collections.OrderedDict()
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    def __len__(self) -> int:
        with self._lock:
            return len(self._known)

    def sha256(self, fd: int, size: int) -> tuple[str, int]:
        """:func:`sha256_of` ``fd``'s first ``size`` bytes, remembered when it may be.
        Raises OSError."""
        before = identity(os.fstat(fd), size)
        with self._lock:
            known = self._known.get(before)
            if known is not None:
                self._known.move_to_end(before)
                self.hits += 1
                return known
            self.misses += 1
        answer = sha256_of(fd, size)
        after = identity(os.fstat(fd), size)
        quiet = time.time_ns() - before[4] >= self._quiet_ns
        if after == before and quiet:
            with self._lock:
                self._known[before] = answer
                self._known.move_to_end(before)
                while len(self._known) > self._entries:
                    self._known.popitem(last=False)
        return answer

    def clear(self) -> None:
        with self._lock:
            self._known.clear()
