"""apps_std answers value for value what libcdsprpc's ``apps_std_imp.c`` answers.

Each row names the function of qualcomm/fastrpc's ``src/apps_std_imp.c`` (read
at 29851fd) and the value it returns there: errno values, not AEE codes (its
header, ``inc/apps_std.h``: "if operation fails errno is returned"). The DSP's
loader reads ENOENT (2) as "not here, try the next candidate".
"""

from __future__ import annotations

import errno
import logging
import struct
from collections.abc import Callable
from pathlib import Path

import pytest

from npud.fastrpc.kernel import abi
from npud.fastrpc.reverse.apps_std import (
    FCLOSE,
    FCLOSE_FD,
    FLEN,
    FOPEN,
    FOPEN_FD,
    FOPEN_WITH_ENV,
    FOPEN_WITH_ENV_FD,
    FREAD,
    FSEEK,
    STAT,
    AppsStdServer,
    Reply,
    SharedSource,
)
from tests.unit.apps_host import Host

Call = Callable[[Host, int], Reply]


class RecordingSharing:
    """The session's side of the _fd calls: remembers the size each share was asked for."""

    def __init__(self) -> None:
        self.sizes: dict[int, int] = {}

    def share(self, source: SharedSource, size: int) -> int:
        fd = 50 + len(self.sizes)
        self.sizes[fd] = size
        return fd

    def unshare(self, fd: int) -> None:
        del self.sizes[fd]


def _strings(*texts: str) -> list[bytes]:
    data = [t.encode() + b"\0" for t in texts]
    return [struct.pack(f"<{len(data)}I", *(len(d) for d in data)), *data]


def _escaped(method: int, *texts: str) -> tuple[int, list[bytes]]:
    data = [t.encode() + b"\0" for t in texts]
    prim = struct.pack(f"<I{len(data)}I", method, *(len(d) for d in data))
    return abi.remote_scalars_make(31, 1 + len(data), 1), [prim, *data]


def fopen(name: str) -> Call:
    return lambda host, h: host.dispatch(
        h, abi.remote_scalars_make(FOPEN, 3, 1), _strings(name, "r"), [4]
    )


def fopen_with_env(name: str) -> Call:
    sc = abi.remote_scalars_make(FOPEN_WITH_ENV, 5, 1)
    return lambda host, h: host.dispatch(h, sc, _strings("ADSP_LIBRARY_PATH", ";", name, "r"), [4])


def escaped(method: int, *texts: str, caps: tuple[int, ...] = (8,)) -> Call:
    sc, inputs = _escaped(method, *texts)
    return lambda host, h: host.dispatch(h, sc, inputs, list(caps))


def by_file_handle(method: int, prim: bytes, inbufs: int, caps: tuple[int, ...]) -> Call:
    sc = abi.remote_scalars_make(method, inbufs, len(caps))
    return lambda host, h: host.dispatch(h, sc, [prim], list(caps))


def fclose_fd(fd: int) -> Call:
    sc = abi.remote_scalars_make(31, 1, 0)
    return lambda host, h: host.dispatch(h, sc, [struct.pack("<Ii", FCLOSE_FD, fd)], [])


UNKNOWN = 0x77  # a file handle / fd apps_std never gave out

# (call, what apps_std_imp.c returns, where)
TABLE: list[tuple[str, Call, int]] = [
    ("fopen of a missing file", fopen("missing.so"), errno.ENOENT),  # nErr = ERRNO
    (
        "fopen_with_env of a missing file",  # fopen_from_dirlist: the last fopen's errno
        fopen_with_env("missing.so"),
        errno.ENOENT,
    ),
    (
        "fopen_fd of a missing file",  # fopen_fail: nErr = ERRNO
        escaped(FOPEN_FD, "missing.so", "r"),
        errno.ENOENT,
    ),
    (
        "fopen_with_env_fd of a missing file",  # err == ENOENT in every directory
        escaped(FOPEN_WITH_ENV_FD, "ADSP_LIBRARY_PATH", ";", "missing.so", "r"),
        errno.ENOENT,
    ),
    (
        "stat of a missing file",  # bail: nErr = ERRNO, errno of the failed fopen
        escaped(STAT, "missing.so", caps=(96,)),
        errno.ENOENT,
    ),
    ("fclose_fd of an unknown fd", fclose_fd(UNKNOWN), 0),  # not in fdlist: nErr stays 0
    (
        "fclose of an unknown file",  # apps_std_FILE_get: EBADF
        by_file_handle(FCLOSE, struct.pack("<I", UNKNOWN), 1, ()),
        errno.EBADF,
    ),
    (
        "fread of an unknown file",
        by_file_handle(FREAD, struct.pack("<II", UNKNOWN, 8), 1, (8, 8)),
        errno.EBADF,
    ),
    (
        "flen of an unknown file",
        by_file_handle(FLEN, struct.pack("<I", UNKNOWN), 1, (8,)),
        errno.EBADF,
    ),
    (
        "fseek of an unknown file",
        by_file_handle(FSEEK, struct.pack("<IiI", UNKNOWN, 0, 0), 1, ()),
        errno.EBADF,
    ),
]


@pytest.fixture
def libdir(tmp_path: Path) -> Path:
    (tmp_path / "libecho_skel.so").write_bytes(b"0123456789" * 10)
    return tmp_path


@pytest.fixture
def sharing() -> RecordingSharing:
    return RecordingSharing()


@pytest.fixture
def host(libdir: Path, sharing: RecordingSharing) -> Host:
    return Host(AppsStdServer([libdir / "missing", libdir], sharing=sharing))


def _apps_std(host: Host) -> int:
    reply = host.dispatch(
        0, abi.remote_scalars_make(0, 2, 2), [struct.pack("<II", 9, 255), b"apps_std\0"], [8, 255]
    )
    handle, err = struct.unpack("<Ii", reply.outputs[0])
    assert err == 0
    return int(handle)


@pytest.mark.parametrize(("what", "call", "expected"), TABLE, ids=[row[0] for row in TABLE])
def test_answers_as_apps_std_imp_c(host: Host, what: str, call: Call, expected: int) -> None:
    assert call(host, _apps_std(host)).result == expected, what


def test_fopen_fd_announces_and_shares_the_file_size_not_whole_pages(
    host: Host, sharing: RecordingSharing
) -> None:
    # apps_std_fopen_fd: *len = statbuf.st_size, and fastrpc_mmap(..., *len, FASTRPC_MAP_FD).
    reply = escaped(FOPEN_FD, "libecho_skel.so", "r")(host, _apps_std(host))
    assert reply.result == 0
    fd, length = struct.unpack("<ii", reply.outputs[0])
    assert (length, sharing.sizes[fd]) == (100, 100)


def test_a_refused_path_is_logged_once_with_the_path_and_counted(
    host: Host, caplog: pytest.LogCaptureFixture
) -> None:
    handle = _apps_std(host)
    with caplog.at_level(logging.WARNING, logger="npud.fastrpc.reverse.apps_std"):
        for _ in range(3):
            assert fopen("/etc/passwd")(host, handle).result == errno.ENOENT
        assert escaped(STAT, "/opt/firmware/libx.so", caps=(96,))(host, handle).result == (
            errno.ENOENT
        )
        assert fopen("missing.so")(host, handle).result == errno.ENOENT  # missing, not refused
    refusals = [r for r in caplog.records if "outside the library directories" in r.getMessage()]
    assert [getattr(r, "path", None) for r in refusals] == ["/etc/passwd", "/opt/firmware/libx.so"]
    assert host.std.refused_paths == 4
