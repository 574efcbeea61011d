"""Descriptors lent to the DSP: names, ownership, and what apps_std serves (and refuses) through them."""

from __future__ import annotations

import errno
import os
import re
import struct
from collections.abc import Iterator
from pathlib import Path

import pytest

from npud.fastrpc.kernel import abi
from npud.fastrpc.reverse.apps_std import (
    FCLOSE,
    FILE_EXISTS,
    FLEN,
    FOPEN_WITH_ENV,
    FREAD,
    FSEEK,
    AppsStdServer,
    Reply,
)
from npud.fastrpc.reverse.exposed_files import (
    EXPOSED_PREFIX,
    ExposedFiles,
    check_readable_file,
    is_exposed_name,
)
from tests.unit.apps_host import Host

CONTENT = bytes(range(256)) * 4


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


@pytest.fixture
def model_fd(tmp_path: Path) -> Iterator[int]:
    path = tmp_path / "model.onnx"
    path.write_bytes(CONTENT)
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    yield fd
    os.close(fd)


def test_expose_lends_a_duplicate_under_a_fresh_name(model_fd: int) -> None:
    registry = ExposedFiles()
    before = open_fds()
    first = registry.expose(model_fd, suffix=".onnx")
    second = registry.expose(model_fd)
    assert re.fullmatch(r"npud-fd-[0-9a-f]{32}\.onnx", first.name)
    assert first.name != second.name
    assert is_exposed_name(first.name)
    assert len(registry) == 2
    assert open_fds() == before + 2
    assert registry.lookup(first.name) is first
    assert first.size() == len(CONTENT)
    assert first.pread(250, 10) == CONTENT[250:260]
    assert first.bytes_read == 10
    first.close()
    first.close()  # exactly once: the second is a no-op
    assert registry.lookup(first.name) is None
    with pytest.raises(OSError, match="no longer exposed"):
        first.pread(0, 1)
    assert registry.close_all() == 1
    assert second.closed
    assert open_fds() == before
    assert os.pread(model_fd, 4, 0) == CONTENT[:4]  # the caller's fd is untouched


def test_descriptors_that_cannot_serve_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "f"
    path.write_bytes(b"x")
    read_end, write_end = os.pipe()
    directory = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    write_only = os.open(path, os.O_WRONLY)
    path_only = os.open(path, os.O_PATH)
    try:
        for fd, reason in (
            (read_end, "not a regular file \\(a pipe\\)"),
            (directory, "not a regular file \\(a directory\\)"),
            (write_only, "write-only"),
            (path_only, "O_PATH"),
        ):
            with pytest.raises(ValueError, match=reason):
                check_readable_file(fd)
            with pytest.raises(ValueError, match=reason):
                ExposedFiles().expose(fd)
    finally:
        for fd in (read_end, write_end, directory, write_only, path_only):
            os.close(fd)
    with pytest.raises(OSError, match="Bad file descriptor"):
        check_readable_file(write_end)  # closed now


@pytest.mark.parametrize("suffix", ["/x", "../a", "a" * 17, ".on nx"])
def test_suffixes_are_plain_extensions(model_fd: int, suffix: str) -> None:
    with pytest.raises(ValueError, match="extension"):
        ExposedFiles().expose(model_fd, suffix=suffix)


# --- through apps_std --------------------------------------------------------


def _strings(*texts: str) -> list[bytes]:
    data = [t.encode() + b"\0" for t in texts]
    return [struct.pack(f"<{len(data)}I", *(len(d) for d in data)), *data]


class Dsp:
    """The DSP's side of apps_std, as the loader calls it."""

    def __init__(self, std: AppsStdServer) -> None:
        self.server = Host(std)
        reply = self.server.dispatch(
            0, abi.remote_scalars_make(0, 2, 2), [struct.pack("<II", 9, 64), b"apps_std\0"], [8, 64]
        )
        self.handle, error = struct.unpack("<Ii", reply.outputs[0])
        assert error == 0

    def call(self, method: int, inputs: list[bytes], caps: list[int]) -> Reply:
        sc = abi.remote_scalars_make(method, len(inputs), len(caps))
        return self.server.dispatch(self.handle, sc, inputs, caps)

    def fopen(self, name: str) -> Reply:
        return self.call(FOPEN_WITH_ENV, _strings("ADSP_LIBRARY_PATH", ";", name, "r"), [4])

    def read(self, file: int, count: int) -> bytes:
        reply = self.call(FREAD, [struct.pack("<II", file, count)], [8, count])
        assert reply.result == 0
        got, _eof = struct.unpack("<ii", reply.outputs[0])
        return reply.outputs[1][:got]

    def exists(self, name: str) -> bool:
        return self.call(FILE_EXISTS, _strings(name), [1]).outputs == (b"\x01",)


def test_the_dsp_reads_an_exposed_descriptor_by_name(model_fd: int, tmp_path: Path) -> None:
    registry = ExposedFiles()
    dsp = Dsp(AppsStdServer([tmp_path], registry))
    with registry.expose(model_fd, suffix=".onnx") as exposed:
        assert dsp.exists(exposed.name)
        one, two = (dsp.fopen(exposed.name) for _ in range(2))
        assert one.result == two.result == 0
        (first,) = struct.unpack("<I", one.outputs[0])
        (second,) = struct.unpack("<I", two.outputs[0])
        length = dsp.call(FLEN, [struct.pack("<I", first)], [8])
        assert struct.unpack("<Q", length.outputs[0]) == (len(CONTENT),)
        # Each open has its own offset.
        assert dsp.read(first, 100) == CONTENT[:100]
        assert dsp.read(second, 10) == CONTENT[:10]
        assert dsp.read(first, 10) == CONTENT[100:110]
        seek = dsp.call(FSEEK, [struct.pack("<IiI", first, -4, os.SEEK_END)], [])
        assert seek.result == 0
        assert dsp.read(first, 100) == CONTENT[-4:]
        bad_seek = dsp.call(FSEEK, [struct.pack("<IiI", first, -1, os.SEEK_SET)], [])
        assert bad_seek.result == errno.EINVAL  # fseek(3)
        assert dsp.call(FCLOSE, [struct.pack("<I", first)], []).result == 0
        assert exposed.pread(0, 2) == CONTENT[:2]  # fclose did not close the lent descriptor
        # Once the exposure ends, an open handle reads nothing more and the name is gone.
    reply = dsp.call(FREAD, [struct.pack("<II", second, 8)], [8, 8])
    assert reply.result == errno.EBADF  # the read failed: its errno, as libcdsprpc
    assert dsp.fopen(exposed.name).result == errno.ENOENT
    assert not dsp.exists(exposed.name)
    dsp.server.close()


def test_the_exposed_namespace_never_reaches_the_search_path(tmp_path: Path) -> None:
    planted = f"{EXPOSED_PREFIX}{'0' * 32}.onnx"
    (tmp_path / planted).write_bytes(b"a file an attacker put on the library path")
    (tmp_path / "libecho_skel.so").write_bytes(b"skel")
    dsp = Dsp(AppsStdServer([tmp_path], ExposedFiles()))
    assert dsp.fopen(planted).result == errno.ENOENT
    assert not dsp.exists(planted)
    assert dsp.fopen("libecho_skel.so").result == 0  # the search path still works
    for escape in (f"{planted}/../libecho_skel.so", f"../{planted}", planted.upper()):
        assert dsp.fopen(escape).result == errno.ENOENT
    dsp.server.close()


def test_closing_the_server_leaves_exposures_to_their_owner(model_fd: int, tmp_path: Path) -> None:
    registry = ExposedFiles()
    server = AppsStdServer([tmp_path], registry)
    dsp = Dsp(server)
    exposed = registry.expose(model_fd)
    assert dsp.fopen(exposed.name).result == 0
    server.close()
    assert server.open_files == 0
    assert not exposed.closed
    exposed.close()
    assert len(registry) == 0
