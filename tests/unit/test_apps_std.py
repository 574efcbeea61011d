"""The reverse-RPC file server: what the DSP may read, and how every bad request is answered."""

from __future__ import annotations

import os
import struct
from pathlib import Path

import pytest

from npu_protocol import AEE
from npud.fastrpc import abi
from npud.fastrpc.apps_std import (
    FCLOSE,
    FILE_EXISTS,
    FLEN,
    FOPEN,
    FOPEN_WITH_ENV,
    FREAD,
    FSEEK,
    MAX_OPEN_FILES,
    AppsStdServer,
    Reply,
)


def _strings(*texts: str) -> list[bytes]:
    data = [t.encode() + b"\0" for t in texts]
    return [struct.pack(f"<{len(data)}I", *(len(d) for d in data)), *data]


@pytest.fixture
def libdir(tmp_path: Path) -> Path:
    (tmp_path / "libecho_skel.so").write_bytes(b"0123456789" * 10)
    return tmp_path


@pytest.fixture
def server(libdir: Path) -> AppsStdServer:
    srv = AppsStdServer([libdir / "missing", libdir])
    return srv


def _std_handle(server: AppsStdServer) -> int:
    reply = server.dispatch(
        0, abi.remote_scalars_make(0, 2, 2), [struct.pack("<II", 9, 255), b"apps_std\0"], [8, 255]
    )
    handle, err = struct.unpack("<Ii", reply.outputs[0])
    assert err == 0
    return int(handle)


def _open(server: AppsStdServer, name: str, mode: str = "r") -> Reply:
    sc = abi.remote_scalars_make(FOPEN_WITH_ENV, 5, 1)
    return server.dispatch(
        _std_handle(server), sc, _strings("ADSP_LIBRARY_PATH", ";", name, mode), [4]
    )


def test_read_a_library_through_the_whole_sequence(server: AppsStdServer) -> None:
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


def test_plain_fopen_and_file_exists(server: AppsStdServer) -> None:
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
        ("missing.so", "r", AEE.ENOSUCHFILE),
        ("../etc/passwd", "r", AEE.ENOSUCHFILE),
        ("/etc/passwd", "r", AEE.ENOSUCHFILE),
        (".hidden", "r", AEE.ENOSUCHFILE),
        ("libecho_skel.so", "w", AEE.EBADPERMS),
        ("libecho_skel.so", "r+", AEE.EBADPERMS),
    ],
)
def test_files_outside_the_search_path_or_writes_are_refused(
    server: AppsStdServer, name: str, mode: str, code: AEE
) -> None:
    assert _open(server, name, mode).result == code


def test_bad_handles_and_methods(server: AppsStdServer) -> None:
    handle = _std_handle(server)
    assert (
        server.dispatch(0x999, abi.remote_scalars_make(FLEN, 1, 1), [b"\0" * 4], [8]).result
        == AEE.EINVHANDLE
    )
    assert (
        server.dispatch(
            handle, abi.remote_scalars_make(FLEN, 1, 1), [struct.pack("<I", 77)], [8]
        ).result
        == AEE.EBADFD
    )
    assert (
        server.dispatch(
            handle, abi.remote_scalars_make(FREAD, 1, 2), [struct.pack("<II", 77, 8)], [8, 8]
        ).result
        == AEE.EBADFD
    )
    assert (
        server.dispatch(
            handle, abi.remote_scalars_make(FCLOSE, 1, 0), [struct.pack("<I", 77)], []
        ).result
        == AEE.EBADFD
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
    server = AppsStdServer([libdir])
    reply = server.dispatch(
        0, abi.remote_scalars_make(0, 2, 2), [struct.pack("<II", 7, 64), b"other\0"], [8, 64]
    )
    assert reply.result == 0
    handle, err = struct.unpack("<Ii", reply.outputs[0])
    assert err == AEE.ENOSUCHMOD
    assert b"'other' is not served by npud" in reply.outputs[1]
    assert handle == 0
    # apps_std calls before the module was opened are refused
    std_handle = _std_handle(AppsStdServer([libdir]))
    flen = abi.remote_scalars_make(FLEN, 1, 1)
    assert server.dispatch(std_handle, flen, [b"\0" * 4], [8]).result == AEE.EINVHANDLE


def test_open_file_limit_and_close_releases_fds(server: AppsStdServer) -> None:
    before = len(os.listdir("/proc/self/fd"))
    for _ in range(MAX_OPEN_FILES):
        assert _open(server, "libecho_skel.so").result == 0
    assert _open(server, "libecho_skel.so").result == AEE.EOUTOFHANDLES
    handle = _std_handle(server)
    closed = server.dispatch(
        0, abi.remote_scalars_make(1, 1, 2), [struct.pack("<II", handle, 8)], [4, 8]
    )
    assert struct.unpack("<i", closed.outputs[0]) == (0,)
    assert server.open_files == 0
    assert len(os.listdir("/proc/self/fd")) == before


def test_overlong_names_and_huge_capacities_are_refused(server: AppsStdServer) -> None:
    assert _open(server, "x" * 300 + ".so").result == AEE.ENOSUCHFILE
    handle = _std_handle(server)
    huge = server.dispatch(
        handle, abi.remote_scalars_make(FREAD, 1, 2), [struct.pack("<II", 1, 8)], [8, 1 << 30]
    )
    assert huge.result == AEE.EBADPARM
