"""How the simulated DSP loads a skel: through the host's listener, like the real one.

remotectl open names a module either as a URI,
``file:///libX_skel.so?X_skel_handle_invoke&_modver=1.0&_dom=cdsp``, or by a
bare interface name ``X`` (library ``libX_skel.so``, symbol ``X_skel_invoke``).
The DSP then reads that library from the host filesystem with reverse RPC:
once per process ``apps_remotectl`` open of ``"apps_std"`` on reverse handle 0
(:mod:`npud.sim.host_calls`), then one of the apps_std paths of
``SimConfig.loader_paths`` (:mod:`npud.sim.host_files`). A loaded library
stays on the process's heap while its handle is open; the heap grows through
the host's ``apps_mem`` when it does not fit (:mod:`npud.sim.apps_mem`).

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

import dataclasses
import re
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Final, NamedTuple

from npu_protocol.aee import AEE
from npud.sim.apps_mem import DspHeap, HeapExhaustedError, HeapReservation
from npud.sim.errors import LoadError
from npud.sim.host_files import HostFileReader, HostReadError
from npud.sim.skels import DOMAIN_METHOD_OFFSET, HostFileError, SkelFactory

if TYPE_CHECKING:
    from npud.sim.pd import SkelInstance

Instantiate = Callable[[str, SkelFactory, int], "SkelInstance"]
"""Makes the skel instance of an open handle where the process runs its skels:
(skel name, factory, method offset); LoadError when it cannot."""

DESCRIPTOR_MAGIC: Final = "NPUD-SIM-SKEL 1"
MAX_LIBRARY_SIZE: Final = 64 * 1024
READ_CHUNK: Final = 16 * 1024
HOST_FILE_CHUNK: Final = 1024 * 1024
"""fread size for data files (models): what a loader streaming a large file would ask."""

DOMAIN_SYMBOL_SUFFIX: Final = "_skel_handle_invoke"
PLAIN_SYMBOL_SUFFIX: Final = "_skel_invoke"

_INTERFACE_NAME: Final = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


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
    instance: SkelInstance
    method_offset: int
    library: str
    symbol: str
    resident: HeapReservation

    def unload(self) -> None:
        """The handle closes: the skel's close hook runs and its library leaves the heap."""
        try:
            self.instance.close()
        finally:
            self.resident.release()


class SkelLoader:
    """Loads skels for one DSP process; its reverse-RPC calls run on the caller's thread.

    It is also the process's :class:`~npud.sim.skels.HostFiles`: skel code reads
    data files (models) the same way, through apps_std on the host.
    """

    def __init__(
        self,
        files: HostFileReader,
        heap: DspHeap,
        skels: Mapping[str, SkelFactory],
        instantiate: Instantiate,
        probes: Sequence[str] = (),
    ) -> None:
        self._files = files
        self._heap = heap
        self._skels = skels
        self._instantiate = instantiate
        self._probes = tuple(probes)  # asked for before the process's first library

    def load(self, uri: str) -> LoadedSkel:
        """Bind the skel ``uri`` names; LoadError describes any failure.

        SubsystemDownError and ProcessExitedError from the reverse calls pass through,
        and PdGoneError when the process's child ended.
        """
        request = parse_module_uri(uri)
        library = request.library
        try:
            self._probe()
            data = self._files.read(library, limit=MAX_LIBRARY_SIZE, chunk=READ_CHUNK).data
        except HostReadError as exc:
            raise LoadError(exc.message) from None
        descriptor = parse_descriptor(data, library)
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
        try:
            resident = self._heap.reserve(len(data), library)
        except HeapExhaustedError as exc:
            raise LoadError(f"{library}: cannot map segments: {exc.message}", exc.code) from None
        try:
            instance = self._instantiate(descriptor.skel, factory, offset)
        except LoadError as exc:
            resident.release()
            raise LoadError(f"{library}: {exc.message}", exc.code) from None
        except BaseException:
            resident.release()
            raise
        return LoadedSkel(instance, offset, library, request.symbol, resident)

    def _probe(self) -> None:
        """The files the loader looks for on its own; HostReadError when the host answers
        one with anything but the file or ENOENT. Done once, when all pass."""
        for name in self._probes:
            self._files.probe(name)
        self._probes = ()

    def read_host_file(self, name: str, *, limit: int) -> bytes:
        """Read ``name`` whole from the host, in chunks of HOST_FILE_CHUNK where it streams.

        HostFileError(AEE_EUNABLETOLOAD) when it cannot be opened or read or is
        larger than ``limit``, HostFileError(AEE_ENOMEMORY) when the heap cannot
        hold it (a streamed file is on the heap while it is parsed: the heap grows
        for it and gives the growth back after); SubsystemDownError /
        ProcessExitedError pass through.
        """
        try:
            file = self._files.read(name, limit=limit, chunk=HOST_FILE_CHUNK)
            if file.streamed:
                # fread put the bytes in heap; a mapped file (the _fd paths) uses none.
                self._heap.reserve(len(file.data), name).release()
        except HostReadError as exc:
            raise HostFileError(exc.message, AEE.EUNABLETOLOAD.dsp) from None
        except HeapExhaustedError as exc:
            raise HostFileError(exc.message, exc.code) from None
        return file.data
