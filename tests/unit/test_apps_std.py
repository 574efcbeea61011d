"""The reverse-RPC file server: what the DSP may read, and how every bad request is answered."""

from __future__ import annotations

import errno
import os
import struct
from pathlib import Path

import pytest

from npu_protocol import AEE
from npud.fastrpc.kernel import abi
from npud.fastrpc.reverse.apps_std import (
    FCLOSE,
    FCLOSE_FD,
    FILE_EXISTS,
    FIRST_FILE_HANDLE,
    FLEN,
    FOPEN,
    FOPEN_FD,
    FOPEN_WITH_ENV,
    FOPEN_WITH_ENV_FD,
    FREAD,
    FSEEK,
    GET_SEARCH_PATHS_WITH_ENV,
    MAX_OPEN_FILES,
    STAT,
    AppsStdServer,
    Reply,
    SharedSource,
    SharingError,
)
from tests.unit.apps_host import Host


def _strings(*texts: str) -> list[bytes]:
    data = [t.encode() + b"\0" for t in texts]
    return [struct.pack(f"<{len(data)}I", *(len(d) for d in data)), *data]


@pytest.fixture
def libdir(tmp_path: Path) -> Path:
    (tmp_path / "libecho_skel.so").write_bytes(b"0123456789" * 10)
    return tmp_path


@pytest.fixture
def server(libdir: Path) -> Host:
    return Host(AppsStdServer([libdir / "missing", libdir]))


def _std_handle(server: Host) -> int:
    """apps_std's handle, opened once per host as the DSP does."""
    if server.apps_std_handle is None:
        reply = server.dispatch(
            0,
            abi.remote_scalars_make(0, 2, 2),
            [struct.pack("<II", 9, 255), b"apps_std\0"],
            [8, 255],
        )
        handle, err = struct.unpack("<Ii", reply.outputs[0])
        assert err == 0
        server.apps_std_handle = int(handle)
    return server.apps_std_handle


def _open(server: Host, name: str, mode: str = "r") -> Reply:
    sc = abi.remote_scalars_make(FOPEN_WITH_ENV, 5, 1)
    return server.dispatch(
        _std_handle(server), sc, _strings("ADSP_LIBRARY_PATH", ";", name, mode), [4]
    )


def test_read_a_library_through_the_whole_sequence(server: Host) -> None:
    handle = _std_handle(server)
    opened = _open(server, "libecho_skel.so")
    assert opened.result == 0
    (file,) = struct.unpack("<I", opened.outputs[0])
    length = server.dispatch(
        handle, abi.remote_scalars_make(FLEN, 1, 1), [struct.pack("<I", file)], [8]
    )
    assert struct.unpack("<Q", length.outputs[0]) == (100,)
    read = server.dispatch(
        handle, abi.remote_scalars_make(FREAD, 1, 2), [struct.pack("<II", file, 64)], [8, 64]
    )
    assert read.result == 0
    assert struct.unpack("<ii", read.outputs[0]) == (64, 0)
    assert read.outputs[1] == (b"0123456789" * 7)[:64]
    rest = server.dispatch(
        handle, abi.remote_scalars_make(FREAD, 1, 2), [struct.pack("<II", file, 64)], [8, 64]
    )
    assert struct.unpack("<ii", rest.outputs[0]) == (36, 1)
    assert len(rest.outputs[1]) == 64  # outputs always come back at the announced capacity
    seek = server.dispatch(
        handle, abi.remote_scalars_make(FSEEK, 1, 0), [struct.pack("<IiI", file, 95, 0)], []
    )
    assert seek.result == 0
    assert server.open_files == 1
    closed = server.dispatch(
        handle, abi.remote_scalars_make(FCLOSE, 1, 0), [struct.pack("<I", file)], []
    )
    assert closed.result == 0
    assert server.open_files == 0
    assert server.files_served == 1


def test_plain_fopen_and_file_exists(server: Host) -> None:
    handle = _std_handle(server)
    opened = server.dispatch(
        handle, abi.remote_scalars_make(FOPEN, 3, 1), _strings("libecho_skel.so", "rb"), [4]
    )
    assert opened.result == 0
    exists = server.dispatch(
        handle, abi.remote_scalars_make(FILE_EXISTS, 2, 1), _strings("libecho_skel.so"), [1]
    )
    assert exists.outputs == (b"\x01",)
    missing = server.dispatch(
        handle, abi.remote_scalars_make(FILE_EXISTS, 2, 1), _strings("nope.so"), [1]
    )
    assert missing.outputs == (b"\x00",)
    server.close()
    assert server.open_files == 0


@pytest.mark.parametrize(
    ("name", "mode", "code"),
    [
        ("missing.so", "r", errno.ENOENT),
        ("../etc/passwd", "r", errno.ENOENT),
        ("/etc/passwd", "r", errno.ENOENT),
        (".hidden", "r", errno.ENOENT),
        ("libecho_skel.so", "w", errno.EACCES),
        ("libecho_skel.so", "r+", errno.EACCES),
    ],
)
def test_files_outside_the_search_path_or_writes_are_refused(
    server: Host, name: str, mode: str, code: int
) -> None:
    assert _open(server, name, mode).result == code


def test_bad_handles_and_methods(server: Host) -> None:
    handle = _std_handle(server)
    assert (
        server.dispatch(0x999, abi.remote_scalars_make(FLEN, 1, 1), [b"\0" * 4], [8]).result
        == AEE.EINVHANDLE
    )
    assert (
        server.dispatch(
            handle, abi.remote_scalars_make(FLEN, 1, 1), [struct.pack("<I", 77)], [8]
        ).result
        == errno.EBADF
    )
    assert (
        server.dispatch(
            handle, abi.remote_scalars_make(FREAD, 1, 2), [struct.pack("<II", 77, 8)], [8, 8]
        ).result
        == errno.EBADF
    )
    assert (
        server.dispatch(
            handle, abi.remote_scalars_make(FCLOSE, 1, 0), [struct.pack("<I", 77)], []
        ).result
        == errno.EBADF
    )
    assert (
        server.dispatch(handle, abi.remote_scalars_make(30, 0, 0), [], []).result
        == AEE.EUNSUPPORTED
    )
    assert (
        server.dispatch(handle, abi.remote_scalars_make(FLEN, 1, 1), [b"\0"], [8]).result
        == AEE.EBADPARM
    )
    with_handles = abi.remote_scalars_makex(0, FLEN, 1, 1, 1, 0)
    assert server.dispatch(handle, with_handles, [b"\0" * 4], [8]).result == AEE.EBADPARM


def test_unknown_modules_get_a_dlerror(libdir: Path) -> None:
    server = Host(AppsStdServer([libdir]))
    reply = server.dispatch(
        0, abi.remote_scalars_make(0, 2, 2), [struct.pack("<II", 7, 64), b"other\0"], [8, 64]
    )
    assert reply.result == 0
    handle, err = struct.unpack("<Ii", reply.outputs[0])
    assert err == AEE.ENOSUCHMOD
    assert b"'other' is not served by npud" in reply.outputs[1]
    assert handle == 0
    # apps_std calls before the module was opened are refused
    std_handle = _std_handle(Host(AppsStdServer([libdir])))
    flen = abi.remote_scalars_make(FLEN, 1, 1)
    assert server.dispatch(std_handle, flen, [b"\0" * 4], [8]).result == AEE.EINVHANDLE


def test_open_file_limit_and_close_releases_fds(server: Host) -> None:
    before = len(os.listdir("/proc/self/fd"))
    for _ in range(MAX_OPEN_FILES):
        assert _open(server, "libecho_skel.so").result == 0
    assert _open(server, "libecho_skel.so").result == errno.EMFILE
    handle = _std_handle(server)
    closed = server.dispatch(
        0, abi.remote_scalars_make(1, 1, 2), [struct.pack("<II", handle, 8)], [4, 8]
    )
    assert struct.unpack("<i", closed.outputs[0]) == (0,)
    assert server.open_files == 0
    assert len(os.listdir("/proc/self/fd")) == before


def test_overlong_names_and_huge_capacities_are_refused(server: Host) -> None:
    assert _open(server, "x" * 300 + ".so").result == errno.ENOENT
    handle = _std_handle(server)
    huge = server.dispatch(
        handle, abi.remote_scalars_make(FREAD, 1, 2), [struct.pack("<II", 1, 8)], [8, 1 << 30]
    )
    assert huge.result == AEE.EBADPARM


# --- the calls the DSP's loader may use besides streaming -------------------------------


class FakeSharing:
    """The session's side of the _fd calls: records what was shared, hands out fds."""

    def __init__(self) -> None:
        self.shared: dict[int, bytes] = {}
        self.next_fd = 40
        self.refuse: int | None = None

    def share(self, source: SharedSource, size: int) -> int:
        if self.refuse is not None:
            raise SharingError(self.refuse)
        fd, self.next_fd = self.next_fd, self.next_fd + 1
        self.shared[fd] = source.read_at(0, size)
        return fd

    def unshare(self, fd: int) -> None:
        if self.refuse is not None:
            raise SharingError(self.refuse)
        del self.shared[fd]


def _escape(method: int, *strings: str) -> tuple[int, list[bytes]]:
    """A call with an id from 31 on: method 31, the id first in primIn, then the lengths."""
    data = [s.encode() + b"\0" for s in strings]
    prim = struct.pack(f"<I{len(data)}I", method, *(len(d) for d in data))
    return abi.remote_scalars_make(31, 1 + len(data), 1), [prim, *data]


@pytest.fixture
def sharing() -> FakeSharing:
    return FakeSharing()


@pytest.fixture
def host(libdir: Path, sharing: FakeSharing) -> Host:
    (libdir / "cdsp").mkdir()
    (libdir / "cdsp" / "libdomain_skel.so").write_bytes(b"from the domain directory")
    (libdir / "libdomain_skel.so").write_bytes(b"from the plain directory")
    return Host(AppsStdServer([libdir / "missing", libdir], sharing=sharing))


def _fopen_fd(host: Host, name: str, mode: str = "r") -> Reply:
    sc, inputs = _escape(FOPEN_FD, name, mode)
    return host.dispatch(_std_handle(host), sc, inputs, [8])


def test_fopen_fd_shares_the_whole_file_and_fclose_fd_gives_it_back(
    host: Host, sharing: FakeSharing
) -> None:
    reply = _fopen_fd(host, "libecho_skel.so")
    assert reply.result == 0
    fd, length = struct.unpack("<ii", reply.outputs[0])
    assert (length, sharing.shared[fd]) == (100, b"0123456789" * 10)
    close = abi.remote_scalars_make(31, 1, 0)
    handle = _std_handle(host)
    assert host.dispatch(handle, close, [struct.pack("<Ii", FCLOSE_FD, fd)], []).result == 0
    assert sharing.shared == {}
    # libcdsprpc's fclose_fd of an fd it does not know is a success.
    assert host.dispatch(handle, close, [struct.pack("<Ii", FCLOSE_FD, fd)], []).result == 0


def test_fopen_with_env_fd_prefers_the_domain_directory(host: Host, sharing: FakeSharing) -> None:
    sc, inputs = _escape(FOPEN_WITH_ENV_FD, "ADSP_LIBRARY_PATH", ";", "libdomain_skel.so", "r")
    reply = host.dispatch(_std_handle(host), sc, inputs, [8])
    assert reply.result == 0
    fd, _ = struct.unpack("<ii", reply.outputs[0])
    assert sharing.shared[fd] == b"from the domain directory"


@pytest.mark.parametrize(
    ("name", "mode", "code"),
    [
        ("missing.so", "r", errno.ENOENT),
        ("../libecho_skel.so", "r", errno.ENOENT),
        ("/etc/passwd", "r", errno.ENOENT),
        ("libecho_skel.so", "w", errno.EACCES),
    ],
)
def test_fopen_fd_refusals(
    host: Host, sharing: FakeSharing, name: str, mode: str, code: int
) -> None:
    assert _fopen_fd(host, name, mode).result == code
    assert sharing.shared == {}


def test_a_refused_share_is_reported_and_leaves_nothing(host: Host, sharing: FakeSharing) -> None:
    sharing.refuse = AEE.ENOMEMORY.dsp
    assert _fopen_fd(host, "libecho_skel.so").result == AEE.ENOMEMORY.dsp
    assert host.std.shared_files == 0


def test_closing_gives_back_what_the_dsp_left_shared(host: Host, sharing: FakeSharing) -> None:
    for _ in range(3):
        assert _fopen_fd(host, "libecho_skel.so").result == 0
    assert host.std.shared_files == 3
    host.close()
    assert sharing.shared == {}
    assert host.std.shared_files == 0


def test_stat_of_bare_names_absolute_paths_and_exposed_descriptors(
    host: Host, libdir: Path
) -> None:
    handle = _std_handle(host)

    def stat(name: str) -> tuple[int, tuple[int, ...] | None]:
        sc, inputs = _escape(STAT, name)
        sc = abi.remote_scalars_make(31, 2, 1)
        reply = host.dispatch(handle, sc, inputs, [96])
        return reply.result, struct.unpack(
            "<QQQIIQQqqqqqq", reply.outputs[0]
        ) if reply.outputs else None

    result, fields = stat("libecho_skel.so")
    assert result == 0
    assert fields is not None
    info = os.stat(libdir / "libecho_skel.so")
    assert (fields[2], fields[6], fields[7]) == (info.st_ino, 100, int(info.st_atime))
    assert stat(f"{libdir}/libecho_skel.so")[0] == 0
    assert stat(f"{libdir}/cdsp/libdomain_skel.so")[0] == 0
    assert stat(f"{libdir}/../{libdir.name}/libecho_skel.so")[0] == errno.ENOENT
    assert stat(f"{libdir}/missing/libecho_skel.so")[0] == errno.ENOENT  # not a listed dir
    assert stat("/etc/passwd")[0] == errno.ENOENT
    assert stat("nothing.so")[0] == errno.ENOENT


def test_get_search_paths_lists_the_existing_directories(host: Host, libdir: Path) -> None:
    handle = _std_handle(host)

    def paths(slots: int, capacity: int) -> tuple[int, int, list[bytes]]:
        env, delim = b"ADSP_LIBRARY_PATH\0", b";\0"
        prim = struct.pack("<III", len(env), len(delim), slots)
        sizes = struct.pack(f"<{slots}I", *([capacity] * slots))
        sc = abi.remote_scalars_make(GET_SEARCH_PATHS_WITH_ENV, 4, 1 + slots)
        reply = host.dispatch(handle, sc, [prim, env, delim, sizes], [8, *([capacity] * slots)])
        assert reply.result == 0
        count, longest = struct.unpack_from("<IH", reply.outputs[0])
        return count, longest, [out.split(b"\0")[0] for out in reply.outputs[1:]]

    expected = [f"{libdir}/cdsp".encode(), str(libdir).encode()]
    count, longest, listed = paths(4, 256)
    assert (count, longest) == (2, len(expected[0]) + 1)
    assert listed == [*expected, b"", b""]
    # Fewer slots than paths: the count says how many to ask for.
    assert paths(1, 256)[:1] == (2,)
    assert paths(1, 256)[2] == expected[:1]
    # A slot too small for a path stays empty; one of exactly its length loses the last byte.
    assert paths(2, 4)[2] == [b"", b""]
    size = len(expected[1])
    assert paths(2, size)[2][1] == expected[1][:-1]


def test_get_search_paths_refuses_inconsistent_marshalling(host: Host) -> None:
    handle = _std_handle(host)
    prim = struct.pack("<III", 18, 2, 2)
    sizes = struct.pack("<2I", 64, 64)
    sc = abi.remote_scalars_make(GET_SEARCH_PATHS_WITH_ENV, 4, 3)
    inputs = [prim, b"ADSP_LIBRARY_PATH\0", b";\0", sizes]
    assert host.dispatch(handle, sc, inputs, [8, 64, 32]).result == AEE.EBADPARM
    assert host.dispatch(handle, sc, inputs, [4, 64, 64]).result == AEE.EBADPARM


def test_unknown_escaped_ids_and_bad_strings(host: Host) -> None:
    handle = _std_handle(host)
    sc, inputs = _escape(99, "x")
    assert host.dispatch(handle, sc, inputs, [8]).result == AEE.EUNSUPPORTED
    sc, inputs = _escape(FOPEN_FD, "libecho_skel.so", "r")
    inputs[1] = inputs[1][:-1]  # the NUL the length counts is missing
    assert host.dispatch(handle, sc, inputs, [8]).result == AEE.EBADPARM
    # The escape without an id at all.
    assert host.dispatch(handle, abi.remote_scalars_make(31, 1, 0), [b"\0"], []).result == (
        AEE.EBADPARM
    )


def test_file_handles_start_at_100_and_reuse_the_lowest_free_one(server: Host) -> None:
    # Issue 29, item 6: apps_std_imp.c's APPS_FD_BASE; a handle of 1 could be taken
    # for a descriptor by a DSP library that checks.
    handle = _std_handle(server)

    def opened() -> int:
        reply = _open(server, "libecho_skel.so")
        assert reply.result == 0
        (file,) = struct.unpack("<I", reply.outputs[0])
        return int(file)

    assert [opened(), opened(), opened()] == [FIRST_FILE_HANDLE, 101, 102]
    closed = server.dispatch(
        handle, abi.remote_scalars_make(FCLOSE, 1, 0), [struct.pack("<I", 101)], []
    )
    assert closed.result == 0
    assert opened() == 101  # the lowest free number, as apps_std_FILE_alloc fills gaps
    assert opened() == 103
    unknown = server.dispatch(
        handle, abi.remote_scalars_make(FLEN, 1, 1), [struct.pack("<I", 1)], [8]
    )
    assert unknown.result == errno.EBADF
