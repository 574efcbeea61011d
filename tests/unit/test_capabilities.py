"""Capability parsing, including the pre-2024 kernels that copy the answer to offset 0."""

from __future__ import annotations

import errno
from collections.abc import Callable

import pytest

from npu_protocol import ErrorCode
from npud.domain.life import capabilities_record
from npud.fastrpc.kernel import abi
from npud.fastrpc.kernel.capabilities import (
    QUERIED_ATTRIBUTES,
    DspInfo,
    kernel_copies_to_offset_0,
    query_capabilities,
    query_capability,
)
from npud.fastrpc.kernel.errors import RpcError

TABLE = {abi.ARCH_VER: 0x73, abi.UNSIGNED_PD_SUPPORT: 1, abi.HVX_SUPPORT_128B: 4}


def fixed_kernel(cap: abi.fastrpc_ioctl_capability) -> int:
    cap.capability = TABLE.get(cap.attribute_id, 0)
    return 0


def old_kernel(cap: abi.fastrpc_ioctl_capability) -> int:
    # The bug: only 4 bytes copied back, to offset 0 (over `domain`).
    cap.domain = TABLE.get(cap.attribute_id, 0)
    return 0


@pytest.mark.parametrize("kernel", [fixed_kernel, old_kernel])
def test_capabilities_read_on_both_kinds_of_kernel(kernel: object) -> None:
    caps = query_capabilities(kernel)  # type: ignore[arg-type]
    assert caps.available
    assert caps.arch == "v73"
    assert caps.arch_version == 0x73
    assert caps.unsigned_pd
    assert caps.hvx_128b == 4
    assert caps.as_dict()["arch"] == "v73"


def test_domain_field_is_cdsp() -> None:
    seen: list[int] = []

    def kernel(cap: abi.fastrpc_ioctl_capability) -> int:
        seen.append(cap.domain)
        return 0

    query_capability(kernel, abi.ARCH_VER)
    assert seen == [abi.CDSP_DOMAIN_ID]


def test_dsp_without_the_api_is_reported_unavailable() -> None:
    def kernel(cap: abi.fastrpc_ioctl_capability) -> int:
        raise OSError(errno.EOPNOTSUPP, "no")

    caps = query_capabilities(kernel)
    assert not caps.available
    assert caps.arch == "unknown"


def test_epipe_propagates_for_the_caller_to_translate() -> None:
    def kernel(cap: abi.fastrpc_ioctl_capability) -> int:
        raise OSError(errno.EPIPE, "down")

    with pytest.raises(OSError, match="down"):
        query_capabilities(kernel)


def test_a_dsp_error_code_is_a_fastrpc_error() -> None:
    def kernel(cap: abi.fastrpc_ioctl_capability) -> int:
        return 0x80000401

    with pytest.raises(RpcError) as caught:
        query_capabilities(kernel)
    assert caught.value.code is ErrorCode.FASTRPC
    assert "0x80000401 (AEE_EFAILED)" in str(caught.value)


def test_empty_capabilities() -> None:
    assert DspInfo(available=False).as_dict()["available"] is False


def buggy_kernel_with(table: dict[int, int]) -> Callable[[abi.fastrpc_ioctl_capability], int]:
    def kernel(cap: abi.fastrpc_ioctl_capability) -> int:
        cap.domain = table.get(cap.attribute_id, 0)  # index 0 is always 0 in the kernel
        return 0

    return kernel


def test_an_answer_equal_to_the_domain_field_is_read_right_on_a_buggy_kernel() -> None:
    """3 written over domain = 3 looked unchanged to the old guess: the probe knows better."""
    table = {abi.HVX_SUPPORT_128B: 3, abi.STATUS_NOTIFICATION_SUPPORT: 3, abi.ARCH_VER: 0x73}
    caps = query_capabilities(buggy_kernel_with(table))
    assert caps.hvx_128b == 3
    assert caps.status_notification
    assert caps.arch == "v73"


def test_the_probe_asks_for_attribute_0_first() -> None:
    seen: list[int] = []

    def kernel(cap: abi.fastrpc_ioctl_capability) -> int:
        seen.append(cap.attribute_id)
        return 0

    query_capabilities(kernel)
    assert seen[0] == 0
    assert seen[1:] == list(QUERIED_ATTRIBUTES)
    assert kernel_copies_to_offset_0(fixed_kernel) is False
    assert kernel_copies_to_offset_0(old_kernel) is True


@pytest.mark.parametrize(("answer", "supported"), [(0, False), (1, False), (3, True), (4, False)])
def test_status_notification_means_version_2(answer: int, supported: bool) -> None:
    info = DspInfo(available=True, raw={abi.STATUS_NOTIFICATION_SUPPORT: answer})
    assert info.status_notification is supported


def test_libcdsprpc_internal_attributes_reach_the_wire() -> None:
    """128..131 (PERF_V2_DSP_SUPPORT .. PROC_SHARED_BUFFER_SUPPORT, dspsignal's among
    them) are asked for and sent in the Welcome's dsp map as the DSP answered them."""
    table = {128: 1, 129: 2, 130: 1, 131: 7}

    def kernel(cap: abi.fastrpc_ioctl_capability) -> int:
        cap.capability = table.get(cap.attribute_id, 0)
        return 0

    record = capabilities_record(query_capabilities(kernel))
    assert (
        record.perf_v2_dsp_support,
        record.map_dma_handle_reverserpc,
        record.dspsignal_dsp_support,
        record.proc_shared_buffer_support,
    ) == (1, 2, 1, 7)
