"""The client refuses to map memory that someone else could shrink under it (SIGBUS)."""

from __future__ import annotations

import fcntl
import os

import pytest

from npu_client._memory import _map_shared

SEALS = fcntl.F_SEAL_GROW | fcntl.F_SEAL_SHRINK


def _memfd(size: int, seals: int) -> int:
    fd = os.memfd_create("test-dmabuf", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    os.ftruncate(fd, size)
    if seals:
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, seals)
    return fd


def test_a_sealed_buffer_maps() -> None:
    fd = _memfd(8192, SEALS)
    try:
        memory = _map_shared(fd, 8192)
        memory[:4] = b"abcd"
        memory.close()
    finally:
        os.close(fd)


@pytest.mark.parametrize(
    ("size", "seals", "message"),
    [
        (8192, 0, "can shrink"),
        (8192, fcntl.F_SEAL_GROW, "can shrink"),
        (4096, SEALS, "holds 4096 bytes, not 8192"),
    ],
)
def test_a_buffer_that_could_shrink_or_is_short_is_refused(
    size: int, seals: int, message: str
) -> None:
    fd = _memfd(size, seals)
    try:
        with pytest.raises(ValueError, match=message):
            _map_shared(fd, 8192)
    finally:
        os.close(fd)
