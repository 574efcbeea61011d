"""How the simulated DSP loads a skel: through the host's listener, like the real one.

remotectl open names a module either as a URI,
``file:///libX_skel.so?X_skel_handle_invoke&_modver=1.0&_dom=cdsp``, or by a
bare interface name ``X`` (library ``libX_skel.so``, symbol ``X_skel_invoke``).
The DSP then reads that library from the host filesystem with reverse RPC:

1. once per process, ``apps_remotectl`` open of ``"apps_std"`` on reverse
   handle 0 (method 0, sc 0x00020200);
2. ``apps_std_fopen_with_env("ADSP_LIBRARY_PATH", ";", "<library>", "r")``
   (method 19, sc 0x13050100), ``flen`` (10, 0x0A010100), ``fread`` in chunks
   (4, 0x04010200) and ``fclose`` (3, 0x03010000).

The bytes are a *skel descriptor*, the simulator's stand-in for a Hexagon ELF::

    NPUD-SIM-SKEL 1
    # comments and blank lines are ignored
    skel=echo
    symbols=echo_skel_handle_invoke,echo_skel_invoke

``skel`` names a Python skel built into the simulated DSP (``SimConfig.skels``);
``symbols`` lists the entry points the "library" exports. A symbol ending in
``_skel_handle_invoke`` binds the skel as a remote_handle64 interface (user
methods from 2), one ending in ``_skel_invoke`` as a plain one (from 0).

Every failure becomes a dlopen-style error: a DSP code (AEE_ENOSUCHMOD, or
AEE_ENOSUCHSYMBOL for a missing symbol) and a text naming the library.
"""

from __future__ import annotations

import contextlib
import dataclasses
import re
import struct
import threading
from collections.abc import Mapping, Sequence
from typing import Final, NamedTuple

from npu_protocol.aee import AEE, describe_result
from npud.sim.errors import ReverseTimeoutError
from npud.sim.reverse import ReverseReply, ReverseRpc
from npud.sim.skels import DOMAIN_METHOD_OFFSET, HostFileError, Skel, SkelFactory

DESCRIPTOR_MAGIC: Final = "NPUD-SIM-SKEL 1"
MAX_LIBRARY_SIZE: Final = 64 * 1024
READ_CHUNK: Final = 16 * 1024
HOST_FILE_CHUNK: Final = 1024 * 1024
"""fread size for data files (models): what a loader streaming a large file would ask."""
DLERROR_CAPACITY: Final = 256

APPS_STD_MODULE: Final = "apps_std"
LIBRARY_PATH_VARIABLE: Final = "ADSP_LIBRARY_PATH"
LIBRARY_PATH_DELIMITER: Final = ";"

APPS_REMOTECTL_HANDLE: Final = 0
SC_REMOTECTL_OPEN: Final = 0x00020200
SC_FOPEN_WITH_ENV: Final = 0x13050100
SC_FLEN: Final = 0x0A010100
SC_FREAD: Final = 0x04010200
SC_FCLOSE: Final = 0x03010000

DOMAIN_SYMBOL_SUFFIX: Final = "_skel_handle_invoke"
PLAIN_SYMBOL_SUFFIX: Final = "_skel_invoke"

_U32: Final = struct.Struct("<I")
_U32_PAIR: Final = struct.Struct("<II")
_S32_PAIR: Final = struct.Struct("<ii")
_OPEN_RESULT: Final = struct.Struct("<Ii")
_U64: Final = struct.Struct("<Q")
_FOPEN_LENGTHS: Final = struct.Struct("<IIII")
_INTERFACE_NAME: Final = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


class LoadError(Exception):
    """A failed dlopen on the DSP: remotectl open reports ``code`` and ``message``."""

    def __init__(self, message: str, code: int = AEE.ENOSUCHMOD.dsp) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


class ModuleRequest(NamedTuple):
    library: str
    symbol: str


def parse_module_uri(uri: str) -> ModuleRequest:
    """The library and entry symbol a remotectl open name asks for."""
    if uri.startswith("file://"):
        path, _, query = uri[len("file://") :].partition("?")
        library = path.lstrip("/")
        symbols = [item for item in query.split("&") if item and "=" not in item]
        if not library:
            raise LoadError(f"{uri}: no library in the module URI")
        if len(symbols) != 1:
            raise LoadError(f"{library}: the module URI must name exactly one entry symbol")
        return ModuleRequest(library, symbols[0])
    if not _INTERFACE_NAME.fullmatch(uri):
        raise LoadError(f"{uri!r}: neither a file:/// URI nor an interface name")
    return ModuleRequest(f"lib{uri}_skel.so", f"{uri}{PLAIN_SYMBOL_SUFFIX}")


@dataclasses.dataclass(frozen=True)
class SkelDescriptor:
    skel: str
    symbols: tuple[str, ...]


def parse_descriptor(data: bytes, library: str) -> SkelDescriptor:
    """Parse a skel descriptor file (format in the module docstring)."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise LoadError(f"{library}: not a simulator skel descriptor (not UTF-8 text)") from None
    lines = text.splitlines()
    if not lines or lines[0].strip() != DESCRIPTOR_MAGIC:
        raise LoadError(
            f"{library}: not a simulator skel descriptor (no {DESCRIPTOR_MAGIC!r} line)"
        )
    fields: dict[str, str] = {}
    for number, raw in enumerate(lines[1:], start=2):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        key, equals, value = line.partition("=")
        key = key.strip()
        if not equals or key not in ("skel", "symbols") or key in fields:
            raise LoadError(f"{library}: descriptor line {number} is not a new skel= or symbols=")
        fields[key] = value.strip()
    if not fields.get("skel") or not fields.get("symbols"):
        raise LoadError(f"{library}: descriptor needs both skel= and symbols=")
    symbols = tuple(symbol.strip() for symbol in fields["symbols"].split(",") if symbol.strip())
    return SkelDescriptor(fields["skel"], symbols)


def method_offset(symbol: str) -> int | None:
    """2 for a remote_handle64 entry point, 0 for a plain one, None otherwise."""
    if symbol.endswith(DOMAIN_SYMBOL_SUFFIX):
        return DOMAIN_METHOD_OFFSET
    if symbol.endswith(PLAIN_SYMBOL_SUFFIX):
        return 0
    return None


class LoadedSkel(NamedTuple):
    skel: Skel
    method_offset: int
    library: str
    symbol: str


def _c_string(text: str) -> bytes:
    return text.encode("utf-8") + b"\0"


def _text(buffer: bytes) -> str:
    return buffer.split(b"\0", 1)[0].decode("utf-8", errors="replace")


class SkelLoader:
    """Loads skels for one DSP process; its reverse-RPC calls run on the caller's thread.

    It is also the process's :class:`~npud.sim.skels.HostFiles`: skel code reads
    data files (models) the same way, through apps_std on the host.
    """

    def __init__(
        self, reverse: ReverseRpc, skels: Mapping[str, SkelFactory], timeout: float
    ) -> None:
        self._reverse = reverse
        self._skels = skels
        self._timeout = timeout
        self._apps_std_lock = threading.Lock()
        self._apps_std: int | None = None

    def load(self, uri: str) -> LoadedSkel:
        """Bind the skel ``uri`` names; LoadError describes any failure.

        SubsystemDownError and ProcessExitedError from the reverse calls pass through.
        """
        request = parse_module_uri(uri)
        library = request.library
        apps_std = self._open_apps_std(library)
        descriptor = parse_descriptor(self._read_library(apps_std, library), library)
        factory = self._skels.get(descriptor.skel)
        if factory is None:
            raise LoadError(f"{library}: skel {descriptor.skel!r} is not built into this DSP")
        if request.symbol not in descriptor.symbols:
            raise LoadError(f"{library}: undefined symbol: {request.symbol}", AEE.ENOSUCHSYMBOL.dsp)
        offset = method_offset(request.symbol)
        if offset is None:
            raise LoadError(
                f"{library}: {request.symbol} is neither a *{DOMAIN_SYMBOL_SUFFIX}"
                f" nor a *{PLAIN_SYMBOL_SUFFIX} entry point",
                AEE.ENOSUCHSYMBOL.dsp,
            )
        return LoadedSkel(factory(), offset, library, request.symbol)

    def read_host_file(self, name: str, *, limit: int) -> bytes:
        """Read ``name`` whole through apps_std, in chunks of HOST_FILE_CHUNK.

        HostFileError(AEE_EUNABLETOLOAD) when it cannot be opened or read or is
        larger than ``limit``; SubsystemDownError / ProcessExitedError pass through.
        """
        try:
            apps_std = self._open_apps_std(name)
            return self._read_library(apps_std, name, limit=limit, chunk=HOST_FILE_CHUNK)
        except LoadError as exc:
            raise HostFileError(exc.message, AEE.EUNABLETOLOAD.dsp) from None

    def _call(
        self, library: str, handle: int, sc: int, inputs: Sequence[bytes], caps: Sequence[int]
    ) -> ReverseReply:
        try:
            return self._reverse.call(handle, sc, inputs, caps, self._timeout)
        except ReverseTimeoutError as exc:
            if exc.picked_up:
                detail = "the reverse-RPC listener did not answer"
            else:
                detail = "no reverse-RPC listener"
            raise LoadError(f"{library}: cannot open shared object file: {detail}") from None

    def _open_apps_std(self, library: str) -> int:
        with self._apps_std_lock:
            if self._apps_std is None:
                name = _c_string(APPS_STD_MODULE)
                reply = self._call(
                    library,
                    APPS_REMOTECTL_HANDLE,
                    SC_REMOTECTL_OPEN,
                    [_U32_PAIR.pack(len(name), DLERROR_CAPACITY), name],
                    [_OPEN_RESULT.size, DLERROR_CAPACITY],
                )
                if reply.result:
                    raise LoadError(
                        f"{library}: cannot open shared object file: host apps_std open"
                        f" failed with {describe_result(reply.result)}"
                    )
                handle, dl_error = _OPEN_RESULT.unpack(reply.outputs[0])
                if dl_error:
                    raise LoadError(
                        f"{library}: cannot open shared object file: host apps_std open"
                        f" failed: {_text(reply.outputs[1])}"
                    )
                self._apps_std = handle
            return self._apps_std

    def _read_library(
        self,
        apps_std: int,
        library: str,
        *,
        limit: int = MAX_LIBRARY_SIZE,
        chunk: int = READ_CHUNK,
    ) -> bytes:
        strings = [
            _c_string(LIBRARY_PATH_VARIABLE),
            _c_string(LIBRARY_PATH_DELIMITER),
            _c_string(library),
            _c_string("r"),
        ]
        lengths = _FOPEN_LENGTHS.pack(*(len(string) for string in strings))
        reply = self._call(library, apps_std, SC_FOPEN_WITH_ENV, [lengths, *strings], [_U32.size])
        if reply.result:
            raise LoadError(
                f"{library}: cannot open shared object file: No such file or directory"
                f" (apps_std fopen_with_env: {describe_result(reply.result)})"
            )
        (file,) = _U32.unpack(reply.outputs[0])
        try:
            data = self._read_file(apps_std, file, library, limit, chunk)
        except LoadError:
            self._close_file(apps_std, file, library)
            raise
        self._close_file(apps_std, file, library)
        return data

    def _read_file(
        self, apps_std: int, file: int, library: str, limit: int, read_chunk: int
    ) -> bytes:
        reply = self._call(library, apps_std, SC_FLEN, [_U32.pack(file)], [_U64.size])
        if reply.result:
            raise LoadError(
                f"{library}: cannot read file: apps_std flen: {describe_result(reply.result)}"
            )
        (length,) = _U64.unpack(reply.outputs[0])
        if length > limit:
            raise LoadError(f"{library}: {length} bytes is too large (at most {limit})")
        data = bytearray()
        while len(data) < length:
            chunk = min(read_chunk, length - len(data))
            reply = self._call(
                library, apps_std, SC_FREAD, [_U32_PAIR.pack(file, chunk)], [_S32_PAIR.size, chunk]
            )
            if reply.result:
                raise LoadError(
                    f"{library}: cannot read file: apps_std fread: {describe_result(reply.result)}"
                )
            count, eof = _S32_PAIR.unpack(reply.outputs[0])
            if not 0 <= count <= chunk:
                raise LoadError(f"{library}: cannot read file: fread returned {count} of {chunk}")
            data += reply.outputs[1][:count]
            if eof or count == 0:
                break
        return bytes(data)

    def _close_file(self, apps_std: int, file: int, library: str) -> None:
        # A failing fclose does not change the outcome of the load.
        with contextlib.suppress(LoadError):
            self._call(library, apps_std, SC_FCLOSE, [_U32.pack(file)], [])
