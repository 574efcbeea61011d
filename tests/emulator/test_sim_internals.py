"""Building blocks of the emulator: user-memory access, the DSP address space, packing."""

from __future__ import annotations

import ctypes
import errno
import mmap

import pytest

from npud.sim.addrspace import AddressSpaceFullError, DspAddressSpace
from npud.sim.errors import LoadError
from npud.sim.loader import parse_module_uri
from npud.sim.reverse import BadReverseMessageError, pack_request, unpack_reply
from npud.sim.usermem import Copy, UserMemory
from npud.sim.vmas import VmaFinder
from tests.emulator.sim_helpers import PAGE, RawPages, errno_of


@pytest.fixture(params=[True, False], ids=["process_vm", "maps_fallback"])
def memory(request: pytest.FixtureRequest) -> UserMemory:
    return UserMemory(use_process_vm=request.param)


def test_read_and_write_user_memory(memory: UserMemory) -> None:
    buffer = ctypes.create_string_buffer(b"0123456789", 10)
    assert memory.read(ctypes.addressof(buffer) + 2, 5) == b"23456"
    memory.write(ctypes.addressof(buffer) + 8, b"xy")
    assert buffer.raw == b"01234567xy"
    assert memory.read(0, 0) == b""  # nothing to read: no pointer needed
    memory.write(0, b"")


@pytest.mark.parametrize("prot", [0, mmap.PROT_READ])
def test_bad_user_pointers_are_efault(memory: UserMemory, prot: int) -> None:
    with RawPages(prot=prot, pages=2) as pages:
        assert errno_of(memory.write, pages.address, b"x") == errno.EFAULT
        if prot == 0:
            assert errno_of(memory.read, pages.address + PAGE, 1) == errno.EFAULT
        else:
            assert memory.read(pages.address, 2 * PAGE) == bytes(2 * PAGE)
    for pointer in (0, 8, (1 << 64) - 4):
        assert errno_of(memory.read, pointer, 8) == errno.EFAULT


def test_many_ranges_in_one_call(memory: UserMemory) -> None:
    source = ctypes.create_string_buffer(b"abcdefghij", 10)
    target = ctypes.create_string_buffer(12)
    base, local = ctypes.addressof(source), ctypes.addressof(target)
    memory.read_many([Copy(base + 6, local, 4), Copy(base, local + 4, 0), Copy(base, local + 8, 3)])
    assert target.raw == b"ghij\0\0\0\0abc\0"
    memory.write_many([Copy(base + 1, local + 8, 2), Copy(base + 9, local, 1)])
    assert source.raw == b"aabdefghig"
    memory.read_many([])


def test_a_bad_range_among_many_is_efault_naming_it(memory: UserMemory) -> None:
    data = ctypes.create_string_buffer(b"0123", 4)
    local = ctypes.create_string_buffer(8)
    with RawPages(prot=0) as hole:
        copies = [
            Copy(ctypes.addressof(data), ctypes.addressof(local), 4),
            Copy(hole.address, ctypes.addressof(local) + 4, 4),
        ]
        with pytest.raises(OSError, match=f"{hole.address:#x}") as failure:
            memory.read_many(copies)
        assert failure.value.errno == errno.EFAULT
        with pytest.raises(OSError, match=f"{hole.address:#x}"):
            memory.write_many(copies[::-1])


def test_a_range_straddling_into_a_hole_is_efault(memory: UserMemory) -> None:
    with RawPages(prot=mmap.PROT_READ | mmap.PROT_WRITE, pages=2) as pages:
        RawPages._libc.mprotect.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
        assert RawPages._libc.mprotect(pages.address + PAGE, PAGE, 0) == 0
        assert errno_of(memory.read, pages.address + PAGE - 4, 8) == errno.EFAULT


@pytest.mark.parametrize("procmap_query", [True, False], ids=["procmap_query", "maps"])
def test_find_vma(procmap_query: bool) -> None:
    finder = VmaFinder(procmap_query=procmap_query)
    with RawPages(prot=mmap.PROT_READ, pages=3) as pages:
        vma = finder.find(pages.address + PAGE)
        assert vma is not None
        assert vma.start <= pages.address
        assert pages.address + 3 * PAGE <= vma.end
        assert (vma.readable, vma.writable, vma.shared) == (True, False, False)
    assert finder.find(0) is None


def test_the_address_space_allocator() -> None:
    space = DspAddressSpace(0x1000, 0x6000)
    first = space.allocate(1)
    second = space.allocate(2 * 0x1000)
    assert (first, second) == (0x1000, 0x2000)
    space.release(first)
    assert space.allocate(0x1000) == 0x1000
    assert space.allocate(0x1000) == 0x4000
    with pytest.raises(AddressSpaceFullError):
        space.allocate(0x2000)
    with pytest.raises(KeyError):
        space.release(0x5000)
    with pytest.raises(ValueError, match="cannot map"):
        space.allocate(0)
    assert len(space) == 3


def test_request_packing_follows_listener_buf() -> None:
    blob = pack_request([b"abc", b"", b"defgh"], [7, 0])
    assert blob == (
        b"\x03\0\0\0"
        + bytes(4)
        + b"abc"  # len, pad to 8, data
        + b"\0\0\0\0"  # empty buffer: length only
        + b"\x05\0\0\0"
        + bytes(5)
        + b"defgh"  # 15 + 4 -> 19, pad to 24
        + b"\x07\0\0\0"
        + b"\0\0\0\0"  # output capacities
    )


def test_reply_unpacking_checks_lengths() -> None:
    reply = b"\x02\0\0\0" + bytes(4) + b"ok" + b"\0\0\0\0"
    assert unpack_reply(reply, [2, 0]) == [b"ok", b""]
    for bad, capacities in [
        (reply, [3, 0]),  # length differs from the capacity asked for
        (reply[:9], [2, 0]),  # truncated inside the data
        (reply[:10], [2, 0]),  # no length for the second output
        (b"", [1]),
    ]:
        with pytest.raises(BadReverseMessageError):
            unpack_reply(bad, capacities)


@pytest.mark.parametrize(
    ("uri", "library", "symbol"),
    [
        (
            "file:///libecho_skel.so?echo_skel_handle_invoke&_modver=1.0&_dom=cdsp",
            "libecho_skel.so",
            "echo_skel_handle_invoke",
        ),
        ("file:///libx_skel.so?_session=1&x_skel_invoke", "libx_skel.so", "x_skel_invoke"),
        ("file://libx_skel.so?x_skel_invoke", "libx_skel.so", "x_skel_invoke"),
        ("npu_test", "libnpu_test_skel.so", "npu_test_skel_invoke"),
    ],
)
def test_module_names(uri: str, library: str, symbol: str) -> None:
    assert parse_module_uri(uri) == (library, symbol)


def test_bad_module_names() -> None:
    for uri in ("file:///?x", "file:///lib.so?", "9lives", "a b"):
        with pytest.raises(LoadError):
            parse_module_uri(uri)
