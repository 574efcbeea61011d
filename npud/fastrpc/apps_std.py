"""The HLOS services the DSP calls through reverse RPC: apps_remotectl and apps_std.

The DSP loads skel libraries by reading them from this host: it opens the
module ``apps_std`` through reverse handle 0 (``apps_remotectl``) and then
calls ``fopen_with_env`` / ``flen`` / ``fread`` / ``fclose`` on the handle it
got back (reference 5.6). We serve files read-only and only from the
configured DSP library search path: the DSP names a file, never a path, so a
name with a directory part, a parent reference or a NUL is refused. Names
starting with ``npud-fd-`` are descriptors the daemon lends for one load
(:mod:`npud.fastrpc.exposed_files`): they resolve in that registry only, never
on the search path. Every open file keeps its own offset.

Results are HLOS-side AEE codes (bare ``n``, no DSP offset). Calls we do not
implement answer AEE_EUNSUPPORTED so the DSP can fall back; nothing hangs.
"""

from __future__ import annotations

import errno
import os
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final, Protocol

from npu_protocol import AEE
from npud.fastrpc import abi
from npud.fastrpc.exposed_files import ExposedFile, ExposedFiles, is_exposed_name
from npud.fastrpc.marshal import from_c_string

APPS_REMOTECTL_HANDLE: Final = 0
MAX_OPEN_FILES: Final = 64
MAX_OUTPUT_CAPACITY: Final = 16 * 1024 * 1024
NAME_MAX: Final = 255
_APPS_STD_HANDLE: Final = 0x5354  # "ST": any non-static value works

# apps_std method ids (reference 5.6)
FOPEN: Final = 0
FCLOSE: Final = 3
FREAD: Final = 4
FSEEK: Final = 9
FLEN: Final = 10
FOPEN_WITH_ENV: Final = 19
FILE_EXISTS: Final = 22

_READ_MODES: Final = frozenset({"r", "rb"})


@dataclass(frozen=True)
class Reply:
    """A reverse call's result and its output buffers (each exactly the asked capacity)."""

    result: int
    outputs: tuple[bytes, ...] = ()


def _fail(code: AEE) -> Reply:
    return Reply(int(code))


def _fit(data: bytes, capacity: int) -> bytes:
    """Output buffers must come back at exactly the capacity the DSP announced."""
    return data[:capacity].ljust(capacity, b"\0")


class _OpenFile(Protocol):
    def read(self, count: int) -> bytes: ...
    def seek(self, offset: int, whence: int) -> None: ...
    def size(self) -> int: ...
    def close(self) -> None: ...


class _SearchPathFile:
    """A file of the search path, opened here: owns its fd."""

    def __init__(self, fd: int) -> None:
        self._fd = fd

    def read(self, count: int) -> bytes:
        return os.read(self._fd, count)

    def seek(self, offset: int, whence: int) -> None:
        os.lseek(self._fd, offset, whence)

    def size(self) -> int:
        return os.fstat(self._fd).st_size

    def close(self) -> None:
        fd, self._fd = self._fd, -1
        os.close(fd)


class _LentFile:
    """An exposed descriptor as one apps_std file: its own offset; the fd is not ours."""

    def __init__(self, exposed: ExposedFile) -> None:
        self._exposed = exposed
        self._offset = 0

    def read(self, count: int) -> bytes:
        data = self._exposed.pread(self._offset, count)
        self._offset += len(data)
        return data

    def seek(self, offset: int, whence: int) -> None:
        base = {os.SEEK_SET: 0, os.SEEK_CUR: self._offset, os.SEEK_END: self.size()}[whence]
        if base + offset < 0:
            raise OSError(errno.EINVAL, "seek before the start of the file")
        self._offset = base + offset

    def size(self) -> int:
        return self._exposed.size()

    def close(self) -> None:
        """Nothing to release: the ExposedFile owns the descriptor."""


class AppsStdServer:
    """Serves the DSP's file reads from ``search_path`` and from ``exposed``.

    Owns the fds it opens on the search path; borrows exposed descriptors.
    """

    def __init__(self, search_path: Sequence[Path], exposed: ExposedFiles | None = None) -> None:
        self._search_path = tuple(Path(p) for p in search_path)
        self._exposed = exposed if exposed is not None else ExposedFiles()
        self._files: dict[int, _OpenFile] = {}  # apps_std file handle -> open file
        self._next_file = 1
        self._apps_std_open = False
        self.files_served = 0

    # --- dispatch -----------------------------------------------------------
    def dispatch(self, handle: int, sc: int, inputs: list[bytes], caps: list[int]) -> Reply:
        if abi.remote_scalars_inhandles(sc) or abi.remote_scalars_outhandles(sc):
            return _fail(AEE.EBADPARM)
        method = abi.remote_scalars_method(sc)
        if any(cap > MAX_OUTPUT_CAPACITY for cap in caps):
            return _fail(AEE.EBADPARM)  # we would allocate what the peer asks for
        try:
            if handle == APPS_REMOTECTL_HANDLE:
                return self._remotectl(method, inputs, caps)
            if handle == _APPS_STD_HANDLE and self._apps_std_open:
                return self._apps_std(method, inputs, caps)
        except (struct.error, IndexError, ValueError):
            return _fail(AEE.EBADPARM)
        except OSError:
            return _fail(AEE.EFILE)
        return _fail(AEE.EINVHANDLE)

    def close(self) -> None:
        """Close every file the DSP left open."""
        files, self._files = self._files, {}
        for file in files.values():
            file.close()

    @property
    def open_files(self) -> int:
        return len(self._files)

    # --- apps_remotectl -------------------------------------------------------
    def _remotectl(self, method: int, inputs: list[bytes], caps: list[int]) -> Reply:
        if method == 0:  # open(name, rout handle, rout dlerror, rout nErr)
            name = from_c_string(inputs[1])
            if name == "apps_std":
                self._apps_std_open = True
                prim = struct.pack("<Ii", _APPS_STD_HANDLE, 0)
                return Reply(0, (_fit(prim, caps[0]), _fit(b"", caps[1])))
            error = f"module {name!r} is not served by npud".encode() + b"\0"
            prim = struct.pack("<II", 0, int(AEE.ENOSUCHMOD))
            return Reply(0, (_fit(prim, caps[0]), _fit(error, caps[1])))
        if method == 1:  # close(handle, rout nErr, rout dlerror)
            (handle,) = struct.unpack_from("<I", inputs[0])
            status = 0 if handle == _APPS_STD_HANDLE else int(AEE.EINVHANDLE)
            if handle == _APPS_STD_HANDLE:
                self._apps_std_open = False
                self.close()
            return Reply(0, (_fit(struct.pack("<I", status), caps[0]), _fit(b"", caps[1])))
        return _fail(AEE.EUNSUPPORTED)

    # --- apps_std --------------------------------------------------------------
    def _apps_std(self, method: int, inputs: list[bytes], caps: list[int]) -> Reply:
        if method == FOPEN_WITH_ENV:
            _env, _delim, name, mode = (from_c_string(b) for b in inputs[1:5])
            return self._fopen(name, mode, caps)
        if method == FOPEN:
            name, mode = (from_c_string(b) for b in inputs[1:3])
            return self._fopen(name, mode, caps)
        if method == FILE_EXISTS:
            found = self._exists(from_c_string(inputs[1]))
            return Reply(0, (_fit(bytes([found]), caps[0]),))
        if method == FLEN:
            open_file = self._file(inputs[0])
            if open_file is None:
                return _fail(AEE.EBADFD)
            return Reply(0, (_fit(struct.pack("<Q", open_file.size()), caps[0]),))
        if method == FREAD:
            return self._fread(inputs, caps)
        if method == FSEEK:
            return self._fseek(inputs)
        if method == FCLOSE:
            (file,) = struct.unpack_from("<I", inputs[0])
            open_file = self._files.pop(file, None)
            if open_file is None:
                return _fail(AEE.EBADFD)
            open_file.close()
            return Reply(0)
        return _fail(AEE.EUNSUPPORTED)

    def _exists(self, name: str) -> bool:
        if is_exposed_name(name):
            return self._exposed.lookup(name) is not None
        return self._resolve(name) is not None

    def _fread(self, inputs: list[bytes], caps: list[int]) -> Reply:
        (file, capacity) = struct.unpack_from("<II", inputs[0])
        open_file = self._files.get(file)
        if open_file is None:
            return _fail(AEE.EBADFD)
        data = open_file.read(min(capacity, caps[1]))
        eof = int(len(data) < capacity)
        prim = struct.pack("<ii", len(data), eof)
        return Reply(0, (_fit(prim, caps[0]), _fit(data, caps[1])))

    def _fseek(self, inputs: list[bytes]) -> Reply:
        file, offset, whence = struct.unpack_from("<IiI", inputs[0])
        open_file = self._files.get(file)
        if open_file is None or whence not in (os.SEEK_SET, os.SEEK_CUR, os.SEEK_END):
            return _fail(AEE.EBADPARM)
        try:
            open_file.seek(offset, whence)
        except OSError:
            return _fail(AEE.EFILE)
        return Reply(0)

    def _file(self, prim: bytes) -> _OpenFile | None:
        (file,) = struct.unpack_from("<I", prim)
        return self._files.get(file)

    def _resolve(self, name: str) -> Path | None:
        if (
            not name
            or len(name.encode()) > NAME_MAX
            or "/" in name
            or "\\" in name
            or name.startswith(".")
            or "\0" in name
        ):
            return None
        for directory in self._search_path:
            candidate = directory / name
            if candidate.is_file():
                return candidate
        return None

    def _fopen(self, name: str, mode: str, caps: list[int]) -> Reply:
        if mode not in _READ_MODES:
            return _fail(AEE.EBADPERMS)
        open_file: _OpenFile
        if is_exposed_name(name):
            exposed = self._exposed.lookup(name)
            if exposed is None:
                return _fail(AEE.ENOSUCHFILE)
            if len(self._files) >= MAX_OPEN_FILES:
                return _fail(AEE.EOUTOFHANDLES)
            open_file = _LentFile(exposed)
        else:
            path = self._resolve(name)
            if path is None:
                return _fail(AEE.ENOSUCHFILE)
            if len(self._files) >= MAX_OPEN_FILES:
                return _fail(AEE.EOUTOFHANDLES)
            try:
                open_file = _SearchPathFile(os.open(path, os.O_RDONLY | os.O_CLOEXEC))
            except OSError:
                return _fail(AEE.EFOPEN)
        file = self._next_file
        self._next_file += 1
        self._files[file] = open_file
        self.files_served += 1
        return Reply(0, (_fit(struct.pack("<I", file), caps[0]),))
