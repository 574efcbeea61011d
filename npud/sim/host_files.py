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
from collections.abc import Callable, Sequence
from typing import Final, NamedTuple

from npu_protocol.aee import AEE, DSP_AEE_EOFFSET, aee_name, describe_result
from npud import idl
from npud.sim.config import LoaderPath
from npud.sim.host_calls import HostCallError, HostChannel
from npud.sim.memory import ProcessMemory

APPS_STD_MODULE: Final = "apps_std"
LIBRARY_PATH_VARIABLE: Final = "ADSP_LIBRARY_PATH"
LIBRARY_PATH_DELIMITER: Final = ";"
_APPS_STD: Final = idl.load("apps_std")
"""apps_std's methods and layouts (``idl/apps_std.idl``), as npud serves them."""
FOPEN_WITH_ENV: Final = _APPS_STD.method("fopen_with_env")
FLEN: Final = _APPS_STD.method("flen")
FREAD: Final = _APPS_STD.method("fread")
FCLOSE: Final = _APPS_STD.method("fclose")
GET_SEARCH_PATHS_WITH_ENV: Final = _APPS_STD.method("get_search_paths_with_env")
STAT: Final = _APPS_STD.method("stat")
FOPEN_FD: Final = _APPS_STD.method("fopen_fd")
FCLOSE_FD: Final = _APPS_STD.method("fclose_fd")
FOPEN_WITH_ENV_FD: Final = _APPS_STD.method("fopen_with_env_fd")

PROBE_LIMIT: Final = 64 * 1024
"""A probed file is read whole (and dropped); larger ones fail the probe."""
SEARCH_PATH_SLOTS: Final = 8
"""Paths asked for at first; more are asked for when the host has more."""
PATH_CAPACITY: Final = 256
MAX_SEARCH_PATHS: Final = 64


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

    def _call(
        self, apps_std: int, method: idl.Method, **arguments: object
    ) -> tuple[int, idl.Values]:
        """Call ``method`` of the host's apps_std: (its result, its rout values, which are
        empty unless the result is 0). HostReadError when an argument cannot travel or
        the host's reply does not fit the method."""
        try:
            call = method.encode(**arguments)
        except idl.MarshalError as exc:
            raise HostReadError(f"apps_std {method.name}: {exc}") from None
        inputs = [item for item in call.inputs if isinstance(item, bytes)]
        capacities = [item for item in call.outputs if isinstance(item, int)]
        reply = self._host.call(apps_std, call.sc, inputs, capacities)
        if reply.result:
            return reply.result, idl.Values({})
        try:
            return 0, method.decode(reply.outputs)
        except idl.MarshalError as exc:
            raise HostReadError(f"apps_std {method.name}: the host's reply: {exc}") from None

    # -- fopen_with_env / flen / fread / fclose -------------------------------

    def _streamed(self, apps_std: int, name: str, limit: int, chunk: int) -> bytes:
        result, values = self._call(apps_std, FOPEN_WITH_ENV, **_env_arguments(name))
        if _unsupported(result):
            raise _UnsupportedPathError
        if result:
            raise _open_failed(name, "fopen_with_env", result)
        file = values.integer("psout")
        try:
            return self._read_stream(apps_std, file, name, limit, chunk)
        finally:
            # A failing fclose does not change the outcome.
            with contextlib.suppress(HostCallError):
                self._call(apps_std, FCLOSE, sin=file)

    def _read_stream(self, apps_std: int, file: int, name: str, limit: int, chunk: int) -> bytes:
        result, values = self._call(apps_std, FLEN, sin=file)
        if result:
            raise HostReadError(
                f"{name}: cannot read file: apps_std flen: {describe_result(result)}"
            )
        length = values.integer("len")
        if length > limit:
            raise HostReadError(f"{name}: {length} bytes is too large (at most {limit})")
        data = bytearray()
        while len(data) < length:
            size = min(chunk, length - len(data))
            result, values = self._call(apps_std, FREAD, sin=file, buf=size)
            if result:
                raise HostReadError(
                    f"{name}: cannot read file: apps_std fread: {describe_result(result)}"
                )
            count, eof = values.integer("bytesRead"), values.integer("bEOF")
            if not 0 <= count <= size:
                raise HostReadError(f"{name}: cannot read file: fread returned {count} of {size}")
            data += values.data("buf")[:count]
            if eof or count == 0:
                break
        return bytes(data)

    # -- fopen_with_env_fd ----------------------------------------------------

    def _with_env_fd(self, apps_std: int, name: str, limit: int, chunk: int) -> bytes:
        result, values = self._call(apps_std, FOPEN_WITH_ENV_FD, **_env_arguments(name))
        if _unsupported(result):
            raise _UnsupportedPathError
        if result:
            raise _open_failed(name, "fopen_with_env_fd", result)
        return self._read_shared(apps_std, values, name, limit)

    # -- get_search_paths_with_env / stat / fopen_fd ----------------------------

    def _search_paths(self, apps_std: int, name: str, limit: int, chunk: int) -> bytes:
        directories = self._directories(apps_std, name)
        for directory in directories:
            path = f"{directory.rstrip('/')}/{name}"
            if not self._is_file(apps_std, path):
                continue
            result, values = self._call(apps_std, FOPEN_FD, name=path, mode="r")
            if result:
                raise _open_failed(name, f"fopen_fd of {path}", result)
            return self._read_shared(apps_std, values, name, limit)
        raise HostReadError(
            f"{name}: cannot open shared object file: No such file or directory"
            f" (not in any of {len(directories)} search paths)",
            missing=True,
        )

    def _directories(self, apps_std: int, name: str) -> list[str]:
        slots, capacity = SEARCH_PATH_SLOTS, PATH_CAPACITY
        while True:
            result, values = self._call(
                apps_std,
                GET_SEARCH_PATHS_WITH_ENV,
                envvarname=LIBRARY_PATH_VARIABLE,
                delim=LIBRARY_PATH_DELIMITER,
                paths=[capacity] * slots,
            )
            if _unsupported(result):
                raise _UnsupportedPathError
            if result:
                raise HostReadError(
                    f"{name}: cannot open shared object file: apps_std"
                    f" get_search_paths_with_env: {describe_result(result)}"
                )
            count, longest = values.integer("numPaths"), values.integer("maxPathLen")
            if count <= slots and longest <= capacity:
                return values.texts("paths")[:count]
            if count > MAX_SEARCH_PATHS:
                raise HostReadError(f"{name}: the host lists {count} search paths")
            slots, capacity = max(slots, count), max(capacity, longest)

    def _is_file(self, apps_std: int, path: str) -> bool:
        """stat of ``path``: False when the host says ENOENT (try the next directory);
        HostReadError for any other failure (the loader stops there)."""
        result, values = self._call(apps_std, STAT, name=path)
        if _unsupported(result):
            raise _UnsupportedPathError
        if result == errno.ENOENT:
            return False
        if result:
            raise HostReadError(
                f"{path}: cannot open shared object file: apps_std stat answered {_answer(result)}"
            )
        info = values["stat"]
        assert isinstance(info, idl.Values)  # a struct unpacks to Values
        return stat.S_ISREG(info.integer("mode"))

    # -- the shared-file mapping ------------------------------------------------

    def _read_shared(self, apps_std: int, opened: idl.Values, name: str, limit: int) -> bytes:
        fd, length = opened.integer("fd"), opened.integer("len")
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
                self._call(apps_std, FCLOSE_FD, fd=fd)


def _env_arguments(name: str) -> dict[str, object]:
    """fopen_with_env(_fd)'s arguments: libcdsprpc's variable and delimiter, read-only."""
    return {
        "envvarname": LIBRARY_PATH_VARIABLE,
        "delim": LIBRARY_PATH_DELIMITER,
        "name": name,
        "mode": "r",
    }
