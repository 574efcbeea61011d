"""apps_mem: the DSP grows its heap through the host, the session serves it with MMAP / MUNMAP.

The emulated user PD starts with ``SimConfig.initial_heap`` bytes (here 0 or a
little) so that loading a library or streaming a model does not fit: the
DSP then calls ``apps_mem.request_map64`` through the listener, the session
answers with the MMAP ioctl, and the kernel records the buffer
(``SimStatistics.mmap_buffers``). Closing the handle gives the growth back
(``request_unmap64``, MUNMAP). Without the host's apps_mem every such load fails.
"""

from __future__ import annotations

import errno
import struct
from collections.abc import Iterator
from pathlib import Path

import pytest

from npu_protocol import AEE, ErrorCode
from npud import idl
from npud.fastrpc.kernel import abi
from npud.fastrpc.kernel.errors import RpcError
from npud.fastrpc.kernel.invoke_args import Capacity, Inline
from npud.fastrpc.reverse.apps_mem import AppsMemServer
from npud.fastrpc.session import FastRpcSession
from npud.fastrpc.stubs.portal_qnn import PortalQnn
from npud.ops.backend import DEV_SHELL
from npud.sim import DSP_LIBRARY_DIR, EmulatedDriver, SimConfig
from npud.sim.apps_mem import DspHeap, HeapExhaustedError
from npud.sim.reverse import ReverseReply
from tests.emulator import onnx_models
from tests.emulator.conftest import ECHO_URI, open_fds
from tests.emulator.onnx_models import opened

APPS_MEM = idl.load("apps_mem")


def open_session(driver: EmulatedDriver) -> FastRpcSession:
    session = FastRpcSession.open(driver, library_path=[DSP_LIBRARY_DIR])
    session.load_shell(DEV_SHELL.read_bytes())
    return session


@pytest.fixture
def tight() -> Iterator[tuple[EmulatedDriver, FastRpcSession]]:
    """A DSP process that starts with no heap at all: every load grows it."""
    before = open_fds()
    driver = EmulatedDriver(SimConfig(initial_heap=0))
    session = open_session(driver)
    yield driver, session
    session.close()
    assert open_fds() == before
    assert driver.statistics().mmap_buffers == 0


def echo(session: FastRpcSession, handle: int, data: bytes) -> bytes:
    prim = struct.pack("<II", len(data), len(data))
    result = session.invoke(handle, 0x02020100, [Inline(prim), Inline(data)], [Capacity(len(data))])
    assert result.rc == 0
    return result.output(0)


def test_a_skel_that_does_not_fit_grows_the_heap_through_the_host(
    tight: tuple[EmulatedDriver, FastRpcSession],
) -> None:
    driver, session = tight
    handle = session.remote_open(ECHO_URI)
    assert driver.statistics().mmap_buffers == 1  # the host's MMAP, recorded by the kernel
    assert echo(session, handle, b"grown") == b"grown"
    session.remote_close(handle)
    # The library left the heap: the growth went back (request_unmap64, MUNMAP).
    assert driver.statistics().mmap_buffers == 0


def test_a_model_larger_than_the_heap_loads(
    tight: tuple[EmulatedDriver, FastRpcSession], tmp_path: Path
) -> None:
    driver, session = tight
    requests = session.statistics().listener_requests
    with PortalQnn.open(session, backend="emulator") as portal:
        with opened(tmp_path, "m.onnx", onnx_models.add_one()) as fd:
            model = portal.load(fd)
        portal.unload(model.slot)
    assert session.statistics().listener_requests > requests
    assert driver.statistics().mmap_buffers == 0


def test_a_refused_growth_fails_the_load_and_nothing_else(
    tight: tuple[EmulatedDriver, FastRpcSession],
) -> None:
    driver, session = tight
    driver.faults.fail_next_ioctl(abi.FASTRPC_IOCTL_MMAP, errno.ENOMEM)
    with pytest.raises(RpcError) as caught:
        session.remote_open(ECHO_URI)
    assert caught.value.code is ErrorCode.OPEN_FAILED
    assert "AEE_ENOMEMORY" in str(caught.value)
    assert "apps_mem request_map64" in str(caught.value)
    assert driver.statistics().mmap_buffers == 0
    # The session and its listener are fine: the next load grows the heap.
    handle = session.remote_open(ECHO_URI)
    assert echo(session, handle, b"ok") == b"ok"


def test_a_kernel_errno_from_mmap_reaches_the_dsp_as_an_aee_code(
    tight: tuple[EmulatedDriver, FastRpcSession],
) -> None:
    driver, session = tight
    # libcdsprpc's conversion: EINVAL is AEE_EBADPARM; the load names it.
    driver.faults.fail_next_ioctl(abi.FASTRPC_IOCTL_MMAP, errno.EINVAL)
    with pytest.raises(RpcError) as caught:
        session.remote_open(ECHO_URI)
    assert "AEE_EBADPARM" in str(caught.value)


def test_the_default_heap_holds_the_builtin_skels() -> None:
    driver = EmulatedDriver()
    session = open_session(driver)
    try:
        handle = session.remote_open(ECHO_URI)
        assert driver.statistics().mmap_buffers == 0
        session.remote_close(handle)
    finally:
        session.close()


def test_the_kernels_initial_memory_rule() -> None:
    config = SimConfig()
    assert config.heap_for(0) == 2 << 20
    assert config.heap_for(700_000) == 3 << 20  # 4 x 700 kB rounded up to a MiB
    assert config.heap_for(2 << 20) == 8 << 20
    assert SimConfig(initial_heap=4096).heap_for(2 << 20) == 4096
    with pytest.raises(ValueError, match="initial_heap"):
        SimConfig(initial_heap=-1)


# --- the host module on its own ------------------------------------------------------


class FakeKernel:
    """MMAP / MUNMAP as the kernel answers them, with failures on demand."""

    def __init__(self) -> None:
        self.maps: dict[int, int] = {}
        self.next = 0x2000_0000
        self.fail: OSError | None = None
        self.result = 0
        self.seen: list[tuple[str, int, int]] = []

    def heap_map(self, size: int, flags: int) -> tuple[int, int]:
        self.seen.append(("map", size, flags))
        if self.fail is not None:
            raise self.fail
        if self.result:
            return self.result, 0
        vaddr, self.next = self.next, self.next + size
        self.maps[vaddr] = size
        return 0, vaddr

    def heap_unmap(self, vaddr: int, size: int) -> int:
        self.seen.append(("unmap", vaddr, size))
        if self.fail is not None:
            raise self.fail
        if self.maps.get(vaddr) != size:
            raise OSError(errno.EINVAL, "not mapped")
        del self.maps[vaddr]
        return 0


def call(server: AppsMemServer, name: str, **arguments: object) -> tuple[int, idl.Values | None]:
    method = APPS_MEM.method(name)
    encoded = method.encode(**arguments)
    inputs = [b for b in encoded.inputs if isinstance(b, bytes)]
    caps = [c for c in encoded.outputs if isinstance(c, int)]
    reply = server.invoke(method.index, method.sc, inputs, caps)
    if reply.result != 0 or not method.outbufs:
        return reply.result, None
    return 0, method.decode(list(reply.outputs))


MAP64 = {"heapid": -1, "ion_flags": 0, "rflags": 0x1000, "vin": 0}


def test_request_map64_and_unmap64() -> None:
    kernel = FakeKernel()
    server = AppsMemServer(kernel)
    rc, values = call(server, "request_map64", len=1 << 20, **MAP64)
    assert rc == 0
    assert values is not None
    assert values["vapps"] == 0  # the kernel allocates: no host address
    vaddr = values.integer("vadsp")
    assert kernel.seen == [("map", 1 << 20, 0x1000)]
    assert call(server, "request_unmap64", vadsp=vaddr, len=1 << 20) == (0, None)
    assert kernel.maps == {}
    # Unknown address: nothing was mapped there.
    assert call(server, "request_unmap64", vadsp=vaddr, len=1 << 20)[0] == AEE.ENOSUCHMAP


def test_the_32_bit_forms() -> None:
    kernel = FakeKernel()
    server = AppsMemServer(kernel)
    rc, values = call(server, "request_map", heapid=-1, ion_flags=0, rflags=8, vin=0, len=4096)
    assert rc == 0
    assert values is not None
    assert call(server, "request_unmap", vadsp=values.integer("vadsp"), len=4096) == (0, None)


@pytest.mark.parametrize("rflags", [0, 4, 0x3000, 0x10000])
def test_rflags_the_kernel_does_not_serve_are_unsupported(rflags: int) -> None:
    kernel = FakeKernel()
    arguments = {**MAP64, "rflags": rflags}
    assert (
        call(AppsMemServer(kernel), "request_map64", len=4096, **arguments)[0] == AEE.EUNSUPPORTED
    )
    assert kernel.seen == []


@pytest.mark.parametrize("length", [0, -4096, 1 << 32])
def test_bad_lengths(length: int) -> None:
    kernel = FakeKernel()
    assert call(AppsMemServer(kernel), "request_map64", len=length, **MAP64)[0] == AEE.EBADPARM
    assert kernel.seen == []


def test_kernel_failures_become_aee_codes() -> None:
    kernel = FakeKernel()
    server = AppsMemServer(kernel)
    kernel.fail = OSError(errno.ENOMEM, "no memory")
    assert call(server, "request_map64", len=4096, **MAP64)[0] == AEE.ENOMEMORY
    kernel.fail = OSError(errno.ETIMEDOUT, "timed out")
    assert call(server, "request_map64", len=4096, **MAP64)[0] == AEE.EEXPIRED
    kernel.fail = None
    kernel.result = AEE.EFAILED.dsp
    assert call(server, "request_map64", len=4096, **MAP64)[0] == AEE.EFAILED.dsp
    assert server.grants == ()


def test_unmap_with_the_wrong_length_keeps_the_grant() -> None:
    kernel = FakeKernel()
    server = AppsMemServer(kernel)
    _, values = call(server, "request_map64", len=8192, **MAP64)
    assert values is not None
    vaddr = values.integer("vadsp")
    assert call(server, "request_unmap64", vadsp=vaddr, len=4096)[0] == AEE.EBADPARM
    assert len(server.grants) == 1
    server.close()  # the kernel frees MMAP buffers with the fd
    assert not server.grants


@pytest.mark.parametrize("name", ["share_map", "share_unmap", "dma_handle_map", "dma_handle_unmap"])
def test_calls_that_name_host_fds_are_unsupported(name: str) -> None:
    method = APPS_MEM.method(name)
    inputs = [bytes(method.prim_in.size)]
    caps = [method.prim_rout.size] if method.prim_rout else []
    assert AppsMemServer(FakeKernel()).invoke(method.index, method.sc, inputs, caps).result == (
        AEE.EUNSUPPORTED
    )


def test_badly_marshalled_calls() -> None:
    server = AppsMemServer(FakeKernel())
    method = APPS_MEM.method("request_map64")
    assert server.invoke(method.index, method.sc, [b"\0" * 8], [16]).result == AEE.EBADPARM
    assert server.invoke(method.index, 0x02020100, [b"\0" * 32], [16]).result == AEE.EBADPARM
    assert server.invoke(9, abi.remote_scalars_make(9, 0, 0), [], []).result == AEE.EUNSUPPORTED


# --- the DSP's side: the heap's bookkeeping -------------------------------------------


class FakeHost:
    """The host as the simulated DSP's heap sees it: grants addresses, may refuse a shrink."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, int, int]] = []
        self.refuse_unmap = False
        self.next = 0x3000_0000

    def module(self, name: str) -> int:
        assert name == "apps_mem"
        return 0x1010

    def call(self, handle: int, sc: int, inputs: list[bytes], caps: list[int]) -> ReverseReply:
        method = (sc >> 24) & 0x1F
        if method == 2:
            values = APPS_MEM.method("request_map64").unpack(
                [memoryview(b) for b in inputs], [memoryview(bytearray(16))]
            )
            size = values.integer("len")
            self.calls.append(("map", size, values.integer("rflags")))
            vaddr, self.next = self.next, self.next + size
            return ReverseReply(0, [struct.pack("<QQ", 0, vaddr)])
        vaddr, size = struct.unpack("<Qq", inputs[0])
        self.calls.append(("unmap", vaddr, size))
        return ReverseReply(AEE.EFAILED.dsp if self.refuse_unmap else 0, [])


def test_the_heap_grows_in_whole_mib_and_gives_back_newest_first() -> None:
    host = FakeHost()
    heap = DspHeap(1000, host)  # type: ignore[arg-type]
    first = heap.reserve(1000, "a")  # fits the initial memory
    assert host.calls == []
    second = heap.reserve(10, "b")
    assert host.calls == [("map", 1 << 20, 0x1000)]  # 10 bytes short: one whole MiB
    third = heap.reserve((2 << 20) + 1, "c")
    assert host.calls[-1] == ("map", 2 << 20, 0x1000)  # 1 MiB + 11 bytes short
    assert heap.capacity == 1000 + (3 << 20)
    third.release()  # the newest grant is no longer needed
    assert host.calls[-1] == ("unmap", 0x3010_0000, 2 << 20)
    second.release()
    assert host.calls[-1] == ("unmap", 0x3000_0000, 1 << 20)
    assert heap.grants == ()
    first.release()
    first.release()  # once only
    assert heap.used == 0


def test_a_refused_shrink_keeps_the_grant_and_a_closed_heap_calls_nobody() -> None:
    host = FakeHost()
    heap = DspHeap(0, host)  # type: ignore[arg-type]
    held = heap.reserve(5, "x")
    host.refuse_unmap = True
    held.release()
    assert len(heap.grants) == 1
    held = heap.reserve(5, "y")  # fits the kept grant: no new call
    assert len(host.calls) == 2
    heap.close()
    host.refuse_unmap = False
    held.release()
    assert len(host.calls) == 2


def test_a_refused_growth_is_heap_exhausted() -> None:
    class Refusing(FakeHost):
        def call(self, handle: int, sc: int, inputs: list[bytes], caps: list[int]) -> ReverseReply:
            return ReverseReply(int(AEE.ENOMEMORY), [])

    heap = DspHeap(0, Refusing())  # type: ignore[arg-type]
    with pytest.raises(HeapExhaustedError, match="apps_mem request_map64") as caught:
        heap.reserve(1, "libx_skel.so")
    assert caught.value.code == AEE.ENOMEMORY.dsp
    assert heap.used == 0
