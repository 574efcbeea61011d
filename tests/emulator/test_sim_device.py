"""Device nodes, sessions, fds and command words."""

from __future__ import annotations

import ctypes
import errno
import os
from collections.abc import Iterator

import pytest

from npud.fastrpc.kernel import abi
from npud.sim import EmulatedDriver, SimConfig
from tests.emulator.sim_helpers import alloc_dma_buf, errno_of, init_create, open_fd_count


@pytest.fixture
def driver() -> Iterator[EmulatedDriver]:
    driver = EmulatedDriver()
    yield driver
    assert driver.statistics().device_fds_open == 0


@pytest.mark.parametrize("path", [abi.CDSP_SECURE_NODE, abi.CDSP_NODE])
def test_both_cdsp_nodes_open(driver: EmulatedDriver, path: str) -> None:
    fd = driver.open(path, os.O_RDWR | os.O_NONBLOCK)
    try:
        assert os.fstat(fd)  # a real fd of this process
        assert driver.statistics().sessions_in_use == 1
    finally:
        driver.close(fd)
    assert driver.statistics().sessions_in_use == 0


@pytest.mark.parametrize(
    "path", ["/dev/fastrpc-adsp", "/dev/fastrpc-cdsp1", "/dev/null", "fastrpc-cdsp", ""]
)
def test_other_paths_do_not_exist(driver: EmulatedDriver, path: str) -> None:
    with pytest.raises(FileNotFoundError):
        driver.open(path, os.O_RDWR)


def test_device_fds_are_real_and_distinct(driver: EmulatedDriver) -> None:
    before = open_fd_count()
    fds = [driver.open(abi.CDSP_SECURE_NODE, os.O_RDWR) for _ in range(3)]
    assert len(set(fds)) == 3
    assert open_fd_count() == before + 3
    other = os.open(os.devnull, os.O_RDONLY)
    assert other not in fds
    os.close(other)
    for fd in fds:
        driver.close(fd)
    assert open_fd_count() == before


def test_twelve_sessions_shared_by_both_nodes(driver: EmulatedDriver) -> None:
    fds = [driver.open(abi.CDSP_SECURE_NODE, os.O_RDWR) for _ in range(6)]
    fds += [driver.open(abi.CDSP_NODE, os.O_RDWR) for _ in range(6)]
    try:
        for path in (abi.CDSP_SECURE_NODE, abi.CDSP_NODE):
            assert errno_of(driver.open, path, os.O_RDWR) == errno.EBUSY
        driver.close(fds.pop())
        fds.append(driver.open(abi.CDSP_SECURE_NODE, os.O_RDWR))
    finally:
        for fd in fds:
            driver.close(fd)


def test_session_count_is_configurable() -> None:
    driver = EmulatedDriver(SimConfig(sessions=2))
    fds = [driver.open(abi.CDSP_NODE, 0) for _ in range(2)]
    assert errno_of(driver.open, abi.CDSP_NODE, 0) == errno.EBUSY
    for fd in fds:
        driver.close(fd)


@pytest.mark.parametrize("sessions", [0, 15])
def test_session_count_is_bounded(sessions: int) -> None:
    with pytest.raises(ValueError, match="sessions"):
        SimConfig(sessions=sessions)


def test_unknown_command_words_are_enotty(driver: EmulatedDriver) -> None:
    fd = driver.open(abi.CDSP_SECURE_NODE, os.O_RDWR)
    try:
        words = [
            abi.FASTRPC_IOCTL_FREE_DMA_BUFF,  # defined, never implemented
            0xC020520C,  # SET_OPTION (K-poll only)
            0x40045204,  # INIT_ATTACH with a _IOW direction
            0xC0185203,  # INVOKE's nr with another size
            0x80105203,  # INVOKE's nr and size, read-only direction
            0xC0105300,  # another type character
            0,
        ]
        for word in words:
            assert (
                errno_of(driver.ioctl, fd, word, ctypes.create_string_buffer(64)) == errno.ENOTTY
            ), hex(word)
    finally:
        driver.close(fd)


def test_free_dma_buff_is_enotty_and_closing_frees(driver: EmulatedDriver) -> None:
    fd = driver.open(abi.CDSP_SECURE_NODE, os.O_RDWR)
    buf = alloc_dma_buf(driver, fd, 4096)
    word = abi.FASTRPC_IOCTL_FREE_DMA_BUFF
    assert errno_of(driver.ioctl, fd, word, ctypes.c_uint32(buf)) == errno.ENOTTY
    driver.close(buf)
    driver.close(fd)


def test_ioctl_on_a_regular_fd_is_enotty(driver: EmulatedDriver) -> None:
    regular = os.open(os.devnull, os.O_RDONLY)
    try:
        assert (
            errno_of(driver.ioctl, regular, abi.FASTRPC_IOCTL_INVOKE, abi.fastrpc_invoke())
            == errno.ENOTTY
        )
    finally:
        os.close(regular)


def test_ioctl_on_a_dup_of_a_device_fd_is_enotty(driver: EmulatedDriver) -> None:
    fd = driver.open(abi.CDSP_SECURE_NODE, os.O_RDWR)
    copy = os.dup(fd)
    try:
        assert errno_of(driver.ioctl, copy, abi.FASTRPC_IOCTL_INIT_ATTACH, None) == errno.ENOTTY
    finally:
        os.close(copy)
        driver.close(fd)


def test_ioctl_on_a_closed_fd_is_ebadf(driver: EmulatedDriver) -> None:
    fd = driver.open(abi.CDSP_SECURE_NODE, os.O_RDWR)
    driver.close(fd)
    assert errno_of(driver.ioctl, fd, abi.FASTRPC_IOCTL_INIT_ATTACH, None) == errno.EBADF
    assert errno_of(driver.close, fd) == errno.EBADF


def test_close_of_a_non_device_fd_closes_it(driver: EmulatedDriver) -> None:
    read_end, write_end = os.pipe()
    driver.close(read_end)
    driver.close(write_end)
    assert errno_of(os.fstat, read_end) == errno.EBADF


def test_the_device_cannot_be_mapped(driver: EmulatedDriver) -> None:
    fd = driver.open(abi.CDSP_SECURE_NODE, os.O_RDWR)
    try:
        assert errno_of(driver.mmap, fd, 4096) == errno.ENODEV
    finally:
        driver.close(fd)


@pytest.mark.parametrize(
    "request_word",
    [
        abi.FASTRPC_IOCTL_INVOKE,
        abi.FASTRPC_IOCTL_INIT_CREATE,
        abi.FASTRPC_IOCTL_ALLOC_DMA_BUFF,
        abi.FASTRPC_IOCTL_MMAP,
        abi.FASTRPC_IOCTL_MUNMAP,
        abi.FASTRPC_IOCTL_MEM_MAP,
        abi.FASTRPC_IOCTL_MEM_UNMAP,
        abi.FASTRPC_IOCTL_GET_DSP_INFO,
        abi.FASTRPC_IOCTL_INIT_CREATE_STATIC,
    ],
)
def test_missing_or_short_struct_arguments_are_efault(
    driver: EmulatedDriver, request_word: int
) -> None:
    fd = driver.open(abi.CDSP_SECURE_NODE, os.O_RDWR)
    try:
        for arg in (None, ctypes.create_string_buffer(4)):
            assert errno_of(driver.ioctl, fd, request_word, arg) == errno.EFAULT
    finally:
        driver.close(fd)


def test_read_only_arguments_cannot_receive_results(driver: EmulatedDriver) -> None:
    fd = driver.open(abi.CDSP_SECURE_NODE, os.O_RDWR)
    try:
        frozen = memoryview(bytes(abi.fastrpc_alloc_dma_buf(size=4096)))
        assert errno_of(driver.ioctl, fd, abi.FASTRPC_IOCTL_ALLOC_DMA_BUFF, frozen) == errno.EFAULT
    finally:
        driver.close(fd)


def test_byte_buffers_work_as_arguments(driver: EmulatedDriver) -> None:
    fd = driver.open(abi.CDSP_SECURE_NODE, os.O_RDWR)
    try:
        raw = bytearray(bytes(abi.fastrpc_ioctl_capability(domain=3, attribute_id=6)))
        assert driver.ioctl(fd, abi.FASTRPC_IOCTL_GET_DSP_INFO, raw) == 0
        assert abi.fastrpc_ioctl_capability.from_buffer(raw).capability == 0x73
    finally:
        driver.close(fd)


def test_close_releases_the_session_and_process(driver: EmulatedDriver) -> None:
    fd = driver.open(abi.CDSP_SECURE_NODE, os.O_RDWR)
    assert init_create(driver, fd) == 0
    assert driver.statistics().dsp_processes == 1
    driver.close(fd)
    stats = driver.statistics()
    assert (stats.dsp_processes, stats.sessions_in_use, stats.device_fds_open) == (0, 0, 0)
