"""The emulator's own ABI description agrees with npud.fastrpc.kernel.abi (and stays independent)."""

from __future__ import annotations

import ctypes
import subprocess
import sys

import pytest
from hypothesis import given
from hypothesis import strategies as st

from npud.fastrpc.kernel import abi
from npud.fastrpc.kernel.driver import Driver
from npud.sim import EmulatedDriver, layout

COMMANDS = [
    (layout.ALLOC_DMA_BUFF, abi.FASTRPC_IOCTL_ALLOC_DMA_BUFF),
    (layout.FREE_DMA_BUFF, abi.FASTRPC_IOCTL_FREE_DMA_BUFF),
    (layout.INVOKE, abi.FASTRPC_IOCTL_INVOKE),
    (layout.INIT_ATTACH, abi.FASTRPC_IOCTL_INIT_ATTACH),
    (layout.INIT_CREATE, abi.FASTRPC_IOCTL_INIT_CREATE),
    (layout.MMAP, abi.FASTRPC_IOCTL_MMAP),
    (layout.MUNMAP, abi.FASTRPC_IOCTL_MUNMAP),
    (layout.INIT_ATTACH_SNS, abi.FASTRPC_IOCTL_INIT_ATTACH_SNS),
    (layout.INIT_CREATE_STATIC, abi.FASTRPC_IOCTL_INIT_CREATE_STATIC),
    (layout.MEM_MAP, abi.FASTRPC_IOCTL_MEM_MAP),
    (layout.MEM_UNMAP, abi.FASTRPC_IOCTL_MEM_UNMAP),
    (layout.GET_DSP_INFO, abi.FASTRPC_IOCTL_GET_DSP_INFO),
]


@pytest.mark.parametrize(("ours", "theirs"), COMMANDS)
def test_command_words_match_the_ctypes_abi(ours: int, theirs: int) -> None:
    assert ours == theirs


def test_command_words_are_the_references_literals() -> None:
    assert layout.INVOKE == 0xC0105203
    assert layout.INIT_ATTACH == 0x00005204
    assert layout.SET_OPTION == (3 << 30) | (32 << 16) | (0x52 << 8) | 12


STRUCTS = [
    (layout.INVOKE_STRUCT, abi.fastrpc_invoke),
    (layout.INVOKE_ARG_STRUCT, abi.fastrpc_invoke_args),
    (layout.INIT_CREATE_STRUCT, abi.fastrpc_init_create),
    (layout.INIT_CREATE_STATIC_STRUCT, abi.fastrpc_init_create_static),
    (layout.ALLOC_DMA_BUF_STRUCT, abi.fastrpc_alloc_dma_buf),
    (layout.REQ_MMAP_STRUCT, abi.fastrpc_req_mmap),
    (layout.REQ_MUNMAP_STRUCT, abi.fastrpc_req_munmap),
    (layout.MEM_MAP_STRUCT, abi.fastrpc_mem_map),
    (layout.MEM_UNMAP_STRUCT, abi.fastrpc_mem_unmap),
    (layout.CAPABILITY_STRUCT, abi.fastrpc_ioctl_capability),
]


@pytest.mark.parametrize(("fmt", "ctype"), STRUCTS)
def test_struct_sizes_match(fmt: object, ctype: type[ctypes.Structure]) -> None:
    assert getattr(fmt, "size") == ctypes.sizeof(ctype)  # noqa: B009 - fmt is a struct.Struct


@pytest.mark.parametrize(("fmt", "ctype"), STRUCTS)
def test_field_offsets_match(fmt: object, ctype: type[ctypes.Structure]) -> None:
    # Give every scalar field a distinct value through ctypes, read it back with struct.
    instance = ctype()
    expected = []
    for number, (name, field_type) in enumerate(ctype._fields_, start=1):  # type: ignore[misc]
        if issubclass(field_type, ctypes.Array):
            continue  # reserved arrays: covered by the size check
        setattr(instance, name, number)
        expected.append(number)
    unpack = getattr(fmt, "unpack")  # noqa: B009
    assert list(unpack(bytes(instance))) == expected


def test_write_back_offsets_match() -> None:
    assert abi.fastrpc_alloc_dma_buf.fd.offset == layout.ALLOC_DMA_BUF_FD_OFFSET
    assert abi.fastrpc_req_mmap.vaddrout.offset == layout.REQ_MMAP_VADDROUT_OFFSET
    assert abi.fastrpc_mem_map.vaddrout.offset == layout.MEM_MAP_VADDROUT_OFFSET
    assert abi.fastrpc_ioctl_capability.domain.offset == layout.CAPABILITY_DOMAIN_OFFSET
    assert abi.fastrpc_ioctl_capability.capability.offset == layout.CAPABILITY_VALUE_OFFSET


@given(st.integers(min_value=0, max_value=0xFFFFFFFF))
def test_scalars_decode_like_the_abi(sc: int) -> None:
    scalars = layout.decode_scalars(sc)
    assert scalars.attr == abi.remote_scalars_attr(sc)
    assert scalars.method == abi.remote_scalars_method(sc)
    assert scalars.inbufs == abi.remote_scalars_inbufs(sc)
    assert scalars.outbufs == abi.remote_scalars_outbufs(sc)
    assert scalars.inhandles == abi.remote_scalars_inhandles(sc)
    assert scalars.outhandles == abi.remote_scalars_outhandles(sc)
    assert scalars.length == abi.remote_scalars_length(sc)


@given(
    st.integers(min_value=0, max_value=31),
    st.integers(min_value=0, max_value=255),
    st.integers(min_value=0, max_value=255),
)
def test_make_scalars_like_the_abi(method: int, inbufs: int, outbufs: int) -> None:
    assert layout.make_scalars(method, inbufs, outbufs) == abi.remote_scalars_make(
        method, inbufs, outbufs
    )


def test_the_emulator_does_not_import_the_ctypes_abi() -> None:
    code = "import sys, npud.sim; assert 'npud.fastrpc.kernel.abi' not in sys.modules, sorted(sys.modules)"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_emulated_driver_is_a_driver() -> None:
    driver: Driver = EmulatedDriver()  # mypy checks the protocol
    assert callable(driver.ioctl)
