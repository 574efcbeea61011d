"""Raw-ioctl helpers for the emulator tests, built on the ctypes ABI of npud.fastrpc.

Everything here speaks to the EmulatedDriver exactly as session code speaks
to the kernel: ctypes structs from ``npud.fastrpc.kernel.abi``, request numbers from
there too. That cross-checks the emulator's independent layout description.

``ReverseResponder`` is a deliberately small reverse-RPC listener (handle 3,
init2/next2/get_in_bufs2) serving ``apps_remotectl`` open of ``apps_std`` and
the four ``apps_std`` file calls from one directory. The daemon's real
listener lives in npud/fastrpc/reverse/listener.py.
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import errno
import mmap
import os
import pathlib
import struct
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Final

from npud.fastrpc.kernel import abi
from npud.sim import DSP_LIBRARY_DIR, EmulatedDriver

AEE_EBADSTATE: Final = 0x8000040D
AEE_EBADPARM: Final = 0x8000040E
AEE_EUNSUPPORTED: Final = 0x80000414
AEE_EALREADY: Final = 0x8000041A
AEE_EINVHANDLE: Final = 0x8000042C
AEE_EINTERRUPTED: Final = 46
AEE_ENOSUCHMOD: Final = 0x8000043E
AEE_ENOSUCHSYMBOL: Final = 0x80000442
AEE_EBADELF: Final = 0x80000452
AEE_ENOTINITIALIZED: Final = 0x8000046B

SC_REMOTECTL_OPEN: Final = 0x00020200
SC_REMOTECTL_CLOSE: Final = 0x01010200
SC_LISTENER_INIT2: Final = 0x03000000
SC_LISTENER_NEXT2: Final = 0x04020200
SC_LISTENER_GET_IN_BUFS2: Final = 0x05010200
SC_EXIT: Final = 0x02000000
SC_ECHO: Final = 0x02020100
SC_FILL: Final = 0x02010100
SC_CHECKSUM: Final = 0x03020100
SC_BUSY: Final = 0x04010000

ECHO_URI: Final = "file:///libecho_skel.so?echo_skel_handle_invoke&_modver=1.0&_dom=cdsp"
NPU_TEST_URI: Final = (
    "file:///libnpu_test_skel.so?npu_test_skel_handle_invoke&_modver=1.0&_dom=cdsp"
)

PAGE: Final = 4096


def shell_image(*, machine: int = 164, elf_class: int = 1, data: int = 1, size: int = 256) -> bytes:
    """An ELF header the simulated DSP accepts as a shell (by default), padded to ``size``."""
    ident = b"\x7fELF" + bytes([elf_class, data, 1]) + bytes(9)
    header = struct.pack("<16sHHIIIIIHHHHHH", ident, 2, machine, 1, 0, 0, 0, 0, 52, 0, 0, 0, 0, 0)
    return header + bytes(max(0, size - len(header)))


# -- plain ioctl wrappers ------------------------------------------------------


def init_create(driver: EmulatedDriver, fd: int, image: bytes | None = None, attrs: int = 0) -> int:
    """INIT_CREATE with the image in plain memory (filefd 0)."""
    data = shell_image() if image is None else image
    buffer = ctypes.create_string_buffer(data, max(len(data), 1))
    request = abi.fastrpc_init_create(
        filelen=len(data), filefd=0, attrs=attrs, siglen=0, file=ctypes.addressof(buffer)
    )
    return driver.ioctl(fd, abi.FASTRPC_IOCTL_INIT_CREATE, request)


def alloc_dma_buf(driver: EmulatedDriver, fd: int, size: int) -> int:
    request = abi.fastrpc_alloc_dma_buf(fd=-1, flags=0, size=size)
    assert driver.ioctl(fd, abi.FASTRPC_IOCTL_ALLOC_DMA_BUFF, request) == 0
    return int(request.fd)


def get_capability(driver: EmulatedDriver, fd: int, attribute: int, domain: int = 3) -> int:
    request = abi.fastrpc_ioctl_capability(domain=domain, attribute_id=attribute)
    assert driver.ioctl(fd, abi.FASTRPC_IOCTL_GET_DSP_INFO, request) == 0
    return int(request.capability)


def mmap_heap(driver: EmulatedDriver, fd: int, size: int, flags: int = 0x1000) -> int:
    request = abi.fastrpc_req_mmap(fd=-1, flags=flags, vaddrin=0, size=size)
    assert driver.ioctl(fd, abi.FASTRPC_IOCTL_MMAP, request) == 0
    return int(request.vaddrout)


def mem_map(driver: EmulatedDriver, fd: int, buf_fd: int, length: int, offset: int = 0) -> int:
    request = abi.fastrpc_mem_map(fd=buf_fd, offset=offset, flags=2, length=length)
    assert driver.ioctl(fd, abi.FASTRPC_IOCTL_MEM_MAP, request) == 0
    return int(request.vaddrout)


def mem_unmap(driver: EmulatedDriver, fd: int, buf_fd: int, vaddr: int) -> int:
    request = abi.fastrpc_mem_unmap(fd=buf_fd, vaddr=vaddr)
    return driver.ioctl(fd, abi.FASTRPC_IOCTL_MEM_UNMAP, request)


# -- INVOKE --------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Arg:
    """One ``fastrpc_invoke_args`` entry, given as raw numbers."""

    ptr: int
    length: int
    fd: int = -1
    attr: int = 0


def invoke_args(driver: EmulatedDriver, fd: int, handle: int, sc: int, args: Sequence[Arg]) -> int:
    """INVOKE with exactly these argument entries."""
    array = (abi.fastrpc_invoke_args * max(len(args), 1))()
    for index, arg in enumerate(args):
        array[index] = abi.fastrpc_invoke_args(arg.ptr, arg.length, arg.fd, arg.attr)
    request = abi.fastrpc_invoke(handle=handle, sc=sc, args=ctypes.addressof(array) if args else 0)
    return driver.ioctl(fd, abi.FASTRPC_IOCTL_INVOKE, request)


def call(
    driver: EmulatedDriver,
    fd: int,
    handle: int,
    sc: int,
    inputs: Sequence[bytes],
    out_sizes: Sequence[int],
) -> tuple[int, list[bytes]]:
    """INVOKE with plain-memory buffers: the result and the output bytes."""
    in_buffers = [ctypes.create_string_buffer(data, max(len(data), 1)) for data in inputs]
    out_buffers = [ctypes.create_string_buffer(max(size, 1)) for size in out_sizes]
    args = [Arg(ctypes.addressof(b), len(d)) for b, d in zip(in_buffers, inputs, strict=True)]
    args += [Arg(ctypes.addressof(b), n) for b, n in zip(out_buffers, out_sizes, strict=True)]
    result = invoke_args(driver, fd, handle, sc, args)
    return result, [b.raw[:n] for b, n in zip(out_buffers, out_sizes, strict=True)]


@dataclasses.dataclass(frozen=True)
class OpenResult:
    result: int
    handle: int
    dl_error: int
    text: str


def remotectl_open(
    driver: EmulatedDriver, fd: int, uri: str, capacity: int = 255, handle: int = 0
) -> OpenResult:
    name = uri.encode() + b"\0"
    prim = struct.pack("<II", len(name), capacity)
    result, (status, text) = call(
        driver,
        fd,
        handle,
        SC_REMOTECTL_OPEN if handle == 0 else 0x02020200,
        [prim, name],
        [8, capacity],
    )
    remote, dl_error = struct.unpack("<Ii", status)
    return OpenResult(result, remote, dl_error & 0xFFFFFFFF, text.split(b"\0")[0].decode())


def remotectl_close(driver: EmulatedDriver, fd: int, remote: int) -> tuple[int, int]:
    result, (status, _) = call(
        driver, fd, 0, SC_REMOTECTL_CLOSE, [struct.pack("<II", remote, 64)], [4, 64]
    )
    return result, struct.unpack("<i", status)[0]


def exit_process(driver: EmulatedDriver, fd: int) -> int:
    return invoke_args(driver, fd, 4, SC_EXIT, [])


def echo(
    driver: EmulatedDriver, fd: int, handle: int, data: bytes, capacity: int
) -> tuple[int, bytes]:
    prim = struct.pack("<II", len(data), capacity)
    result, (out,) = call(driver, fd, handle, SC_ECHO, [prim, data], [capacity])
    return result, out


def fill(
    driver: EmulatedDriver, fd: int, handle: int, seed: int, capacity: int
) -> tuple[int, bytes]:
    result, (out,) = call(
        driver, fd, handle, SC_FILL, [struct.pack("<II", seed, capacity)], [capacity]
    )
    return result, out


def checksum(driver: EmulatedDriver, fd: int, handle: int, data: bytes) -> tuple[int, int]:
    result, (out,) = call(
        driver, fd, handle, SC_CHECKSUM, [struct.pack("<I", len(data)), data], [4]
    )
    return result, struct.unpack("<I", out)[0]


def busy(driver: EmulatedDriver, fd: int, handle: int, microseconds: int) -> int:
    result, _ = call(driver, fd, handle, SC_BUSY, [struct.pack("<I", microseconds)], [])
    return result


# -- failures, memory and fd accounting ---------------------------------------------


def errno_of(function: Callable[..., object], *args: object, **kwargs: object) -> int:
    """The errno that ``function(*args, **kwargs)`` fails with; it must fail with OSError."""
    try:
        function(*args, **kwargs)
    except OSError as exc:
        err = exc.errno
    else:
        raise AssertionError(f"{getattr(function, '__name__', function)} did not fail")
    assert err is not None
    return err


def open_fd_count() -> int:
    return len(os.listdir("/proc/self/fd"))


def address_of(mapping: mmap.mmap, offset: int = 0) -> int:
    """The address of byte ``offset`` of a writable mmap (holds no export afterwards)."""
    anchor = ctypes.c_char.from_buffer(mapping, offset)
    address = ctypes.addressof(anchor)
    del anchor
    return address


class RawPages:
    """Anonymous pages from libc mmap with any protection (PROT_NONE included)."""

    _libc = ctypes.CDLL(None, use_errno=True)
    _libc.mmap.restype = ctypes.c_void_p
    _libc.mmap.argtypes = (
        ctypes.c_void_p,
        ctypes.c_size_t,
        ctypes.c_int,
        ctypes.c_int,
        ctypes.c_int,
        ctypes.c_long,
    )
    _libc.munmap.argtypes = (ctypes.c_void_p, ctypes.c_size_t)

    def __init__(self, prot: int, pages: int = 1) -> None:
        self.length = pages * PAGE
        flags = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS
        address = self._libc.mmap(None, self.length, prot, flags, -1, 0)
        assert address not in (None, ctypes.c_void_p(-1).value)
        self.address: int = address

    def __enter__(self) -> RawPages:
        return self

    def __exit__(self, *exc_info: object) -> None:
        assert self._libc.munmap(self.address, self.length) == 0


# -- a minimal reverse-RPC responder ---------------------------------------------

APPS_STD_HANDLE: Final = 0x5A
ENOENT_HOST: Final = errno.ENOENT  # libcdsprpc's apps_std answers errno values

ReplyHook = Callable[[int, int, list[bytes]], tuple[int, list[bytes]] | None]


def _unpack_request(blob: bytes, inbufs: int, outbufs: int) -> tuple[list[bytes], list[int]]:
    cursor = 0
    inputs: list[bytes] = []
    for _ in range(inbufs):
        (length,) = struct.unpack_from("<I", blob, cursor)
        cursor += 4
        if length:
            cursor += -cursor % 8
            inputs.append(blob[cursor : cursor + length])
            cursor += length
        else:
            inputs.append(b"")
    capacities = [struct.unpack_from("<I", blob, cursor + 4 * i)[0] for i in range(outbufs)]
    return inputs, capacities


def pack_reply(outputs: Sequence[bytes]) -> bytes:
    blob = bytearray()
    for data in outputs:
        blob += struct.pack("<I", len(data))
        if data:
            blob += bytes(-len(blob) % 8)
            blob += data
    return bytes(blob)


def _c_str(data: bytes) -> str:
    return data.split(b"\0", 1)[0].decode()


class ReverseResponder:
    """A listener thread for one device fd; serves files from ``directory``.

    ``capacity`` is the bufs size announced to next2 (small values force
    get_in_bufs2). ``hook(handle, sc, inputs)`` may return (result, outputs)
    to answer a request itself, e.g. to send a malformed reply.
    """

    def __init__(
        self,
        driver: EmulatedDriver,
        fd: int,
        directory: pathlib.Path = DSP_LIBRARY_DIR,
        *,
        capacity: int = 4096,
        hook: ReplyHook | None = None,
    ) -> None:
        self.driver = driver
        self.fd = fd
        self.directory = directory
        self.capacity = capacity
        self.hook = hook
        self.requests: list[tuple[int, int]] = []  # (handle, sc) served
        self.exit_result: int | None = None
        self.exit_error: OSError | None = None
        self.interruptions = 0
        self.partial_fetches = 0
        self._files: dict[int, bytes] = {}
        self._positions: dict[int, int] = {}
        self._next_file = 1
        self._thread = threading.Thread(target=self._run, name="reverse-responder", daemon=True)

    def start(self) -> ReverseResponder:
        self._thread.start()
        return self

    def join(self, timeout: float = 10.0) -> None:
        self._thread.join(timeout)
        assert not self._thread.is_alive(), "the responder did not stop"

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def _run(self) -> None:
        try:
            result, _ = call(self.driver, self.fd, 3, SC_LISTENER_INIT2, [], [])
            if result != 0:
                self.exit_result = result
                return
            self._loop()
        except OSError as exc:
            self.exit_error = exc

    def _loop(self) -> None:
        ctx, result, reply = 0, 0xFFFFFFFF, b""
        while True:
            prim = struct.pack("<IIII", ctx, result, len(reply), self.capacity)
            ret, (header, bufs) = call(
                self.driver, self.fd, 3, SC_LISTENER_NEXT2, [prim, reply], [16, self.capacity]
            )
            if ret == AEE_EINTERRUPTED:
                self.interruptions += 1
                ctx, result, reply = 0, 0xFFFFFFFF, b""
                continue
            if ret != 0:
                self.exit_result = ret
                return
            ctx, handle, sc, needed = struct.unpack("<IIII", header)
            blob = bufs[: min(needed, self.capacity)]
            if needed > self.capacity:
                self.partial_fetches += 1
                rest = needed - self.capacity
                got, (count, more) = call(
                    self.driver,
                    self.fd,
                    3,
                    SC_LISTENER_GET_IN_BUFS2,
                    [struct.pack("<III", ctx, self.capacity, rest)],
                    [4, rest],
                )
                assert (got, struct.unpack("<I", count)[0]) == (0, needed)
                blob += more
            self.requests.append((handle, sc))
            result, outputs = self._serve(handle, sc, blob)
            reply = pack_reply(outputs) if result == 0 else b""

    def _serve(self, handle: int, sc: int, blob: bytes) -> tuple[int, list[bytes]]:
        inbufs, outbufs = (sc >> 16) & 0xFF, (sc >> 8) & 0xFF
        inputs, capacities = _unpack_request(blob, inbufs, outbufs)
        if self.hook is not None:
            answer = self.hook(handle, sc, inputs)
            if answer is not None:
                return answer
        method = (sc >> 24) & 0x1F
        if handle == 0 and method == 0:
            return self._open_module(inputs, capacities)
        if handle == APPS_STD_HANDLE:
            return self._apps_std(method, inputs, capacities)
        return 0x14, []  # AEE_EUNSUPPORTED (host side, bare)

    def _open_module(self, inputs: list[bytes], capacities: list[int]) -> tuple[int, list[bytes]]:
        name = _c_str(inputs[1])
        if name != "apps_std":
            text = f"{name}: no such module".encode()[: capacities[1] - 1]
            return 0, [struct.pack("<II", 0, 0x3E), text.ljust(capacities[1], b"\0")]
        return 0, [struct.pack("<II", APPS_STD_HANDLE, 0), bytes(capacities[1])]

    def _apps_std(
        self, method: int, inputs: list[bytes], capacities: list[int]
    ) -> tuple[int, list[bytes]]:
        if method == 19:  # fopen_with_env(var, delim, name, mode)
            path = self.directory / _c_str(inputs[3])
            if _c_str(inputs[1]) != "ADSP_LIBRARY_PATH" or not path.is_file():
                return ENOENT_HOST, []
            file = self._next_file
            self._next_file += 1
            self._files[file] = path.read_bytes()
            self._positions[file] = 0
            return 0, [struct.pack("<I", file)]
        (file,) = struct.unpack_from("<I", inputs[0])
        if file not in self._files:
            return errno.EBADF, []
        if method == 10:  # flen
            return 0, [struct.pack("<Q", len(self._files[file]))]
        if method == 4:  # fread(file, capacity)
            capacity = capacities[1]
            start = self._positions[file]
            chunk = self._files[file][start : start + capacity]
            self._positions[file] = start + len(chunk)
            eof = int(self._positions[file] >= len(self._files[file]))
            return 0, [struct.pack("<ii", len(chunk), eof), chunk.ljust(capacity, b"\0")]
        if method == 3:  # fclose
            del self._files[file]
            return 0, []
        return 0x14, []


@contextlib.contextmanager
def running_process(
    driver: EmulatedDriver,
    path: str = abi.CDSP_SECURE_NODE,
    *,
    capacity: int = 4096,
    hook: ReplyHook | None = None,
) -> Iterator[tuple[int, ReverseResponder]]:
    """An fd with a DSP process and a running responder; exits and closes cleanly."""
    fd = driver.open(path, os.O_RDWR)
    try:
        assert init_create(driver, fd) == 0
        responder = ReverseResponder(driver, fd, capacity=capacity, hook=hook).start()
        try:
            yield fd, responder
        finally:
            with contextlib.suppress(OSError):  # EPIPE when the test restarted the DSP
                exit_process(driver, fd)
            responder.join()
    finally:
        driver.close(fd)


def open_skel(driver: EmulatedDriver, fd: int, uri: str = ECHO_URI) -> int:
    opened = remotectl_open(driver, fd, uri)
    assert (opened.result, opened.dl_error) == (0, 0), opened
    return opened.handle
