"""GET_DSP_INFO: the capability table, its errnos and the old-kernel quirks."""

from __future__ import annotations

import errno
import os
from collections.abc import Iterator

import pytest

from npud.fastrpc.kernel import abi
from npud.sim import EmulatedDriver, SimConfig
from tests.emulator.sim_helpers import errno_of, get_capability


@pytest.fixture
def device(request: pytest.FixtureRequest) -> Iterator[tuple[EmulatedDriver, int]]:
    config = getattr(request, "param", SimConfig())
    driver = EmulatedDriver(config)
    fd = driver.open(abi.CDSP_SECURE_NODE, os.O_RDWR)
    yield driver, fd
    driver.close(fd)


X1E_DEFAULTS = {
    abi.DOMAIN_SUPPORT: 0,
    abi.UNSIGNED_PD_SUPPORT: 1,
    abi.HVX_SUPPORT_64B: 0,
    abi.HVX_SUPPORT_128B: 4,
    abi.VTCM_PAGE: 8 * 1024 * 1024,
    abi.VTCM_COUNT: 1,
    abi.ARCH_VER: 0x73,
    abi.ASYNC_FASTRPC_SUPPORT: 1,
    abi.STATUS_NOTIFICATION_SUPPORT: 0,
    abi.MCID_MULTICAST: 0,
    128: 0,
    255: 0,
}


def test_the_x1e_table(device: tuple[EmulatedDriver, int]) -> None:
    driver, fd = device
    for attribute, value in X1E_DEFAULTS.items():
        assert get_capability(driver, fd, attribute) == value, attribute
    assert get_capability(driver, fd, abi.HMX_SUPPORT_DEPTH) > 0
    assert get_capability(driver, fd, abi.HMX_SUPPORT_SPATIAL) > 0


def test_the_answer_lands_at_offset_8_and_nothing_else_changes(
    device: tuple[EmulatedDriver, int],
) -> None:
    driver, fd = device
    request = abi.fastrpc_ioctl_capability(domain=3, attribute_id=abi.ARCH_VER)
    request.reserved[:] = [1, 2, 3, 4]
    assert driver.ioctl(fd, abi.FASTRPC_IOCTL_GET_DSP_INFO, request) == 0
    assert (request.domain, request.capability, list(request.reserved)) == (3, 0x73, [1, 2, 3, 4])


@pytest.mark.parametrize("attribute", [256, 1000, 0xFFFFFFFF])
def test_attributes_past_255_are_eoverflow(
    device: tuple[EmulatedDriver, int], attribute: int
) -> None:
    driver, fd = device
    assert errno_of(get_capability, driver, fd, attribute) == errno.EOVERFLOW


@pytest.mark.parametrize("domain", [0, 1, 3, 7, 0xFFFFFFFF])
def test_new_kernels_ignore_the_domain(device: tuple[EmulatedDriver, int], domain: int) -> None:
    driver, fd = device
    assert get_capability(driver, fd, abi.ARCH_VER, domain=domain) == 0x73


@pytest.mark.parametrize("device", [SimConfig(capability_domain_check=True)], indirect=True)
def test_old_kernels_check_the_domain(device: tuple[EmulatedDriver, int]) -> None:
    driver, fd = device
    for domain in (0, 2, 3, 4):
        assert get_capability(driver, fd, abi.ARCH_VER, domain=domain) == 0x73
    for domain in (1, 5, 6, 0xFFFFFFFF):
        assert errno_of(get_capability, driver, fd, abi.ARCH_VER, domain=domain) == errno.ECHRNG
    assert (
        errno_of(get_capability, driver, fd, 999, domain=1) == errno.ECHRNG
    )  # the domain is checked first


@pytest.mark.parametrize("device", [SimConfig(capability_copyback_bug=True)], indirect=True)
def test_the_pre_2024_copy_back_bug(device: tuple[EmulatedDriver, int]) -> None:
    driver, fd = device
    request = abi.fastrpc_ioctl_capability(domain=3, attribute_id=abi.ARCH_VER)
    assert driver.ioctl(fd, abi.FASTRPC_IOCTL_GET_DSP_INFO, request) == 0
    assert (request.domain, request.capability) == (0x73, 0)


@pytest.mark.parametrize(
    "device",
    [SimConfig(arch=0x75, capabilities={abi.VTCM_COUNT: 2, 200: 7, abi.UNSIGNED_PD_SUPPORT: 0})],
    indirect=True,
)
def test_the_table_is_configurable(device: tuple[EmulatedDriver, int]) -> None:
    driver, fd = device
    assert get_capability(driver, fd, abi.ARCH_VER) == 0x75
    assert get_capability(driver, fd, abi.VTCM_COUNT) == 2
    assert get_capability(driver, fd, 200) == 7
    assert get_capability(driver, fd, abi.UNSIGNED_PD_SUPPORT) == 0
    assert get_capability(driver, fd, abi.HVX_SUPPORT_128B) == 4


@pytest.mark.parametrize(
    "bad",
    [
        {"capabilities": {0: 1}},
        {"capabilities": {256: 1}},
        {"capabilities": {3: 1 << 32}},
        {"arch": -1},
        {"reverse_rpc_timeout": 0},
        {"max_dma_buf_size": 0},
    ],
)
def test_bad_configurations_are_refused(bad: dict[str, object]) -> None:
    with pytest.raises(ValueError):  # noqa: PT011 - each message names its own field
        SimConfig(**bad)  # type: ignore[arg-type]


@pytest.mark.parametrize("device", [SimConfig(capability_api=False)], indirect=True)
def test_a_dsp_without_the_capability_api_is_eopnotsupp(
    device: tuple[EmulatedDriver, int],
) -> None:
    driver, fd = device
    assert errno_of(get_capability, driver, fd, abi.ARCH_VER) == errno.EOPNOTSUPP


def test_the_answer_is_cached_per_channel(device: tuple[EmulatedDriver, int]) -> None:
    driver, fd = device
    fresh = driver.open(abi.CDSP_NODE, os.O_RDWR)
    assert get_capability(driver, fd, abi.ARCH_VER) == 0x73
    driver.faults.subsystem_restart()
    try:
        # The dead channel answers from its cache (the kernel never clears it)...
        assert get_capability(driver, fresh, abi.VTCM_COUNT) == 1
        driver.faults.boot()
        booted = driver.open(abi.CDSP_NODE, os.O_RDWR)
        driver.faults.subsystem_restart()
        # ...but a channel that never asked the DSP cannot ask it any more.
        assert errno_of(get_capability, driver, booted, abi.ARCH_VER) == errno.EPIPE
        driver.close(booted)
    finally:
        driver.close(fresh)


def test_no_process_is_needed(device: tuple[EmulatedDriver, int]) -> None:
    driver, fd = device
    assert driver.process_info(fd) is None
    assert get_capability(driver, fd, abi.UNSIGNED_PD_SUPPORT) == 1
