"""How the simulated DSP reads a file from the host: the three apps_std paths.

``SimConfig.loader_paths`` picks them, in order; when the host answers a path's
first call with AEE_EUNSUPPORTED the next one is tried (reference 5.6: the
firmware's choice is not visible in the sources, so a host must serve them
all, and tests run each):

* ``fopen_with_env``: ``fopen_with_env`` (19, sc 0x13050100), ``flen`` (10),
  ``fread`` (4) in chunks, ``fclose`` (3): the bytes stream through the
  listener into DSP heap.
* ``fopen_with_env_fd``: ``fopen_with_env_fd`` (36, sent as method 31 with the
  id first in primIn, sc 0x1F050100) returns ``{fd, len}``: the host read the
  file into a DMA-BUF and MEM_MAP'd it (FASTRPC_MAP_FD); the DSP reads that
  mapping, which it finds by the fd number the MEM_MAP carried, and returns it
  with ``fclose_fd`` (35, sc 0x1F010000).
* ``search_paths``: ``get_search_paths_with_env`` (21, sc 0x15040100 + one
  output per path) lists the host's directories; ``stat`` (31, sc 0x1F020100)
  of ``<dir>/<file>`` in each until one is a regular file; ``fopen_fd`` (34,
  sc 0x1F030100) of that path, read as above, ``fclose_fd``.

apps_std answers with errno values, as libcdsprpc's ``apps_std_imp.c`` does.
Only ENOENT (2) means "not there": ``stat`` answering it moves the search on
to the next directory, and a file the loader probes (``SimConfig.loader_probes``)
may be missing. Any other failure ends the load, as it would on a DSP whose
loader tries its next candidate only after ENOENT.

Failures raise :class:`HostReadError` with a dlopen-style text naming the file.
"""

from __future__ import annotations

import contextlib
import errno
import stat
import struct
from collections.abc import Callable, Sequence
from typing import Final, NamedTuple

from npu_protocol.aee import AEE, DSP_AEE_EOFFSET, aee_name, describe_result
from npud.sim.config import LoaderPath
from npud.sim.host_calls import HostCallError, HostChannel, c_string, text_of
from npud.sim.layout import make_scalars
from npud.sim.memory import ProcessMemory

APPS_STD_MODULE: Final = "apps_std"
LIBRARY_PATH_VARIABLE: Final = "ADSP_LIBRARY_PATH"
LIBRARY_PATH_DELIMITER: Final = ";"
ESCAPE_METHOD: Final = 31

FCLOSE: Final = 3
FREAD: Final = 4
FLEN: Final = 10
FOPEN_WITH_ENV: Final = 19
GET_SEARCH_PATHS_WITH_ENV: Final = 21
STAT: Final = 31
FOPEN_FD: Final = 34
FCLOSE_FD: Final = 35
FOPEN_WITH_ENV_FD: Final = 36

SC_FOPEN_WITH_ENV: Final = make_scalars(FOPEN_WITH_ENV, 5, 1)
SC_FLEN: Final = make_scalars(FLEN, 1, 1)
SC_FREAD: Final = make_scalars(FREAD, 1, 2)
SC_FCLOSE: Final = make_scalars(FCLOSE, 1, 0)
SC_STAT: Final = make_scalars(ESCAPE_METHOD, 2, 1)
SC_FOPEN_FD: Final = make_scalars(ESCAPE_METHOD, 3, 1)
SC_FCLOSE_FD: Final = make_scalars(ESCAPE_METHOD, 1, 0)
SC_FOPEN_WITH_ENV_FD: Final = make_scalars(ESCAPE_METHOD, 5, 1)

PROBE_LIMIT: Final = 64 * 1024
"""A probed file is read whole (and dropped); larger ones fail the probe."""
SEARCH_PATH_SLOTS: Final = 8
"""Paths asked for at first; more are asked for when the host has more."""
PATH_CAPACITY: Final = 256
MAX_SEARCH_PATHS: Final = 64

_U32: Final = struct.Struct("<I")
_U32_PAIR: Final = struct.Struct("<II")
_S32_PAIR: Final = struct.Struct("<ii")
_U64: Final = struct.Struct("<Q")
_FOUR_LENGTHS: Final = struct.Struct("<IIII")
_SEARCH_PATHS_OUT: Final = struct.Struct("<IH2x")  # numPaths, maxPathLen
STAT_STRUCT: Final = struct.Struct("<QQQIIQQqqqqqq")  # apps_std_STAT, 96 bytes
_STAT_MODE: Final = 3


class HostReadError(Exception):
    """A file the DSP could not read from the host; ``code`` is the AEE result to report.
    ``missing``: the host said the file is not there (ENOENT), nothing else went wrong."""

    def __init__(
        self, message: str, code: int = AEE.ENOSUCHMOD.dsp, *, missing: bool = False
    ) -> None:
        super().__init__(message)
        self.message = message
        self.code = code
        self.missing = missing


def _answer(result: int) -> str:
    """An apps_std result as text: ``0x2 (ENOENT)``; a small value is named both as an
    errno and as a bare AEE code where both exist (0x45: ESRMNT / AEE_ENOSUCHFILE)."""
    if result >= DSP_AEE_EOFFSET:
        return describe_result(result)
    names = [errno.errorcode[result]] if result in errno.errorcode else []
    aee = aee_name(result)
    if aee is not None:
        names.append(aee)
    return f"{result:#x} ({' / '.join(names)})" if names else f"{result:#x}"


def _open_failed(name: str, call: str, result: int) -> HostReadError:
    """What an open that the host answered ``result`` means to the loader."""
    if result == errno.ENOENT:
        return HostReadError(
            f"{name}: cannot open shared object file: No such file or directory (apps_std {call})",
            missing=True,
        )
    return HostReadError(
        f"{name}: cannot open shared object file: apps_std {call} answered {_answer(result)}"
    )


class HostFile(NamedTuple):
    """A file read from the host; ``streamed``: its bytes came through fread (into heap)."""

    data: bytes
    streamed: bool


class _UnsupportedPathError(Exception):
    """The host does not serve this path (AEE_EUNSUPPORTED): try the next one."""


def _unsupported(result: int) -> bool:
    return result in (int(AEE.EUNSUPPORTED), AEE.EUNSUPPORTED.dsp)


class HostFileReader:
    """Reads whole files from the host for one DSP process (its loader and its skels)."""

    def __init__(
        self,
        host: HostChannel,
        memory: ProcessMemory,
        paths: Sequence[LoaderPath],
    ) -> None:
        self._host = host
        self._memory = memory
        self._paths = tuple(paths)

    def read(self, name: str, *, limit: int, chunk: int) -> HostFile:
        """The whole file ``name`` (at most ``limit`` bytes). HostReadError otherwise;
        SubsystemDownError / ProcessExitedError pass through."""
        readers: dict[LoaderPath, Callable[[int, str, int, int], bytes]] = {
            "fopen_with_env": self._streamed,
            "fopen_with_env_fd": self._with_env_fd,
            "search_paths": self._search_paths,
        }
        try:
            apps_std = self._host.module(APPS_STD_MODULE)
        except HostCallError as exc:
            raise HostReadError(f"{name}: cannot open shared object file: {exc}") from None
        for path in self._paths:
            try:
                data = readers[path](apps_std, name, limit, chunk)
            except _UnsupportedPathError:
                continue
            except HostCallError as exc:
                raise HostReadError(f"{name}: cannot open shared object file: {exc}") from None
            return HostFile(data, streamed=path == "fopen_with_env")
        raise HostReadError(
            f"{name}: cannot open shared object file: the host serves none of"
            f" {', '.join(self._paths)} (AEE_EUNSUPPORTED)"
        )

    def probe(self, name: str) -> bool:
        """Ask for a file the DSP looks for on its own (libcdsprpc names ``oemconfig.so``,
        ``testsig``, ``librpcversion_skel.so``): True if there, False if the host said
        ENOENT; HostReadError for any other answer (the loader gives up)."""
        try:
            self.read(name, limit=PROBE_LIMIT, chunk=PROBE_LIMIT)
        except HostReadError as exc:
            if exc.missing:
                return False
            raise
        return True

    # -- fopen_with_env / flen / fread / fclose -------------------------------

    def _streamed(self, apps_std: int, name: str, limit: int, chunk: int) -> bytes:
        strings = _strings_for_env(name)
        lengths = _FOUR_LENGTHS.pack(*(len(s) for s in strings))
        reply = self._host.call(apps_std, SC_FOPEN_WITH_ENV, [lengths, *strings], [_U32.size])
        if _unsupported(reply.result):
            raise _UnsupportedPathError
        if reply.result:
            raise _open_failed(name, "fopen_with_env", reply.result)
        (file,) = _U32.unpack(reply.outputs[0])
        try:
            return self._read_stream(apps_std, file, name, limit, chunk)
        finally:
            # A failing fclose does not change the outcome.
            with contextlib.suppress(HostCallError):
                self._host.call(apps_std, SC_FCLOSE, [_U32.pack(file)], [])

    def _read_stream(self, apps_std: int, file: int, name: str, limit: int, chunk: int) -> bytes:
        reply = self._host.call(apps_std, SC_FLEN, [_U32.pack(file)], [_U64.size])
        if reply.result:
            raise HostReadError(
                f"{name}: cannot read file: apps_std flen: {describe_result(reply.result)}"
            )
        (length,) = _U64.unpack(reply.outputs[0])
        if length > limit:
            raise HostReadError(f"{name}: {length} bytes is too large (at most {limit})")
        data = bytearray()
        while len(data) < length:
            size = min(chunk, length - len(data))
            reply = self._host.call(
                apps_std, SC_FREAD, [_U32_PAIR.pack(file, size)], [_S32_PAIR.size, size]
            )
            if reply.result:
                raise HostReadError(
                    f"{name}: cannot read file: apps_std fread: {describe_result(reply.result)}"
                )
            count, eof = _S32_PAIR.unpack(reply.outputs[0])
            if not 0 <= count <= size:
                raise HostReadError(f"{name}: cannot read file: fread returned {count} of {size}")
            data += reply.outputs[1][:count]
            if eof or count == 0:
                break
        return bytes(data)

    # -- fopen_with_env_fd ----------------------------------------------------

    def _with_env_fd(self, apps_std: int, name: str, limit: int, chunk: int) -> bytes:
        strings = _strings_for_env(name)
        prim = struct.pack("<IIIII", FOPEN_WITH_ENV_FD, *(len(s) for s in strings))
        reply = self._host.call(apps_std, SC_FOPEN_WITH_ENV_FD, [prim, *strings], [8])
        if _unsupported(reply.result):
            raise _UnsupportedPathError
        if reply.result:
            raise _open_failed(name, "fopen_with_env_fd", reply.result)
        return self._read_shared(apps_std, reply.outputs[0], name, limit)

    # -- get_search_paths_with_env / stat / fopen_fd ----------------------------

    def _search_paths(self, apps_std: int, name: str, limit: int, chunk: int) -> bytes:
        directories = self._directories(apps_std, name)
        for directory in directories:
            path = f"{directory.rstrip('/')}/{name}"
            if not self._is_file(apps_std, path):
                continue
            encoded = [c_string(path), c_string("r")]
            prim = struct.pack("<III", FOPEN_FD, *(len(s) for s in encoded))
            reply = self._host.call(apps_std, SC_FOPEN_FD, [prim, *encoded], [8])
            if reply.result:
                raise _open_failed(name, f"fopen_fd of {path}", reply.result)
            return self._read_shared(apps_std, reply.outputs[0], name, limit)
        raise HostReadError(
            f"{name}: cannot open shared object file: No such file or directory"
            f" (not in any of {len(directories)} search paths)",
            missing=True,
        )

    def _directories(self, apps_std: int, name: str) -> list[str]:
        slots, capacity = SEARCH_PATH_SLOTS, PATH_CAPACITY
        env, delim = c_string(LIBRARY_PATH_VARIABLE), c_string(LIBRARY_PATH_DELIMITER)
        while True:
            prim = struct.pack("<III", len(env), len(delim), slots)
            sizes = struct.pack(f"<{slots}I", *([capacity] * slots))
            reply = self._host.call(
                apps_std,
                make_scalars(GET_SEARCH_PATHS_WITH_ENV, 4, 1 + slots),
                [prim, env, delim, sizes],
                [_SEARCH_PATHS_OUT.size, *([capacity] * slots)],
            )
            if _unsupported(reply.result):
                raise _UnsupportedPathError
            if reply.result:
                raise HostReadError(
                    f"{name}: cannot open shared object file: apps_std"
                    f" get_search_paths_with_env: {describe_result(reply.result)}"
                )
            count, longest = _SEARCH_PATHS_OUT.unpack(reply.outputs[0])
            if count <= slots and longest <= capacity:
                return [text_of(path) for path in reply.outputs[1 : 1 + count]]
            if count > MAX_SEARCH_PATHS:
                raise HostReadError(f"{name}: the host lists {count} search paths")
            slots, capacity = max(slots, count), max(capacity, longest)

    def _is_file(self, apps_std: int, path: str) -> bool:
        """stat of ``path``: False when the host says ENOENT (try the next directory);
        HostReadError for any other failure (the loader stops there)."""
        encoded = c_string(path)
        prim = _U32_PAIR.pack(STAT, len(encoded))
        reply = self._host.call(apps_std, SC_STAT, [prim, encoded], [STAT_STRUCT.size])
        if _unsupported(reply.result):
            raise _UnsupportedPathError
        if reply.result == errno.ENOENT:
            return False
        if reply.result:
            raise HostReadError(
                f"{path}: cannot open shared object file: apps_std stat answered"
                f" {_answer(reply.result)}"
            )
        mode = STAT_STRUCT.unpack(reply.outputs[0])[_STAT_MODE]
        return stat.S_ISREG(mode)

    # -- the shared-file mapping ------------------------------------------------

    def _read_shared(self, apps_std: int, prim: bytes, name: str, limit: int) -> bytes:
        fd, length = _S32_PAIR.unpack(prim)
        try:
            if not 0 <= length <= limit:
                raise HostReadError(f"{name}: {length} bytes is too large (at most {limit})")
            entry = self._memory.find_by_fd(fd)
            if entry is None:
                raise HostReadError(
                    f"{name}: cannot read file: the host returned fd {fd}, which it did not map"
                )
            if length > entry.length:
                raise HostReadError(
                    f"{name}: cannot read file: {length} bytes announced, {entry.length} mapped"
                )
            return bytes(entry.mapping[entry.offset : entry.offset + length])
        finally:
            with contextlib.suppress(HostCallError):
                close = _U32_PAIR.pack(FCLOSE_FD, fd & 0xFFFFFFFF)
                self._host.call(apps_std, SC_FCLOSE_FD, [close], [])


def _strings_for_env(name: str) -> list[bytes]:
    return [
        c_string(LIBRARY_PATH_VARIABLE),
        c_string(LIBRARY_PATH_DELIMITER),
        c_string(name),
        c_string("r"),
    ]
