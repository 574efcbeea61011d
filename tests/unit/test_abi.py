"""The ctypes ABI against the C compiler's view of the real uapi header, and golden values."""

from __future__ import annotations

import ctypes
import subprocess
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from npud.fastrpc.kernel import abi
from tests.tools import require_file, require_tool

HEADER = Path("/usr/include/misc/fastrpc.h")
HEAP_HEADER = Path("/usr/include/linux/dma-heap.h")

STRUCTS: dict[str, type[ctypes.Structure]] = {
    "fastrpc_invoke_args": abi.fastrpc_invoke_args,
    "fastrpc_invoke": abi.fastrpc_invoke,
    "fastrpc_init_create": abi.fastrpc_init_create,
    "fastrpc_alloc_dma_buf": abi.fastrpc_alloc_dma_buf,
    "fastrpc_req_mmap": abi.fastrpc_req_mmap,
    "fastrpc_mem_map": abi.fastrpc_mem_map,
    "fastrpc_req_munmap": abi.fastrpc_req_munmap,
    "fastrpc_mem_unmap": abi.fastrpc_mem_unmap,
    "fastrpc_ioctl_capability": abi.fastrpc_ioctl_capability,
    "dma_heap_allocation_data": abi.dma_heap_allocation_data,
}

# Request macros in the Debian header (INIT_CREATE_STATIC arrived in later kernels).
REQUESTS: dict[str, int] = {
    "FASTRPC_IOCTL_ALLOC_DMA_BUFF": abi.FASTRPC_IOCTL_ALLOC_DMA_BUFF,
    "FASTRPC_IOCTL_FREE_DMA_BUFF": abi.FASTRPC_IOCTL_FREE_DMA_BUFF,
    "FASTRPC_IOCTL_INVOKE": abi.FASTRPC_IOCTL_INVOKE,
    "FASTRPC_IOCTL_INIT_ATTACH": abi.FASTRPC_IOCTL_INIT_ATTACH,
    "FASTRPC_IOCTL_INIT_CREATE": abi.FASTRPC_IOCTL_INIT_CREATE,
    "FASTRPC_IOCTL_MMAP": abi.FASTRPC_IOCTL_MMAP,
    "FASTRPC_IOCTL_MUNMAP": abi.FASTRPC_IOCTL_MUNMAP,
    "FASTRPC_IOCTL_INIT_ATTACH_SNS": abi.FASTRPC_IOCTL_INIT_ATTACH_SNS,
    "FASTRPC_IOCTL_MEM_MAP": abi.FASTRPC_IOCTL_MEM_MAP,
    "FASTRPC_IOCTL_MEM_UNMAP": abi.FASTRPC_IOCTL_MEM_UNMAP,
    "FASTRPC_IOCTL_GET_DSP_INFO": abi.FASTRPC_IOCTL_GET_DSP_INFO,
    "DMA_HEAP_IOCTL_ALLOC": abi.DMA_HEAP_IOCTL_ALLOC,
}

CONSTANTS: dict[str, int] = {
    "DMA_HEAP_VALID_FD_FLAGS": abi.DMA_HEAP_VALID_FD_FLAGS,
    "DMA_HEAP_VALID_HEAP_FLAGS": abi.DMA_HEAP_VALID_HEAP_FLAGS,
    "FASTRPC_MAP_STATIC": abi.FASTRPC_MAP_STATIC,
    "FASTRPC_MAP_FD": abi.FASTRPC_MAP_FD,
    "FASTRPC_MAP_FD_DELAYED": abi.FASTRPC_MAP_FD_DELAYED,
    "FASTRPC_MAP_FD_NOMAP": abi.FASTRPC_MAP_FD_NOMAP,
    "FASTRPC_MAP_MAX": abi.FASTRPC_MAP_MAX,
    "FASTRPC_MODE_DEBUG": abi.FASTRPC_MODE_DEBUG,
    "FASTRPC_MODE_PTRACE": abi.FASTRPC_MODE_PTRACE,
    "FASTRPC_MODE_CRC": abi.FASTRPC_MODE_CRC,
    "FASTRPC_MODE_UNSIGNED_MODULE": abi.FASTRPC_MODE_UNSIGNED_MODULE,
    "FASTRPC_MODE_ADAPTIVE_QOS": abi.FASTRPC_MODE_ADAPTIVE_QOS,
    "FASTRPC_MODE_SYSTEM_PROCESS": abi.FASTRPC_MODE_SYSTEM_PROCESS,
    "FASTRPC_MODE_PRIVILEGED": abi.FASTRPC_MODE_PRIVILEGED,
    "FASTRPC_ATTR_SECUREMAP": abi.FASTRPC_ATTR_SECUREMAP,
}


def _c_program() -> str:
    lines = [
        "#define _GNU_SOURCE",  # O_CLOEXEC under -std=c11 (dma-heap.h's valid fd flags)
        "#include <stdio.h>",
        "#include <stddef.h>",
        "#include <fcntl.h>",
        "#include <linux/ioctl.h>",
        f'#include "{HEADER}"',
        f'#include "{HEAP_HEADER}"',
        "int main(void) {",
    ]
    for name, struct in STRUCTS.items():
        lines.append(f'printf("size {name} %zu\\n", sizeof(struct {name}));')
        lines.append(f'printf("align {name} %zu\\n", _Alignof(struct {name}));')
        for field, *_ in struct._fields_:
            lines.append(
                f'printf("offset {name}.{field} %zu\\n", offsetof(struct {name}, {field}));'
            )
    for name in [*REQUESTS, *CONSTANTS]:
        lines.append(f'printf("value {name} %lu\\n", (unsigned long)({name}));')
    lines += ["return 0;", "}"]
    return "\n".join(lines)


@pytest.fixture(scope="module")
def compiler_view(tmp_path_factory: pytest.TempPathFactory) -> dict[str, int]:
    gcc = require_tool("gcc", "gcc")
    require_file(HEADER, "linux-libc-dev")
    require_file(HEAP_HEADER, "linux-libc-dev")
    work = tmp_path_factory.mktemp("abi")
    source = work / "abi.c"
    source.write_text(_c_program())
    binary = work / "abi"
    subprocess.run(
        [gcc, "-std=c11", "-Wall", "-Werror", "-o", str(binary), str(source)], check=True
    )
    out = subprocess.run([str(binary)], check=True, capture_output=True, text=True).stdout
    view: dict[str, int] = {}
    for line in out.splitlines():
        kind, name, value = line.split()
        view[f"{kind} {name}"] = int(value)
    return view


@pytest.mark.parametrize("name", list(STRUCTS))
def test_struct_layout_matches_the_kernel_header(compiler_view: dict[str, int], name: str) -> None:
    struct = STRUCTS[name]
    assert ctypes.sizeof(struct) == compiler_view[f"size {name}"]
    assert ctypes.alignment(struct) == compiler_view[f"align {name}"]
    for field, *_ in struct._fields_:
        assert getattr(struct, field).offset == compiler_view[f"offset {name}.{field}"], field


@pytest.mark.parametrize("name", list(REQUESTS))
def test_request_numbers_match_the_kernel_header(compiler_view: dict[str, int], name: str) -> None:
    assert compiler_view[f"value {name}"] == REQUESTS[name]


@pytest.mark.parametrize("name", list(CONSTANTS))
def test_constants_match_the_kernel_header(compiler_view: dict[str, int], name: str) -> None:
    assert compiler_view[f"value {name}"] == CONSTANTS[name]


def test_golden_request_numbers() -> None:
    # From the reference, section 1 (x86_64 = aarch64); the DMA heap's from its "Related".
    assert {request.name: int(request) for request in abi.Ioctl} == {
        "ALLOC_DMA_BUFF": 0xC0105201,
        "FREE_DMA_BUFF": 0xC0045202,
        "INVOKE": 0xC0105203,
        "INIT_ATTACH": 0x00005204,  # _IO, not _IOW
        "INIT_CREATE": 0xC0185205,
        "MMAP": 0xC0205206,
        "MUNMAP": 0xC0105207,
        "INIT_ATTACH_SNS": 0x00005208,
        "INIT_CREATE_STATIC": 0xC0105209,
        "MEM_MAP": 0xC040520A,
        "MEM_UNMAP": 0xC030520B,
        "GET_DSP_INFO": 0xC01C520D,
        "DMA_HEAP_IOCTL_ALLOC": 0xC0184800,
    }


def test_every_request_but_the_newest_is_checked_against_the_compiler() -> None:
    """The header Debian ships predates INIT_CREATE_STATIC; every other member is in
    REQUESTS, which the compiler checks, under the uapi's own macro name."""
    checked = {int(value) for value in REQUESTS.values()}
    assert {r for r in abi.Ioctl if r not in checked} == {abi.Ioctl.INIT_CREATE_STATIC}


def test_a_request_is_named_by_its_member_or_its_number() -> None:
    assert abi.ioctl_name(0xC0105203) == "INVOKE"
    assert abi.ioctl_name(0xC0105299) == "0xC0105299"
    assert abi.FASTRPC_IOCTL_INVOKE is abi.Ioctl.INVOKE  # the uapi names are aliases


def test_golden_struct_sizes() -> None:
    sizes = {name: ctypes.sizeof(struct) for name, struct in STRUCTS.items()}
    assert sizes == {
        "fastrpc_invoke_args": 24,
        "fastrpc_invoke": 16,
        "fastrpc_init_create": 24,
        "fastrpc_alloc_dma_buf": 16,
        "fastrpc_req_mmap": 32,
        "fastrpc_mem_map": 64,
        "fastrpc_req_munmap": 16,
        "fastrpc_mem_unmap": 48,
        "fastrpc_ioctl_capability": 28,
        "dma_heap_allocation_data": 24,
    }
    assert ctypes.sizeof(abi.fastrpc_init_create_static) == 16


def test_golden_scalars() -> None:
    # Reference sections 4, 5.3, 5.4 and 5.6.
    assert abi.remote_scalars_make(0, 2, 2) == 0x00020200  # remotectl open
    assert abi.remote_scalars_make(1, 1, 2) == 0x01010200  # remotectl close
    assert abi.remote_scalars_makex(0, 2, 2, 1, 0, 0) == 0x02020100  # echo
    assert abi.remote_scalars_make(4, 2, 2) == 0x04020200  # listener next2
    assert abi.remote_scalars_make(19, 5, 1) == 0x13050100  # apps_std fopen_with_env
    assert abi.remote_scalars_makex(7, 31, 255, 255, 15, 15) == 0xFFFFFFFF


def test_scalars_field_out_of_range_is_refused() -> None:
    with pytest.raises(ValueError, match="method=32"):
        abi.remote_scalars_make(32, 0, 0)
    with pytest.raises(ValueError, match="nin=256"):
        abi.remote_scalars_make(0, 256, 0)
    with pytest.raises(ValueError, match="hout=-1"):
        abi.remote_scalars_makex(0, 0, 0, 0, 0, -1)


@given(
    attr=st.integers(0, 7),
    method=st.integers(0, 31),
    nin=st.integers(0, 255),
    nout=st.integers(0, 255),
    hin=st.integers(0, 15),
    hout=st.integers(0, 15),
)
def test_scalars_round_trip(
    attr: int, method: int, nin: int, nout: int, hin: int, hout: int
) -> None:
    sc = abi.remote_scalars_makex(attr, method, nin, nout, hin, hout)
    assert 0 <= sc <= 0xFFFFFFFF
    assert abi.remote_scalars_attr(sc) == attr
    assert abi.remote_scalars_method(sc) == method
    assert abi.remote_scalars_inbufs(sc) == nin
    assert abi.remote_scalars_outbufs(sc) == nout
    assert abi.remote_scalars_inhandles(sc) == hin
    assert abi.remote_scalars_outhandles(sc) == hout
    assert abi.remote_scalars_length(sc) == nin + nout + hin + hout


@given(sc=st.integers(0, 0xFFFFFFFF))
def test_every_scalars_word_decodes_and_rebuilds(sc: int) -> None:
    rebuilt = abi.remote_scalars_makex(
        abi.remote_scalars_attr(sc),
        abi.remote_scalars_method(sc),
        abi.remote_scalars_inbufs(sc),
        abi.remote_scalars_outbufs(sc),
        abi.remote_scalars_inhandles(sc),
        abi.remote_scalars_outhandles(sc),
    )
    assert rebuilt == sc
