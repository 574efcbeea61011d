"""``apps_std``: the host files the DSP reads through reverse RPC (reference 5.6).

The DSP loads skel libraries (and skels load data files) by reading them from
this host. It opens ``apps_std`` through apps_remotectl
(:mod:`npud.fastrpc.reverse.reverse_modules`) and reads files in one of three ways,
all served here, as ``apps_std_imp.c`` does (which one a firmware uses is not
visible in the sources):

* streamed: ``fopen_with_env`` (19) or ``fopen`` (0), ``flen`` (10),
  ``fread`` (4), ``fseek`` (9), ``fclose`` (3);
* mapped: ``fopen_with_env_fd`` (36) or ``fopen_fd`` (34) read the whole file
  into a DMA-BUF that the session MEM_MAPs into the DSP process with
  FASTRPC_MAP_FD and answer ``{fd, length}``; ``fclose_fd`` (35) unmaps and
  frees it;
* by path: ``get_search_paths_with_env`` (21) lists the directories,
  ``stat`` (31) tells whether ``<dir>/<file>`` is a file, ``fileExists`` (22).

Ids from 31 on travel as method 31 with the id first in primIn. The method
ids and the argument layouts come from ``idl/apps_std.idl`` through
:mod:`npud.idl`, the description the emulator's DSP side uses too.

Results are what ``apps_std_imp.c`` answers, value for value: its calls
return errno values, not AEE codes (its header: "errno is returned"). A
missing file is ENOENT (2) from fopen, fopen_with_env, fopen_fd,
fopen_with_env_fd and stat, and the DSP's loader moves on to its next
candidate only after that value; file handles are the lowest free number
from 100 on (APPS_FD_BASE), an unknown one is EBADF (9); an
``fclose_fd`` of an fd it does not know succeeds (0). Where npud refuses what
libcdsprpc would do (a write mode: the files are served read-only), the
answer is the errno the C library gives for it (EACCES). Only the failures
libcdsprpc itself reports as AEE codes stay AEE codes (a malformed request:
AEE_EBADPARM; an unknown method: AEE_EUNSUPPORTED; no memory for a shared
file: AEE_ENORPCMEMORY).

What the DSP may read: files on the configured library path only, read-only.
A name is either a bare file name, looked up as ``<dir>/cdsp/<name>`` then
``<dir>/<name>`` in each directory (libcdsprpc's order), or an absolute path
whose directory is one of those (what ``get_search_paths_with_env`` listed);
names with a parent reference, a NUL or another directory are refused. Names
starting with ``npud-fd-`` are descriptors the daemon lends for one load
(:mod:`npud.fastrpc.reverse.exposed_files`): they resolve in that registry only, never
on the search path, with or without a listed directory in front. Every open
file keeps its own offset.

The environment-variable name the DSP passes (``ADSP_LIBRARY_PATH``) is not
looked up in npud's environment: the configured path is the only search path.

A path outside the configured directories is refused (answered ENOENT, so
the loader moves on as for a missing file): libcdsprpc would open any
absolute path, but npud runs as a system service and the directories are its
security boundary. Each refused path is logged once, with the path, and
counted (:attr:`AppsStdServer.refused_paths`), so a device trace shows which
directory a firmware needs (docs/hardware.md says how to add one).
"""

from __future__ import annotations

import errno
import logging
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Final, Protocol

from npu_protocol import AEE, MAX_DMA_SIZE
from npud import idl
from npud.fastrpc.kernel.marshal import from_c_string
from npud.fastrpc.reverse.exposed_files import ExposedFile, ExposedFiles, is_exposed_name
from npud.fastrpc.reverse.reverse_modules import CallDescription, Reply, fail

log = logging.getLogger(__name__)

__all__ = [
    "ENORPCMEMORY",
    "FCLOSE",
    "FCLOSE_FD",
    "FILE_EXISTS",
    "FIRST_FILE_HANDLE",
    "FLEN",
    "FOPEN",
    "FOPEN_FD",
    "FOPEN_WITH_ENV",
    "FOPEN_WITH_ENV_FD",
    "FREAD",
    "FSEEK",
    "GET_SEARCH_PATHS_WITH_ENV",
    "MAX_OPEN_FILES",
    "STAT",
    "AppsStdServer",
    "FileSharing",
    "Reply",
]

MAX_OPEN_FILES: Final = 64
MAX_SHARED_FILES: Final = 16
MAX_SHARED_FILE_BYTES: Final = MAX_DMA_SIZE
NAME_MAX: Final = 255
PATH_MAX: Final = 4096
MAX_LOGGED_REFUSALS: Final = 256
"""Distinct refused paths logged per session; later ones are only counted."""
ENORPCMEMORY: Final = 0x068
"""AEE_ENORPCMEMORY (AEEStdErr.h): what libcdsprpc answers when rpcmem has no buffer
(never AEE_ENOMEMORY, 2, which the DSP cannot tell from ENOENT)."""
FIRST_FILE_HANDLE: Final = 100
"""APPS_FD_BASE: libcdsprpc's file handles are the lowest free number from 100 on."""
DOMAIN_DIRECTORY: Final = "cdsp"
"""libcdsprpc looks in ``<dir>/<domain name>/`` before ``<dir>/``."""

APPS_STD_IDL: Final = idl.load("apps_std")
"""apps_std's methods and layouts (reference 5.6, ``idl/apps_std.idl``)."""

FOPEN: Final = APPS_STD_IDL.method("fopen").index
FCLOSE: Final = APPS_STD_IDL.method("fclose").index
FREAD: Final = APPS_STD_IDL.method("fread").index
FSEEK: Final = APPS_STD_IDL.method("fseek").index
FLEN: Final = APPS_STD_IDL.method("flen").index
FOPEN_WITH_ENV: Final = APPS_STD_IDL.method("fopen_with_env").index
GET_SEARCH_PATHS_WITH_ENV: Final = APPS_STD_IDL.method("get_search_paths_with_env").index
FILE_EXISTS: Final = APPS_STD_IDL.method("fileExists").index
ESCAPE: Final = idl.ESCAPE_METHOD
STAT: Final = APPS_STD_IDL.method("stat").index
FOPEN_FD: Final = APPS_STD_IDL.method("fopen_fd").index
FCLOSE_FD: Final = APPS_STD_IDL.method("fclose_fd").index
FOPEN_WITH_ENV_FD: Final = APPS_STD_IDL.method("fopen_with_env_fd").index

METHOD_NAMES: Final = {
    index: APPS_STD_IDL.methods[index].name
    for index in (
        FOPEN,
        FCLOSE,
        FREAD,
        FSEEK,
        FLEN,
        FOPEN_WITH_ENV,
        GET_SEARCH_PATHS_WITH_ENV,
        FILE_EXISTS,
        STAT,
        FOPEN_FD,
        FCLOSE_FD,
        FOPEN_WITH_ENV_FD,
    )
}
"""The methods served, by id; the others are answered AEE_EUNSUPPORTED."""

_READ_MODES: Final = frozenset({"r", "rb"})


class FileSharing(Protocol):
    """How the ``_fd`` calls hand a file to the DSP: the session's DMA-BUFs and MEM_MAP."""

    def share(self, source: SharedSource, size: int) -> int:
        """Copy ``size`` bytes of ``source`` into a new DMA-BUF, MEM_MAP it with
        FASTRPC_MAP_FD; return its fd (owned by the sharer). OSError or an
        ``int`` AEE result (:class:`SharingError`) on failure."""
        ...

    def unshare(self, fd: int) -> None:
        """MEM_UNMAP and free what :meth:`share` returned. SharingError on failure."""
        ...


class SharingError(Exception):
    """A share or unshare the kernel or the DSP refused; ``result`` is the AEE code to report."""

    def __init__(self, result: int) -> None:
        super().__init__(f"result 0x{result:08X}")
        self.result = result


class SharedSource(Protocol):
    def read_at(self, offset: int, count: int) -> bytes: ...


class _NoSharing:
    def share(self, source: SharedSource, size: int) -> int:
        raise SharingError(int(AEE.EUNSUPPORTED))

    def unshare(self, fd: int) -> None:
        raise SharingError(int(AEE.EBADFD))


class _OpenFile(Protocol):
    def read(self, count: int) -> bytes: ...
    def read_at(self, offset: int, count: int) -> bytes: ...
    def seek(self, offset: int, whence: int) -> None: ...
    def size(self) -> int: ...
    def stat(self) -> os.stat_result: ...
    def close(self) -> None: ...


class _SearchPathFile:
    """A file of the search path, opened here: owns its fd."""

    def __init__(self, fd: int) -> None:
        self._fd = fd

    def read(self, count: int) -> bytes:
        return os.read(self._fd, count)

    def read_at(self, offset: int, count: int) -> bytes:
        return os.pread(self._fd, count, offset)

    def seek(self, offset: int, whence: int) -> None:
        os.lseek(self._fd, offset, whence)

    def size(self) -> int:
        return os.fstat(self._fd).st_size

    def stat(self) -> os.stat_result:
        return os.fstat(self._fd)

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

    def read_at(self, offset: int, count: int) -> bytes:
        return self._exposed.pread(offset, count)

    def seek(self, offset: int, whence: int) -> None:
        base = {os.SEEK_SET: 0, os.SEEK_CUR: self._offset, os.SEEK_END: self.size()}[whence]
        if base + offset < 0:
            raise OSError(errno.EINVAL, "seek before the start of the file")
        self._offset = base + offset

    def size(self) -> int:
        return self._exposed.size()

    def stat(self) -> os.stat_result:
        return self._exposed.stat()

    def close(self) -> None:
        """Nothing to release: the ExposedFile owns the descriptor."""


class AppsStdServer:
    """Serves the DSP's file reads from ``search_path`` and from ``exposed``.

    Owns the fds it opens on the search path; borrows exposed descriptors; the
    DMA-BUFs of the ``_fd`` calls belong to ``sharing`` (the session).
    """

    name = "apps_std"

    def __init__(
        self,
        search_path: Sequence[Path],
        exposed: ExposedFiles | None = None,
        sharing: FileSharing | None = None,
    ) -> None:
        self._search_path = tuple(Path(os.path.abspath(p)) for p in search_path)
        self._exposed = exposed if exposed is not None else ExposedFiles()
        self._sharing: FileSharing = sharing if sharing is not None else _NoSharing()
        self._files: dict[int, _OpenFile] = {}  # apps_std file handle -> open file
        self._shared: set[int] = set()  # fds of the _fd calls, until fclose_fd
        self.files_served = 0
        self.refused_paths = 0
        """Names refused because they lead outside the configured directories."""
        self._logged_refusals: set[str] = set()

    # --- the module -----------------------------------------------------------
    def invoke(self, method: int, sc: int, inputs: list[bytes], caps: list[int]) -> Reply:
        try:
            return self._invoke(method, inputs, caps)
        except OSError as exc:  # the file went away or cannot be read: libcdsprpc's errno
            return Reply(exc.errno or errno.EIO)

    def _invoke(self, method: int, inputs: list[bytes], caps: list[int]) -> Reply:
        try:
            declared = APPS_STD_IDL.called(method, inputs[0] if inputs else b"")
        except idl.MarshalError:
            return fail(AEE.EBADPARM)
        if declared is None or declared.index not in METHOD_NAMES:
            return fail(AEE.EUNSUPPORTED)
        outputs = [memoryview(bytearray(cap)) for cap in caps]
        try:
            values = declared.unpack([memoryview(data) for data in inputs], outputs)
        except idl.MarshalError:
            return fail(AEE.EBADPARM)
        result = self._call(declared.index, values)
        if isinstance(result, Reply):
            return result
        declared.pack_routs(outputs, result)
        return Reply(0, tuple(bytes(view) for view in outputs))

    def _call(self, method: int, values: idl.Values) -> dict[str, object] | Reply:
        """Serve one unpacked call: its rout scalars, or a Reply that ends it (a failure).
        Rout sequences are written into their views (in ``values``) here."""
        if method in (FOPEN, FOPEN_WITH_ENV):
            return self._fopen(values.text("name"), values.text("mode"))
        if method == FILE_EXISTS:
            return {"exists": int(self.resolve(values.text("path")) is not None)}
        if method == GET_SEARCH_PATHS_WITH_ENV:
            return self._search_paths(values)
        if method == FLEN:
            open_file = self._files.get(values.integer("sin"))
            if open_file is None:
                return Reply(errno.EBADF)
            return {"len": open_file.size()}
        if method == FREAD:
            return self._fread(values.integer("sin"), values.view("buf"))
        if method == FSEEK:
            return self._fseek(values)
        if method == FCLOSE:
            open_file = self._files.pop(values.integer("sin"), None)
            if open_file is None:
                return Reply(errno.EBADF)
            open_file.close()
            return {}
        if method == STAT:
            return self._stat(values.text("name"))
        if method in (FOPEN_FD, FOPEN_WITH_ENV_FD):
            return self._fopen_fd(values.text("name"), values.text("mode"))
        if method == FCLOSE_FD:
            return self._fclose_fd(values.integer("fd"))
        return fail(AEE.EUNSUPPORTED)

    def describe(self, method: int, inputs: list[bytes]) -> CallDescription:
        declared = APPS_STD_IDL.called(method, inputs[0] if inputs else b"")
        if declared is None:
            return CallDescription(f"method {method}")
        file: str | None = None
        if declared.index in (FOPEN_WITH_ENV, FOPEN_WITH_ENV_FD) and len(inputs) > 3:
            file = from_c_string(inputs[3])
        elif declared.index in (FOPEN, FILE_EXISTS, STAT, FOPEN_FD) and len(inputs) > 1:
            file = from_c_string(inputs[1])
        return CallDescription(declared.name, file)

    def close(self) -> None:
        """Close every file the DSP left open and give back every shared DMA-BUF."""
        files, self._files = self._files, {}
        for file in files.values():
            file.close()
        shared, self._shared = self._shared, set()
        for fd in shared:
            try:
                self._sharing.unshare(fd)
            except (SharingError, OSError) as exc:
                log.warning("a shared file could not be given back", extra={"error": str(exc)})

    @property
    def open_files(self) -> int:
        return len(self._files)

    @property
    def shared_files(self) -> int:
        return len(self._shared)

    # --- streamed reads ------------------------------------------------------
    def _fread(self, file: int, buffer: memoryview) -> dict[str, object] | Reply:
        open_file = self._files.get(file)
        if open_file is None:
            return Reply(errno.EBADF)
        data = open_file.read(len(buffer))
        buffer[: len(data)] = data
        return {"bytesRead": len(data), "bEOF": int(len(data) < len(buffer))}

    def _fseek(self, values: idl.Values) -> dict[str, object] | Reply:
        open_file = self._files.get(values.integer("sin"))
        if open_file is None:
            return Reply(errno.EBADF)
        whence = values.integer("whence")
        if whence not in (os.SEEK_SET, os.SEEK_CUR, os.SEEK_END):
            return Reply(errno.EINVAL)  # fseek(3)'s answer
        try:
            open_file.seek(values.integer("offset"), whence)
        except OSError as exc:
            return Reply(exc.errno or errno.EINVAL)
        return {}

    def _fopen(self, name: str, mode: str) -> dict[str, object] | Reply:
        if mode not in _READ_MODES:
            return Reply(errno.EACCES)  # served read-only
        if self.resolve(name) is None:
            return Reply(errno.ENOENT)
        if len(self._files) >= MAX_OPEN_FILES:
            return Reply(errno.EMFILE)  # fopen(3)'s answer when a process has too many
        try:
            open_file = self._open(name)
        except OSError as exc:
            return Reply(exc.errno or errno.EIO)
        file = self._free_handle()
        self._files[file] = open_file
        self.files_served += 1
        return {"psout": file}

    def _free_handle(self) -> int:
        """The lowest handle from FIRST_FILE_HANDLE on that no open file has, as
        ``apps_std_FILE_alloc`` picks it (a closed file's number is used again)."""
        handle = FIRST_FILE_HANDLE
        while handle in self._files:
            handle += 1
        return handle

    # --- mapped reads (the _fd calls) ----------------------------------------
    def _fopen_fd(self, name: str, mode: str) -> dict[str, object] | Reply:
        """``{fd, st_size}``: the MEM_MAP covers exactly the file's size, as libcdsprpc's
        ``fastrpc_mmap(..., st_size, FASTRPC_MAP_FD)`` does."""
        if mode not in _READ_MODES:
            return Reply(errno.EACCES)
        if len(self._shared) >= MAX_SHARED_FILES:
            return Reply(errno.EMFILE)
        try:
            source = self._open(name)
        except OSError as exc:
            return Reply(exc.errno or errno.EIO)
        try:
            size = source.size()
            if size > MAX_SHARED_FILE_BYTES:
                return Reply(ENORPCMEMORY)
            fd = self._sharing.share(source, size)
        except SharingError as exc:
            return Reply(exc.result)
        finally:
            source.close()
        self._shared.add(fd)
        self.files_served += 1
        return {"fd": fd, "len": size}

    def _fclose_fd(self, fd: int) -> dict[str, object] | Reply:
        if fd not in self._shared:
            return {}  # libcdsprpc: an fd it never shared is nothing to close
        self._shared.discard(fd)
        try:
            self._sharing.unshare(fd)
        except SharingError as exc:
            return Reply(exc.result)
        return {}

    # --- by path -------------------------------------------------------------
    def _stat(self, name: str) -> dict[str, object] | Reply:
        try:
            source = self._open(name)
        except OSError as exc:
            return Reply(exc.errno or errno.EIO)
        try:
            info = source.stat()
        finally:
            source.close()
        stat = {
            "tsz": 0,
            "dev": info.st_dev,
            "ino": info.st_ino,
            "mode": info.st_mode,
            "nlink": info.st_nlink,
            "rdev": info.st_rdev,
            "size": info.st_size,
            "atime": int(info.st_atime),
            "atimensec": info.st_atime_ns % 1_000_000_000,
            "mtime": int(info.st_mtime),
            "mtimensec": info.st_mtime_ns % 1_000_000_000,
            "ctime": int(info.st_ctime),
            "ctimensec": info.st_ctime_ns % 1_000_000_000,
        }
        return {"stat": stat}

    def _search_paths(self, values: idl.Values) -> dict[str, object]:
        """The directories, one per path buffer the DSP gave (the rest left empty); the
        count says how many there are, so the DSP can ask again with more."""
        directories = self.directories()
        paths = [os.fsencode(str(d)) for d in directories]
        longest = max((len(p) + 1 for p in paths), default=0)
        slots = values["paths"]
        assert isinstance(slots, list)  # a rout sequence of sequences unpacks to views
        for slot, path in zip(slots, paths, strict=False):
            assert isinstance(slot, memoryview)
            # libcdsprpc copies a path when the buffer holds at least its characters
            # (strlcpy: the NUL may cut the last one off).
            if len(slot) >= len(path):
                copied = path[: len(slot) - 1] + b"\0"
                slot[: len(copied)] = copied
        return {"numPaths": len(paths), "maxPathLen": min(longest, 0xFFFF)}

    def directories(self) -> list[Path]:
        """What ``get_search_paths_with_env`` lists: ``<dir>/cdsp`` and ``<dir>`` that exist."""
        found: list[Path] = []
        for directory in self._search_path:
            for candidate in (directory / DOMAIN_DIRECTORY, directory):
                if candidate.is_dir() and candidate not in found:
                    found.append(candidate)
        return found

    # --- name resolution -----------------------------------------------------
    def resolve(self, name: str) -> Path | ExposedFile | None:
        """Where ``name`` leads, or None (unknown, refused, or not a regular file)."""
        if not name or "\0" in name or len(name.encode()) > PATH_MAX:
            self._refuse(name)
            return None
        directory, base = _split(name)
        if not _plain_name(base):
            self._refuse(name)
            return None
        if directory is not None and not self._allowed_directory(directory):
            self._refuse(name)
            return None
        if is_exposed_name(base):
            return self._exposed.lookup(base)
        candidates = (
            [Path(directory) / base]
            if directory is not None
            else [d / sub / base for d in self._search_path for sub in (DOMAIN_DIRECTORY, "")]
        )
        for candidate in candidates:
            if candidate.is_file():
                return candidate
        return None

    def _refuse(self, name: str) -> None:
        """Count a refused name; log it the first time (the path says which directory a
        firmware wants, docs/hardware.md). Bounded: a DSP cannot grow the set at will."""
        self.refused_paths += 1
        shown = name[:PATH_MAX]
        if shown in self._logged_refusals or len(self._logged_refusals) >= MAX_LOGGED_REFUSALS:
            return
        self._logged_refusals.add(shown)
        log.warning(
            "the DSP asked for a file outside the library directories; refused",
            extra={"path": shown, "directories": [str(d) for d in self._search_path]},
        )

    def _allowed_directory(self, directory: str) -> bool:
        allowed = {str(d) for d in self._search_path}
        allowed |= {str(d / DOMAIN_DIRECTORY) for d in self._search_path}
        return directory in allowed

    def _open(self, name: str) -> _OpenFile:
        """Open what ``name`` leads to; FileNotFoundError when it leads nowhere."""
        target = self.resolve(name)
        if target is None:
            raise FileNotFoundError(errno.ENOENT, name)
        if isinstance(target, ExposedFile):
            return _LentFile(target)
        return _SearchPathFile(os.open(target, os.O_RDONLY | os.O_CLOEXEC))


def _split(name: str) -> tuple[str | None, str]:
    """(directory, base) of an absolute path; (None, name) for a bare name.

    A relative path with a directory part, or any ``..``/``.`` component, yields
    a base that :func:`_plain_name` refuses.
    """
    if "/" not in name and "\\" not in name:
        return None, name
    if not name.startswith("/") or "\\" in name:
        return None, ""
    parts = name.split("/")
    if any(part in ("..", ".") for part in parts[1:]):
        return None, ""
    directory = os.path.normpath("/".join(parts[:-1]) or "/")
    return directory, parts[-1]


def _plain_name(base: str) -> bool:
    return (
        bool(base)
        and len(base.encode()) <= NAME_MAX
        and "/" not in base
        and "\\" not in base
        and not base.startswith(".")
        and "\0" not in base
    )
