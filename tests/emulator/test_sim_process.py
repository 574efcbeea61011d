"""INIT_CREATE / INIT_ATTACH / static PDs, remotectl layouts and process exit."""

from __future__ import annotations

import ctypes
import errno
import os
import struct
from collections.abc import Iterator

import pytest

from npud.fastrpc.kernel import abi
from npud.sim import EmulatedDriver, SimConfig
from npud.sim.process import ProcessKind
from tests.emulator.sim_helpers import (
    AEE_EALREADY,
    AEE_EBADELF,
    AEE_EBADPARM,
    AEE_EBADSTATE,
    AEE_EINVHANDLE,
    AEE_EUNSUPPORTED,
    ECHO_URI,
    NPU_TEST_URI,
    PAGE,
    SC_REMOTECTL_CLOSE,
    SC_REMOTECTL_OPEN,
    ReverseResponder,
    address_of,
    alloc_dma_buf,
    call,
    echo,
    errno_of,
    exit_process,
    init_create,
    invoke_args,
    open_skel,
    remotectl_close,
    remotectl_open,
    running_process,
    shell_image,
)


@pytest.fixture
def driver() -> Iterator[EmulatedDriver]:
    driver = EmulatedDriver()
    yield driver
    stats = driver.statistics()
    assert (stats.device_fds_open, stats.dsp_processes, stats.remote_handles_open) == (0, 0, 0)


@pytest.fixture
def device(driver: EmulatedDriver) -> Iterator[int]:
    fd = driver.open(abi.CDSP_SECURE_NODE, os.O_RDWR)
    yield fd
    driver.close(fd)


# -- INIT_CREATE ------------------------------------------------------------------


@pytest.mark.parametrize(("attrs", "method"), [(0, 6), (0x8, 7), (0x1, 7), (0x8 | 0x20000, 7)])
def test_init_create_records_the_process(
    driver: EmulatedDriver, device: int, attrs: int, method: int
) -> None:
    assert driver.process_info(device) is None
    assert init_create(driver, device, attrs=attrs) == 0
    info = driver.process_info(device)
    assert info is not None
    assert info.kind is ProcessKind.USER_PD
    assert info.attrs == attrs
    assert info.unsigned == bool(attrs & 0x8)
    assert info.create_method == method
    assert info.image_size == len(shell_image())
    assert info.client_id == 1
    assert driver.statistics().dsp_processes == 1


def test_a_second_init_create_is_ealready(driver: EmulatedDriver, device: int) -> None:
    assert init_create(driver, device) == 0
    assert init_create(driver, device, attrs=0x8) == AEE_EALREADY
    assert driver.process_info(device).attrs == 0  # type: ignore[union-attr]


@pytest.mark.parametrize(
    "image",
    [
        b"",
        b"\x7fELF",  # shorter than an ELF32 header
        shell_image(machine=62),  # x86-64
        shell_image(elf_class=2),  # ELF64
        shell_image(data=2),  # big-endian
        b"MZ" + bytes(100),
    ],
)
def test_the_dsp_rejects_non_hexagon_shells(
    driver: EmulatedDriver, device: int, image: bytes
) -> None:
    assert init_create(driver, device, image=image) == AEE_EBADELF
    assert driver.process_info(device) is None
    assert init_create(driver, device) == 0  # a failed create leaves the fd usable


def test_filelen_over_2_mib_is_einval(driver: EmulatedDriver, device: int) -> None:
    request = abi.fastrpc_init_create(filelen=2 * 1024 * 1024 + 1, filefd=0, file=0)
    assert errno_of(driver.ioctl, device, abi.FASTRPC_IOCTL_INIT_CREATE, request) == errno.EINVAL


def test_an_unreadable_image_is_efault(driver: EmulatedDriver, device: int) -> None:
    request = abi.fastrpc_init_create(filelen=256, filefd=0, file=0)
    assert errno_of(driver.ioctl, device, abi.FASTRPC_IOCTL_INIT_CREATE, request) == errno.EFAULT


def test_the_shell_can_come_from_a_dma_buf(driver: EmulatedDriver, device: int) -> None:
    image = shell_image(size=3000)
    buf = alloc_dma_buf(driver, device, PAGE)
    mapping = driver.mmap(buf, PAGE)
    try:
        mapping[: len(image)] = image
        request = abi.fastrpc_init_create(
            filelen=len(image), filefd=buf, attrs=0x8, file=address_of(mapping)
        )
        assert driver.ioctl(device, abi.FASTRPC_IOCTL_INIT_CREATE, request) == 0
        assert driver.process_info(device).image_size == 3000  # type: ignore[union-attr]
    finally:
        mapping.close()
        driver.close(buf)


def test_a_dma_buf_shell_is_checked_like_an_invoke_buffer(
    driver: EmulatedDriver, device: int
) -> None:
    buf = alloc_dma_buf(driver, device, PAGE)
    mapping = driver.mmap(buf, PAGE)
    plain = ctypes.create_string_buffer(shell_image(), 256)
    try:
        cases = [
            (
                abi.fastrpc_init_create(filelen=256, filefd=buf, file=ctypes.addressof(plain)),
                errno.EINVAL,
            ),
            (
                abi.fastrpc_init_create(filelen=PAGE + 1, filefd=buf, file=address_of(mapping)),
                errno.EINVAL,
            ),
        ]
        for request, expected in cases:
            assert (
                errno_of(driver.ioctl, device, abi.FASTRPC_IOCTL_INIT_CREATE, request) == expected
            )
    finally:
        mapping.close()
        driver.close(buf)


def test_filefd_minus_one_with_a_length_is_ebadf(driver: EmulatedDriver, device: int) -> None:
    # The kernel maps any non-zero filefd when filelen is set; -1 is no fd.
    plain = ctypes.create_string_buffer(shell_image(), 256)
    request = abi.fastrpc_init_create(filelen=256, filefd=-1, file=ctypes.addressof(plain))
    assert errno_of(driver.ioctl, device, abi.FASTRPC_IOCTL_INIT_CREATE, request) == errno.EBADF


def test_a_foreign_filefd_is_einval(driver: EmulatedDriver, device: int) -> None:
    foreign = os.memfd_create("shell")
    try:
        request = abi.fastrpc_init_create(filelen=256, filefd=foreign, file=0)
        assert (
            errno_of(driver.ioctl, device, abi.FASTRPC_IOCTL_INIT_CREATE, request) == errno.EINVAL
        )
    finally:
        os.close(foreign)


def test_a_secure_channel_refuses_signed_pds_on_the_non_secure_node() -> None:
    driver = EmulatedDriver(SimConfig(secure_channel=True))
    for path, attrs, allowed in [
        (abi.CDSP_NODE, 0, False),
        (abi.CDSP_NODE, 0x8, True),
        (abi.CDSP_SECURE_NODE, 0, True),
    ]:
        fd = driver.open(path, os.O_RDWR)
        try:
            if allowed:
                assert init_create(driver, fd, attrs=attrs) == 0
            else:
                assert errno_of(init_create, driver, fd, attrs=attrs) == errno.ECONNREFUSED
        finally:
            driver.close(fd)


def test_x1e_nodes_behave_identically(driver: EmulatedDriver) -> None:
    fd = driver.open(abi.CDSP_NODE, os.O_RDWR)
    try:
        assert init_create(driver, fd) == 0
    finally:
        driver.close(fd)


# -- INIT_ATTACH and static PDs -----------------------------------------------------


def test_init_attach_joins_the_root_pd(driver: EmulatedDriver, device: int) -> None:
    assert driver.ioctl(device, abi.FASTRPC_IOCTL_INIT_ATTACH, None) == 0
    info = driver.process_info(device)
    assert info is not None
    assert (info.kind, info.create_method) == (ProcessKind.ROOT_PD, None)
    assert driver.ioctl(device, abi.FASTRPC_IOCTL_INIT_ATTACH, None) == AEE_EALREADY
    assert init_create(driver, device) == AEE_EALREADY


def test_the_cdsp_has_no_sensors_pd(driver: EmulatedDriver, device: int) -> None:
    assert driver.ioctl(device, abi.FASTRPC_IOCTL_INIT_ATTACH_SNS, None) == AEE_EUNSUPPORTED
    assert driver.process_info(device) is None


def test_the_cdsp_has_no_static_pds(driver: EmulatedDriver, device: int) -> None:
    name = ctypes.create_string_buffer(b"audiopd")
    request = abi.fastrpc_init_create_static(namelen=8, memlen=PAGE, name=ctypes.addressof(name))
    assert driver.ioctl(device, abi.FASTRPC_IOCTL_INIT_CREATE_STATIC, request) == AEE_EUNSUPPORTED
    for bad, expected in [
        (abi.fastrpc_init_create_static(namelen=129, name=ctypes.addressof(name)), errno.EINVAL),
        (abi.fastrpc_init_create_static(namelen=8, name=0), errno.EFAULT),
    ]:
        assert errno_of(driver.ioctl, device, abi.FASTRPC_IOCTL_INIT_CREATE_STATIC, bad) == expected


# -- remotectl layouts (no reverse RPC involved) ------------------------------------


@pytest.mark.parametrize(
    ("inputs", "out_sizes"),
    [
        ([struct.pack("<II", 9, 255), b"file:///\0"], [8]),  # wrong counts
        ([struct.pack("<II", 5, 255), b"abcd"], [8, 255]),  # name shorter than announced
        ([struct.pack("<II", 4, 255), b"abcd"], [8, 255]),  # no terminating NUL
        ([struct.pack("<II", 0, 255), b""], [8, 255]),  # empty name
        ([struct.pack("<II", 5, 255), b"abcd\0"], [4, 255]),  # result buffer too small
        ([struct.pack("<II", 5, 100), b"abcd\0"], [8, 255]),  # dlerror capacity mismatch
        ([struct.pack("<I", 5), b"abcd\0"], [8, 255]),  # primIn too short
    ],
)
def test_remotectl_open_rejects_bad_layouts(
    driver: EmulatedDriver, device: int, inputs: list[bytes], out_sizes: list[int]
) -> None:
    assert init_create(driver, device) == 0
    sc = SC_REMOTECTL_OPEN if len(out_sizes) == 2 else 0x00020100
    result, _ = call(driver, device, 0, sc, inputs, out_sizes)
    assert result == AEE_EBADPARM


def test_remotectl_close_of_an_unknown_handle(driver: EmulatedDriver, device: int) -> None:
    assert init_create(driver, device) == 0
    assert remotectl_close(driver, device, 0x1234)[0] == AEE_EINVHANDLE
    result, _ = call(driver, device, 0, SC_REMOTECTL_CLOSE, [b"\0" * 8], [4, 8])
    assert result == AEE_EBADPARM  # dlerror capacity 0 announced, 8 given


def test_other_remotectl_methods_are_unsupported(driver: EmulatedDriver, device: int) -> None:
    assert init_create(driver, device) == 0
    grow_heap = struct.pack("<II", 0x1000, PAGE)
    assert call(driver, device, 0, 0x02010000, [grow_heap], [])[0] == AEE_EUNSUPPORTED


# -- handles, remotectl1 and exit -------------------------------------------------------


def test_handles_are_opaque_and_never_reused(driver: EmulatedDriver) -> None:
    with running_process(driver) as (fd, _):
        seen = set()
        for _ in range(5):
            handle = open_skel(driver, fd)
            assert handle >= 0x100
            assert handle not in seen
            seen.add(handle)
            assert remotectl_close(driver, fd, handle) == (0, 0)
        assert driver.statistics().remote_handles_open == 0


def test_remotectl1_on_handle_8(driver: EmulatedDriver) -> None:
    with running_process(driver) as (fd, _):
        opened = remotectl_open(driver, fd, NPU_TEST_URI, handle=8)
        assert (opened.result, opened.dl_error) == (0, 0)
        result, (status, _) = call(
            driver, fd, 8, 0x03010200, [struct.pack("<II", opened.handle, 16)], [4, 16]
        )
        assert (result, status) == (0, bytes(4))


def test_exit_ends_the_process(driver: EmulatedDriver) -> None:
    fd = driver.open(abi.CDSP_SECURE_NODE, os.O_RDWR)
    try:
        assert init_create(driver, fd) == 0
        responder = ReverseResponder(driver, fd).start()
        handle = open_skel(driver, fd, ECHO_URI)
        assert driver.statistics().remote_handles_open == 1
        assert exit_process(driver, fd) == 0
        responder.join()
        assert responder.exit_result == AEE_EBADSTATE  # the blocked next2 was woken
        stats = driver.statistics()
        assert (stats.dsp_processes, stats.remote_handles_open) == (0, 0)
        # Every later invoke, a second exit included, is AEE_EBADSTATE.
        assert echo(driver, fd, handle, b"x", 1)[0] == AEE_EBADSTATE
        assert remotectl_open(driver, fd, ECHO_URI).result == AEE_EBADSTATE
        assert exit_process(driver, fd) == AEE_EBADSTATE
        assert init_create(driver, fd) == AEE_EALREADY
    finally:
        driver.close(fd)


def test_current_process_methods_other_than_exit(driver: EmulatedDriver, device: int) -> None:
    assert init_create(driver, device) == 0
    assert invoke_args(driver, device, 4, 0x03000000, []) == AEE_EUNSUPPORTED
    result, _ = call(driver, device, 4, 0x02010000, [b"\0" * 4], [])
    assert result == AEE_EBADPARM  # exit takes no buffers
    assert driver.statistics().dsp_processes == 1


def test_close_with_a_blocked_listener_defers_the_release(driver: EmulatedDriver) -> None:
    # Like the kernel: close() cannot release the file while another thread is
    # inside an ioctl on it; the release runs when that ioctl returns.
    fd = driver.open(abi.CDSP_NODE, os.O_RDWR)
    assert init_create(driver, fd) == 0
    responder = ReverseResponder(driver, fd).start()
    open_skel(driver, fd)
    driver.close(fd)
    stats = driver.statistics()
    assert (stats.device_fds_open, stats.releases_pending) == (0, 1)
    assert (stats.sessions_in_use, stats.remote_handles_open, stats.dsp_processes) == (1, 1, 1)
    driver.faults.interrupt_listeners()  # the blocked next2 returns; the listener's retry fails
    responder.join()
    assert responder.exit_error is not None
    stats = driver.statistics()
    assert (stats.releases_pending, stats.sessions_in_use, stats.remote_handles_open) == (0, 0, 0)
