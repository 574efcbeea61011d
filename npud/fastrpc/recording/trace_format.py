"""The trace format's vocabulary, shared by the recorder and the replay (docs/trace-format.md).

Everything here turns one Driver call into JSON values that mean the same in
another process on another day: fds become symbols (``dev0``, ``buf3``),
pointers into a DMA-BUF's mapping become ``buf3+4096``, pointers into plain
memory become ``memory`` with the bytes recorded beside them, and data is
base64 with its trailing zero bytes trimmed. Pure functions and two small
tables; the only memory they read is what a call's pointers point at.
"""

from __future__ import annotations

import base64
import bisect
import ctypes
import hashlib
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

from npud.fastrpc.kernel import abi
from npud.fastrpc.kernel.trace_hooks import JsonValue, Record, encode_data

TRACE_FORMAT: Final = "npud-trace"
TRACE_VERSION: Final = 1

STRUCTS: Final[Mapping[int, type[ctypes.Structure]]] = {
    abi.FASTRPC_IOCTL_ALLOC_DMA_BUFF: abi.fastrpc_alloc_dma_buf,
    abi.FASTRPC_IOCTL_INVOKE: abi.fastrpc_invoke,
    abi.FASTRPC_IOCTL_INIT_CREATE: abi.fastrpc_init_create,
    abi.FASTRPC_IOCTL_MMAP: abi.fastrpc_req_mmap,
    abi.FASTRPC_IOCTL_MUNMAP: abi.fastrpc_req_munmap,
    abi.FASTRPC_IOCTL_INIT_CREATE_STATIC: abi.fastrpc_init_create_static,
    abi.FASTRPC_IOCTL_MEM_MAP: abi.fastrpc_mem_map,
    abi.FASTRPC_IOCTL_MEM_UNMAP: abi.fastrpc_mem_unmap,
    abi.FASTRPC_IOCTL_GET_DSP_INFO: abi.fastrpc_ioctl_capability,
    abi.DMA_HEAP_IOCTL_ALLOC: abi.dma_heap_allocation_data,
}
POINTER_FIELDS: Final[Mapping[int, frozenset[str]]] = {
    abi.FASTRPC_IOCTL_INVOKE: frozenset({"args"}),
    abi.FASTRPC_IOCTL_INIT_CREATE: frozenset({"file"}),
    abi.FASTRPC_IOCTL_MEM_MAP: frozenset({"vaddrin"}),
    abi.FASTRPC_IOCTL_INIT_CREATE_STATIC: frozenset({"name"}),
}
FD_FIELDS: Final[Mapping[int, frozenset[str]]] = {
    abi.FASTRPC_IOCTL_ALLOC_DMA_BUFF: frozenset({"fd"}),
    abi.FASTRPC_IOCTL_INIT_CREATE: frozenset({"filefd"}),
    abi.FASTRPC_IOCTL_MMAP: frozenset({"fd"}),
    abi.FASTRPC_IOCTL_MEM_MAP: frozenset({"fd"}),
    abi.FASTRPC_IOCTL_MEM_UNMAP: frozenset({"fd"}),
    abi.DMA_HEAP_IOCTL_ALLOC: frozenset({"fd"}),
}
OUTPUT_FIELDS: Final[Mapping[int, tuple[str, ...]]] = {
    abi.FASTRPC_IOCTL_ALLOC_DMA_BUFF: ("fd",),
    abi.DMA_HEAP_IOCTL_ALLOC: ("fd",),
    abi.FASTRPC_IOCTL_MMAP: ("vaddrout",),
    abi.FASTRPC_IOCTL_MEM_MAP: ("vaddrout",),
    # The pre-2024 copy-back bug writes the answer over ``domain``.
    abi.FASTRPC_IOCTL_GET_DSP_INFO: ("domain", "capability"),
}
"""The fields the kernel writes: the only ones a replay gives back."""


def request_name(request: int) -> str:
    return abi.ioctl_name(request)


# --- data -------------------------------------------------------------------------------


def decode_data(record: Record) -> bytes | None:
    """The bytes of an ``encode_data`` record (:mod:`npud.fastrpc.kernel.trace_hooks`);
    None when only a digest was kept."""
    if "b64" not in record:
        return None
    data = base64.b64decode(record["b64"])
    length = int(record["len"])
    if len(data) > length:
        raise ValueError(f"data of {len(data)} bytes in a record of length {length}")
    return data.ljust(length, b"\0")


def same_data(recorded: Record, data: bytes) -> bool:
    """Whether ``data`` is what ``recorded`` describes (by digest when that is all there is)."""
    if int(recorded["len"]) != len(data):
        return False
    expected = decode_data(recorded)
    if expected is None:
        return bool(recorded.get("sha256") == hashlib.sha256(data).hexdigest())
    return expected == data


# --- fds and mappings ------------------------------------------------------------------


class Symbols:
    """fd numbers <-> stable names: ``dev<k>`` for device nodes, ``buf<k>`` for DMA-BUFs."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_fd: dict[int, str] = {}
        self._count: dict[str, int] = {}

    def assign(self, kind: str, fd: int) -> str:
        with self._lock:
            index = self._count.get(kind, 0)
            self._count[kind] = index + 1
            symbol = f"{kind}{index}"
            self._by_fd[fd] = symbol
            return symbol

    def name(self, fd: int) -> str | int:
        """The symbol of ``fd``; -1 and 0 (no fd) and unknown numbers stay numbers."""
        with self._lock:
            return self._by_fd.get(fd, fd)

    def fd(self, symbol: str) -> int | None:
        with self._lock:
            for fd, known in self._by_fd.items():
                if known == symbol:
                    return fd
            return None

    def forget(self, fd: int) -> str | int:
        with self._lock:
            return self._by_fd.pop(fd, fd)


class Mappings:
    """Host mappings of DMA-BUFs (what Driver.mmap returned), to name pointers into them."""

    @dataclass(frozen=True)
    class _Entry:
        start: int
        end: int
        symbol: str

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._entries: list[Mappings._Entry] = []

    def add(self, symbol: str, address: int, length: int) -> None:
        with self._lock:
            bisect.insort(self._entries, self._Entry(address, address + length, symbol), key=_start)

    def forget(self, symbol: str) -> None:
        with self._lock:
            self._entries = [entry for entry in self._entries if entry.symbol != symbol]

    def locate(self, address: int) -> tuple[str, int] | None:
        """(symbol, offset) of the mapping that holds ``address``, or None."""
        with self._lock:
            index = bisect.bisect_right(self._entries, address, key=_start) - 1
            if index >= 0 and address < self._entries[index].end:
                entry = self._entries[index]
                return entry.symbol, address - entry.start
            return None


def _start(entry: Mappings._Entry) -> int:
    return entry.start


def mapping_address(mapping: object) -> int:
    """The address of a writable mmap's first byte (holds no export afterwards)."""
    anchor = ctypes.c_char.from_buffer(mapping)  # type: ignore[arg-type]
    address = ctypes.addressof(anchor)
    del anchor
    return address


# --- structs ---------------------------------------------------------------------------


def struct_bytes(arg: object) -> bytes:
    """The bytes of an ioctl argument (a ctypes structure or array), b"" for None."""
    if arg is None:
        return b""
    return bytes(memoryview(arg).cast("B"))  # type: ignore[arg-type]


def raw_fields(request: int, raw: bytes) -> dict[str, int | list[int]]:
    """The struct's fields by name (FREE_DMA_BUFF's argument is one u32 fd)."""
    struct_type = STRUCTS.get(request)
    if struct_type is None:
        if request == abi.FASTRPC_IOCTL_FREE_DMA_BUFF and len(raw) >= 4:
            return {"fd": int.from_bytes(raw[:4], "little")}
        return {}
    value = struct_type.from_buffer_copy(raw.ljust(ctypes.sizeof(struct_type), b"\0"))
    fields: dict[str, int | list[int]] = {}
    for name, *_ in struct_type._fields_:
        item = getattr(value, name)
        fields[name] = list(item) if isinstance(item, ctypes.Array) else int(item)
    return fields


def normalized_fields(
    request: int, raw: bytes, symbols: Symbols, mappings: Mappings
) -> dict[str, JsonValue]:
    """The fields as they compare across runs: pointers located, fds named."""
    fields: dict[str, JsonValue] = dict(raw_fields(request, raw))
    pointers = POINTER_FIELDS.get(request, frozenset())
    fds = FD_FIELDS.get(request, frozenset())
    if request == abi.FASTRPC_IOCTL_FREE_DMA_BUFF:
        fds = frozenset({"fd"})
    for name, value in fields.items():
        if name in pointers and isinstance(value, int):
            fields[name] = locate_pointer(value, mappings)
        elif name in fds and isinstance(value, int):
            fields[name] = symbols.name(_signed32(value))
    return fields


def locate_pointer(address: int, mappings: Mappings) -> str | int:
    """``buf3+4096`` inside a DMA-BUF mapping, ``memory`` elsewhere, 0 for NULL."""
    if address == 0:
        return 0
    found = mappings.locate(address)
    return f"{found[0]}+{found[1]}" if found else "memory"


def _signed32(value: int) -> int:
    return value - (1 << 32) if value & 0x8000_0000 else value


def is_plain(fd: int, length: int) -> bool:
    """The kernel's rule for an invoke buffer: fd -1 or 0, or no bytes, is plain memory."""
    return fd in (0, -1) or length == 0


def invoke_slots(raw: bytes) -> list[abi.fastrpc_invoke_args]:
    """The argument array an INVOKE struct points at (read from this process's memory)."""
    fields = raw_fields(abi.FASTRPC_IOCTL_INVOKE, raw)
    sc, pointer = fields["sc"], fields["args"]
    assert isinstance(sc, int)
    assert isinstance(pointer, int)
    count = abi.remote_scalars_length(sc)
    if not count or not pointer:
        return []
    return list((abi.fastrpc_invoke_args * count).from_address(pointer))


def describe_invoke_args(
    raw: bytes, symbols: Symbols, mappings: Mappings, limit: int, *, outputs: bool
) -> list[Record]:
    """Each argument of an INVOKE: where it lives and, for inputs (``outputs=False``)
    or outputs (``outputs=True``), its bytes."""
    fields = raw_fields(abi.FASTRPC_IOCTL_INVOKE, raw)
    sc = fields["sc"]
    assert isinstance(sc, int)
    inbufs = abi.remote_scalars_inbufs(sc)
    nbufs = inbufs + abi.remote_scalars_outbufs(sc)
    described: list[Record] = []
    for index, slot in enumerate(invoke_slots(raw)):
        length, fd = int(slot.length), int(slot.fd)
        entry: Record = {
            "dir": "in" if index < inbufs else "out" if index < nbufs else "handle",
            "len": length,
            "attr": int(slot.attr),
        }
        if is_plain(fd, length):
            entry["where"] = "memory"
        else:
            entry["fd"] = symbols.name(fd)
            entry["where"] = locate_pointer(int(slot.ptr), mappings)
        wanted = (index >= inbufs) if outputs else (index < inbufs)
        if wanted and index < nbufs and length:
            entry["data"] = encode_data(ctypes.string_at(int(slot.ptr), length), limit)
        described.append(entry)
    return described
