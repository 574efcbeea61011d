"""INVOKE: argument decoding, copy vs shared memory, errnos and skel results."""

from __future__ import annotations

import ctypes
import dataclasses
import errno
import mmap
import os
import struct
import zlib
from collections.abc import Iterator

import pytest

from npud.fastrpc.kernel import abi
from npud.sim import EmulatedDriver, SimConfig
from tests.emulator.sim_helpers import (
    AEE_EBADPARM,
    AEE_EBADSTATE,
    AEE_EINVHANDLE,
    AEE_ENOSUCHMOD,
    AEE_EUNSUPPORTED,
    NPU_TEST_URI,
    PAGE,
    SC_CHECKSUM,
    SC_ECHO,
    SC_FILL,
    Arg,
    RawPages,
    address_of,
    alloc_dma_buf,
    busy,
    call,
    checksum,
    echo,
    errno_of,
    fill,
    invoke_args,
    open_skel,
    remotectl_close,
    running_process,
)


@dataclasses.dataclass(frozen=True)
class Session:
    driver: EmulatedDriver
    fd: int
    echo: int
    npu_test: int


ADDRESS_MODES = {
    "cached": SimConfig(),
    "procmap_query": SimConfig(address_cache=False),
    "maps": SimConfig(address_cache=False, procmap_query=False),
}


@pytest.fixture(params=list(ADDRESS_MODES))
def session(request: pytest.FixtureRequest) -> Iterator[Session]:
    """Every test runs with the address cache and with each way of asking the kernel."""
    driver = EmulatedDriver(ADDRESS_MODES[request.param])
    with running_process(driver) as (fd, _):
        yield Session(driver, fd, open_skel(driver, fd), open_skel(driver, fd, NPU_TEST_URI))
    stats = driver.statistics()
    assert (stats.device_fds_open, stats.invokes_in_flight, stats.mem_maps) == (0, 0, 0)


@pytest.fixture
def dma(session: Session) -> Iterator[tuple[int, mmap.mmap]]:
    """A two-page dma-buf and the caller's mapping of it."""
    buf = alloc_dma_buf(session.driver, session.fd, 2 * PAGE)
    mapping = session.driver.mmap(buf, 2 * PAGE)
    yield buf, mapping
    mapping.close()
    session.driver.close(buf)


# -- plain memory (copy semantics) ---------------------------------------------


@pytest.mark.parametrize(
    ("data", "capacity", "expected"),
    [
        (b"hello", 5, b"hello"),
        (b"hello", 8, b"hello\0\0\0"),
        (b"hello world", 5, b"hello"),
        (b"", 4, b"\0\0\0\0"),
        (b"abc", 0, b""),
    ],
)
def test_echo_through_plain_memory(
    session: Session, data: bytes, capacity: int, expected: bytes
) -> None:
    assert echo(session.driver, session.fd, session.echo, data, capacity) == (0, expected)


def test_npu_test_methods(session: Session) -> None:
    result, data = fill(session.driver, session.fd, session.npu_test, 0x1FE, 5)
    assert (result, data) == (0, bytes([0xFE, 0xFF, 0x00, 0x01, 0x02]))
    result, data = fill(session.driver, session.fd, session.npu_test, 7, 1000)
    assert data == bytes((7 + i) & 0xFF for i in range(1000))
    payload = os.urandom(3000)
    assert checksum(session.driver, session.fd, session.npu_test, payload) == (
        0,
        zlib.crc32(payload),
    )
    assert busy(session.driver, session.fd, session.npu_test, 1000) == 0


def test_fd_zero_means_plain_memory(session: Session) -> None:
    data = ctypes.create_string_buffer(b"zero-fd", 7)
    out = ctypes.create_string_buffer(7)
    prim = ctypes.create_string_buffer(struct.pack("<II", 7, 7), 8)
    args = [
        Arg(ctypes.addressof(prim), 8, fd=0),
        Arg(ctypes.addressof(data), 7, fd=0),
        Arg(ctypes.addressof(out), 7, fd=0),
    ]
    assert invoke_args(session.driver, session.fd, session.echo, SC_ECHO, args) == 0
    assert out.raw == b"zero-fd"


def test_length_zero_ignores_the_fd(session: Session) -> None:
    prim = ctypes.create_string_buffer(struct.pack("<II", 0, 0), 8)
    args = [Arg(ctypes.addressof(prim), 8), Arg(0, 0, fd=12345), Arg(0, 0, fd=54321)]
    assert invoke_args(session.driver, session.fd, session.echo, SC_ECHO, args) == 0


def test_an_output_overlapping_an_input_shares_its_bytes(session: Session) -> None:
    # The kernel de-duplicates overlapping plain buffers in its payload: the
    # output starts out holding the input's bytes. A failing call copies the
    # payload back untouched, which makes that visible.
    memory = ctypes.create_string_buffer(b"ABCDEFGH" + b"wxyz", 12)
    base = ctypes.addressof(memory)
    prim = ctypes.create_string_buffer(struct.pack("<II", 8, 8), 8)
    session.driver.faults.fail_next_invoke(0x80000401)
    args = [Arg(ctypes.addressof(prim), 8), Arg(base, 8), Arg(base + 4, 8)]
    assert invoke_args(session.driver, session.fd, session.echo, SC_ECHO, args) == 0x80000401
    assert memory.raw == b"ABCDEFGH\0\0\0\0"


def test_in_place_echo(session: Session) -> None:
    memory = ctypes.create_string_buffer(b"in-place", 8)
    prim = ctypes.create_string_buffer(struct.pack("<II", 8, 8), 8)
    address = ctypes.addressof(memory)
    args = [Arg(ctypes.addressof(prim), 8), Arg(address, 8), Arg(address, 8)]
    assert invoke_args(session.driver, session.fd, session.echo, SC_ECHO, args) == 0
    assert memory.raw == b"in-place"


# -- bad pointers ----------------------------------------------------------------


def test_a_null_args_array_is_efault(session: Session) -> None:
    request = abi.fastrpc_invoke(handle=session.echo, sc=SC_ECHO, args=0)
    assert (
        errno_of(session.driver.ioctl, session.fd, abi.FASTRPC_IOCTL_INVOKE, request)
        == errno.EFAULT
    )


def test_no_scalars_needs_no_args_array(session: Session) -> None:
    # sc 0x02000000 on a skel handle: no buffers at all; echo rejects the counts.
    assert invoke_args(session.driver, session.fd, session.echo, 0x02000000, []) == AEE_EBADPARM


@pytest.mark.parametrize("slot", [0, 1])
def test_a_null_plain_input_is_efault(session: Session, slot: int) -> None:
    prim = ctypes.create_string_buffer(struct.pack("<II", 4, 4), 8)
    data = ctypes.create_string_buffer(4)
    out = ctypes.create_string_buffer(4)
    args = [Arg(ctypes.addressof(prim), 8), Arg(ctypes.addressof(data), 4)]
    args[slot] = Arg(0, args[slot].length)
    assert (
        errno_of(
            invoke_args,
            session.driver,
            session.fd,
            session.echo,
            SC_ECHO,
            [*args, Arg(ctypes.addressof(out), 4)],
        )
        == errno.EFAULT
    )


def test_an_unreadable_input_is_efault(session: Session) -> None:
    prim = ctypes.create_string_buffer(struct.pack("<II", 16, 16), 8)
    out = ctypes.create_string_buffer(16)
    with RawPages(prot=0) as hole:
        args = [
            Arg(ctypes.addressof(prim), 8),
            Arg(hole.address, 16),
            Arg(ctypes.addressof(out), 16),
        ]
        result = errno_of(invoke_args, session.driver, session.fd, session.echo, SC_ECHO, args)
    assert result == errno.EFAULT


def test_an_unwritable_output_is_efault_after_the_call(session: Session) -> None:
    prim = ctypes.create_string_buffer(struct.pack("<II", 4, 4), 8)
    data = ctypes.create_string_buffer(b"data", 4)
    with RawPages(prot=mmap.PROT_READ) as read_only:
        args = [
            Arg(ctypes.addressof(prim), 8),
            Arg(ctypes.addressof(data), 4),
            Arg(read_only.address, 4),
        ]
        assert (
            errno_of(invoke_args, session.driver, session.fd, session.echo, SC_ECHO, args)
            == errno.EFAULT
        )
        assert ctypes.string_at(read_only.address, 4) == bytes(4)


def test_plain_buffers_larger_than_the_payload_pool_are_enomem(session: Session) -> None:
    prim = ctypes.create_string_buffer(struct.pack("<II", 0, 16), 8)
    out = ctypes.create_string_buffer(16)
    args = [Arg(ctypes.addressof(prim), 8), Arg(0x1000, 1 << 40), Arg(ctypes.addressof(out), 16)]
    assert errno_of(invoke_args, session.driver, session.fd, session.echo, SC_ECHO, args) == (
        errno.ENOMEM
    )


def test_a_buffer_past_the_end_of_the_address_space_is_efault(session: Session) -> None:
    prim = ctypes.create_string_buffer(struct.pack("<II", 16, 16), 8)
    out = ctypes.create_string_buffer(16)
    args = [Arg(ctypes.addressof(prim), 8), Arg((1 << 64) - 8, 16), Arg(ctypes.addressof(out), 16)]
    assert (
        errno_of(invoke_args, session.driver, session.fd, session.echo, SC_ECHO, args)
        == errno.EFAULT
    )


# -- dma-bufs (shared memory) -----------------------------------------------------


def test_the_dsp_reads_a_dma_buf_in_place(session: Session, dma: tuple[int, mmap.mmap]) -> None:
    buf, mapping = dma
    payload = os.urandom(1000)
    mapping[100:1100] = payload
    prim = ctypes.create_string_buffer(struct.pack("<I", 1000), 4)
    crc = ctypes.create_string_buffer(4)
    args = [
        Arg(ctypes.addressof(prim), 4),
        Arg(address_of(mapping, 100), 1000, fd=buf),
        Arg(ctypes.addressof(crc), 4),
    ]
    assert invoke_args(session.driver, session.fd, session.npu_test, SC_CHECKSUM, args) == 0
    assert struct.unpack("<I", crc.raw)[0] == zlib.crc32(payload)


def test_the_dsp_writes_a_dma_buf_in_place(session: Session, dma: tuple[int, mmap.mmap]) -> None:
    buf, mapping = dma
    mapping[:] = b"\xaa" * (2 * PAGE)
    prim = ctypes.create_string_buffer(struct.pack("<II", 3, PAGE), 8)
    args = [Arg(ctypes.addressof(prim), 8), Arg(address_of(mapping, PAGE), PAGE, fd=buf)]
    assert invoke_args(session.driver, session.fd, session.npu_test, SC_FILL, args) == 0
    assert mapping[:PAGE] == b"\xaa" * PAGE
    assert mapping[PAGE : PAGE + 4] == bytes([3, 4, 5, 6])
    assert os.pread(buf, 2, PAGE + 253) == bytes([0, 1])  # (3 + 253) & 0xFF == 0


def test_echo_from_one_dma_buf_to_another(session: Session, dma: tuple[int, mmap.mmap]) -> None:
    source, source_map = dma
    target = alloc_dma_buf(session.driver, session.fd, PAGE)
    target_map = session.driver.mmap(target, PAGE)
    try:
        source_map[:4] = b"dma!"
        prim = ctypes.create_string_buffer(struct.pack("<II", 4, 8), 8)
        args = [
            Arg(ctypes.addressof(prim), 8),
            Arg(address_of(source_map), 4, fd=source),
            Arg(address_of(target_map), 8, fd=target),
        ]
        assert invoke_args(session.driver, session.fd, session.echo, SC_ECHO, args) == 0
        assert target_map[:8] == b"dma!\0\0\0\0"
    finally:
        target_map.close()
        session.driver.close(target)


def _checksum_args(
    prim: ctypes.Array[ctypes.c_char], out: ctypes.Array[ctypes.c_char], arg: Arg
) -> list[Arg]:
    return [Arg(ctypes.addressof(prim), 4), arg, Arg(ctypes.addressof(out), 4)]


def _expect_einval(session: Session, arg: Arg) -> None:
    prim = ctypes.create_string_buffer(struct.pack("<I", arg.length), 4)
    out = ctypes.create_string_buffer(4)
    assert (
        errno_of(
            invoke_args,
            session.driver,
            session.fd,
            session.npu_test,
            SC_CHECKSUM,
            _checksum_args(prim, out, arg),
        )
        == errno.EINVAL
    )


def test_a_foreign_fd_is_einval(session: Session) -> None:
    foreign = os.memfd_create("not-a-dmabuf")
    os.ftruncate(foreign, PAGE)
    mapping = mmap.mmap(foreign, PAGE)
    try:
        _expect_einval(session, Arg(address_of(mapping), 16, fd=foreign))
    finally:
        mapping.close()
        os.close(foreign)


def test_a_closed_fd_is_einval(session: Session) -> None:
    data = ctypes.create_string_buffer(16)
    closed = os.open(os.devnull, os.O_RDONLY)
    os.close(closed)
    _expect_einval(session, Arg(ctypes.addressof(data), 16, fd=closed))


def test_a_pointer_outside_any_mapping_of_the_buffer_is_einval(
    session: Session, dma: tuple[int, mmap.mmap]
) -> None:
    buf, _ = dma
    plain = ctypes.create_string_buffer(16)
    _expect_einval(session, Arg(ctypes.addressof(plain), 16, fd=buf))


def test_a_pointer_into_another_dma_buf_is_einval(
    session: Session, dma: tuple[int, mmap.mmap]
) -> None:
    buf, _ = dma
    other = alloc_dma_buf(session.driver, session.fd, PAGE)
    other_map = session.driver.mmap(other, PAGE)
    try:
        _expect_einval(session, Arg(address_of(other_map), 16, fd=buf))
    finally:
        other_map.close()
        session.driver.close(other)


def test_a_range_running_past_the_mapping_is_einval(
    session: Session, dma: tuple[int, mmap.mmap]
) -> None:
    buf, mapping = dma
    _expect_einval(session, Arg(address_of(mapping, 2 * PAGE - 8), 16, fd=buf))


def test_a_length_larger_than_the_buffer_is_einval(
    session: Session, dma: tuple[int, mmap.mmap]
) -> None:
    buf, mapping = dma
    _expect_einval(session, Arg(address_of(mapping), 2 * PAGE + 1, fd=buf))


def test_a_mapping_at_a_non_zero_offset_is_einval(
    session: Session, dma: tuple[int, mmap.mmap]
) -> None:
    buf, _ = dma
    tail = session.driver.mmap(buf, PAGE, PAGE)
    try:
        _expect_einval(session, Arg(address_of(tail), 16, fd=buf))
    finally:
        tail.close()


def test_handle_slots_must_carry_dma_bufs(session: Session, dma: tuple[int, mmap.mmap]) -> None:
    buf, _ = dma
    sc_with_handle = SC_ECHO | (1 << 4)
    prim = ctypes.create_string_buffer(struct.pack("<II", 0, 0), 8)
    base = [Arg(ctypes.addressof(prim), 8), Arg(0, 0), Arg(0, 0)]
    plain = os.open(os.devnull, os.O_RDONLY)
    try:
        assert (
            errno_of(
                invoke_args,
                session.driver,
                session.fd,
                session.echo,
                sc_with_handle,
                [*base, Arg(0, 16, fd=plain)],
            )
            == errno.EINVAL
        )
    finally:
        os.close(plain)
    # A valid dma-buf handle passes the kernel; echo declares no handles: AEE_EBADPARM.
    result = invoke_args(
        session.driver, session.fd, session.echo, sc_with_handle, [*base, Arg(0, 16, fd=buf)]
    )
    assert result == AEE_EBADPARM


# -- handles and skel results ---------------------------------------------------


def test_handle_1_is_eperm(session: Session) -> None:
    assert (
        errno_of(invoke_args, session.driver, session.fd, 1, 0x00010000, [Arg(0, 0)]) == errno.EPERM
    )


def test_invoke_before_init_create_is_ebadstate() -> None:
    driver = EmulatedDriver()
    fd = driver.open(abi.CDSP_NODE, os.O_RDWR)
    try:
        for handle in (0, 3, 4, 0x1000010):
            assert invoke_args(driver, fd, handle, 0x02000000, []) == AEE_EBADSTATE
    finally:
        driver.close(fd)


def test_unknown_and_closed_handles_are_einvhandle(session: Session) -> None:
    assert echo(session.driver, session.fd, 0x7777, b"x", 1)[0] == AEE_EINVHANDLE
    extra = open_skel(session.driver, session.fd)
    assert remotectl_close(session.driver, session.fd, extra) == (0, 0)
    assert echo(session.driver, session.fd, extra, b"x", 1)[0] == AEE_EINVHANDLE


@pytest.mark.parametrize("handle", [2, 5, 6, 9, 10])
def test_absent_static_modules_are_enosuchmod(session: Session, handle: int) -> None:
    assert invoke_args(session.driver, session.fd, handle, 0x00010100, [Arg(0, 0), Arg(0, 0)]) == (
        AEE_ENOSUCHMOD
    )


@pytest.mark.parametrize(
    ("inputs", "capacity"),
    [
        ([struct.pack("<II", 5, 4), b"hello"], 5),  # announced capacity != buffer
        ([struct.pack("<II", 4, 5), b"hello"], 5),  # announced length != buffer
        ([struct.pack("<I", 5), b"hello"], 5),  # primIn too short
        ([struct.pack("<III", 5, 5, 0), b"hello"], 5),  # primIn too long
    ],
)
def test_echo_rejects_mismatched_primin(
    session: Session, inputs: list[bytes], capacity: int
) -> None:
    result, _ = call(session.driver, session.fd, session.echo, SC_ECHO, inputs, [capacity])
    assert result == AEE_EBADPARM


@pytest.mark.parametrize(
    ("sc", "expected"),
    [
        (0x02010100, AEE_EBADPARM),  # echo's method number with fill's counts
        (0x05020100, AEE_EUNSUPPORTED),  # no method 5
        (0x00020200, AEE_EUNSUPPORTED),  # method 0 (open) is not a user method
        (0x01010200, AEE_EUNSUPPORTED),  # method 1 (close) neither
        (0x1F020100, AEE_EUNSUPPORTED),  # the >31-methods escape
    ],
)
def test_skel_dispatch_errors(session: Session, sc: int, expected: int) -> None:
    inbufs, outbufs = (sc >> 16) & 0xFF, (sc >> 8) & 0xFF
    result, _ = call(
        session.driver, session.fd, session.echo, sc, [b"\0" * 8] * inbufs, [8] * outbufs
    )
    assert result == expected


def test_npu_test_rejects_mismatched_primin(session: Session) -> None:
    driver, fd, handle = session.driver, session.fd, session.npu_test
    assert call(driver, fd, handle, SC_FILL, [struct.pack("<II", 1, 9)], [8])[0] == AEE_EBADPARM
    assert call(driver, fd, handle, SC_CHECKSUM, [struct.pack("<I", 3), b"ab"], [4])[0] == (
        AEE_EBADPARM
    )
    assert call(driver, fd, handle, SC_CHECKSUM, [struct.pack("<I", 2), b"ab"], [8])[0] == (
        AEE_EBADPARM
    )
    assert call(driver, fd, handle, 0x04010000, [b"\0" * 8], [])[0] == AEE_EBADPARM
