"""npud's libcdsprpc as a library: its exports, its link, its headers, its error table."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import Final

import pytest

from npu_protocol import ErrorCode
from npu_protocol.aee import AEE, DSP_AEE_EOFFSET
from tests.shim.programs import C_DIR, INCLUDE, SHIM, compile_program, need_compiler
from tests.tools import require_tool

# What llama.cpp's Hexagon backend dlsyms (17 required, rpcmem_alloc2 optional), and
# what QNN's HTP stub needs besides.
LLAMA: Final = (
    "rpcmem_alloc", "rpcmem_alloc2", "rpcmem_free", "rpcmem_to_fd", "fastrpc_mmap",
    "fastrpc_munmap", "dspqueue_create", "dspqueue_close", "dspqueue_export", "dspqueue_write",
    "dspqueue_read", "dspqueue_read_noblock", "remote_handle64_open", "remote_handle64_invoke",
    "remote_handle64_close", "remote_handle_control", "remote_handle64_control",
    "remote_session_control",
)  # fmt: skip
QNN: Final = (
    "remote_handle_open", "remote_handle_invoke", "remote_handle_close", "remote_register_buf",
    "remote_register_buf_attr", "remote_register_dma_handle", "remote_register_dma_handle_attr",
    "rpcmem_init", "rpcmem_deinit",
)  # fmt: skip
NOT_EXPORTED: Final = ("remote_system_request",)  # programs fall back to the static domains


def _tool_output(*command: str) -> str:
    result = subprocess.run(command, capture_output=True, text=True, check=False, timeout=60)
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_exports_exactly_the_abi(shim_plain: Path) -> None:
    nm = require_tool("nm", "binutils")
    out = _tool_output(nm, "-D", "--defined-only", str(shim_plain / "libcdsprpc.so.1"))
    exported = {line.split()[-1] for line in out.splitlines() if line.split()[1] in "TW"}
    assert exported == set(LLAMA) | set(QNN)
    assert not exported & set(NOT_EXPORTED)


def test_linked_as_promised(shim_plain: Path) -> None:
    readelf = require_tool("readelf", "binutils")
    dynamic = _tool_output(readelf, "-d", str(shim_plain / "libcdsprpc.so.1"))
    assert "Library soname: [libcdsprpc.so.1]" in dynamic
    flags = " ".join(line for line in dynamic.splitlines() if "FLAGS" in line)
    assert "SYMBOLIC" in flags  # its own calls never bind to a program's same-named wrappers
    assert "NODELETE" in flags  # dlclose never unmaps code its threads run
    needed = set(re.findall(r"Shared library: \[(.+?)\]", dynamic))
    assert needed <= {"libc.so.6", "libmsgpackc.so.2", "libmsgpack-c.so.2"}, needed
    link = shim_plain / "libcdsprpc.so"
    assert link.is_symlink()
    assert link.readlink() == Path("libcdsprpc.so.1")


def test_dlopen_by_the_name_llama_cpp_uses(shim_plain: Path, tmp_path: Path) -> None:
    """dlopen("libcdsprpc.so"), then each entry point, as htp-drv.cpp does."""
    program = compile_program(
        tmp_path / "dlopen_check", [C_DIR / "dlopen_check.c"], extra=("-ldl",), sanitize=False
    )
    result = subprocess.run(
        [str(program), *LLAMA, *QNN, *NOT_EXPORTED],
        env={"LD_LIBRARY_PATH": str(shim_plain)},
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    found = dict(line.split() for line in result.stdout.splitlines())
    assert found == {**{n: "1" for n in (*LLAMA, *QNN)}, **{n: "0" for n in NOT_EXPORTED}}


def test_headers_compile_as_c11_and_cxx17(tmp_path: Path) -> None:
    need_compiler()
    gxx = require_tool("g++", "g++")
    source = tmp_path / "all.c"
    source.write_text(
        "".join(f"#include <{h}>\n" for h in ("AEEStdDef.h", "AEEStdErr.h", "remote.h"))
        + "#include <rpcmem.h>\n#include <dspqueue.h>\n#include <remote.h>\nint main(void) { return 0; }\n"
    )
    warnings = ("-Wall", "-Wextra", "-Werror", "-Wpedantic", "-Wstrict-prototypes")
    subprocess.run(
        ["gcc", "-std=c11", *warnings, f"-I{INCLUDE}", "-fsyntax-only", str(source)],
        check=True,
        timeout=60,
    )
    result = subprocess.run(
        [gxx, "-std=c++17", "-Wall", "-Wextra", "-Werror", f"-I{INCLUDE}", "-fsyntax-only",
         str(C_DIR / "headers.cc")],
        capture_output=True, text=True, check=False, timeout=60,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr


# The ABI on LP64 (x86_64 and aarch64): libcdsprpc's structs as llama.cpp's calls
# pass them (NOTES: GET_URI 48 bytes, GET_EFFECTIVE_DOMAIN_ID 24), the enum values.
LAYOUT: Final = {
    "sizeof(remote_handle)": 4,
    "sizeof(remote_handle64)": 8,
    "sizeof(remote_buf)": 16,
    "sizeof(remote_arg)": 16,
    "sizeof(remote_dma_handle)": 8,
    "sizeof(struct remote_dsp_capability)": 12,
    "sizeof(struct remote_rpc_control_latency)": 8,
    "sizeof(struct remote_rpc_control_unsigned_module)": 8,
    "sizeof(remote_rpc_effective_domain_id_t)": 24,
    "offsetof(remote_rpc_effective_domain_id_t, session_id)": 12,
    "offsetof(remote_rpc_effective_domain_id_t, effective_domain_id)": 16,
    "sizeof(remote_rpc_get_uri_t)": 48,
    "offsetof(remote_rpc_get_uri_t, session_id)": 12,
    "offsetof(remote_rpc_get_uri_t, module_uri)": 16,
    "offsetof(remote_rpc_get_uri_t, module_uri_len)": 24,
    "offsetof(remote_rpc_get_uri_t, uri)": 32,
    "offsetof(remote_rpc_get_uri_t, uri_len)": 40,
    "sizeof(remote_rpc_reserve_new_session_t)": 40,
    "offsetof(remote_rpc_reserve_new_session_t, effective_domain_id)": 28,
    "sizeof(remote_rpc_get_domain_t)": 4,
    "sizeof(struct domain)": 16,
    "sizeof(struct dspqueue_buffer)": 24,
    "offsetof(struct dspqueue_buffer, ptr)": 16,
    "sizeof(fastrpc_domain)": 96,
    "sizeof(system_req_payload)": 32,
    "REMOTE_SCALARS_MAKEX(0, 2, 2, 1, 0, 0)": 0x02020100,
    "REMOTE_SCALARS_MAKEX(7, 31, 255, 255, 15, 15)": 0xFFFFFFFF,
    "REMOTE_SCALARS_LENGTH(REMOTE_SCALARS_MAKEX(0, 1, 2, 3, 4, 5))": 14,
    "CDSP_DOMAIN_ID": 3,
    "DSPRPC_CONTROL_LATENCY": 1,
    "DSPRPC_GET_DSP_INFO": 2,
    "DSPRPC_GET_DOMAIN": 4,
    "DSPRPC_CONTROL_UNSIGNED_MODULE": 2,
    "FASTRPC_RESERVE_NEW_SESSION": 13,
    "FASTRPC_GET_EFFECTIVE_DOMAIN_ID": 14,
    "FASTRPC_GET_URI": 15,
    "ARCH_VER": 6,
    "MCID_MULTICAST": 11,
    "RPC_PM_QOS": 1,
    "FASTRPC_MAP_FD": 2,
    "FASTRPC_MAP_FD_DELAYED": 3,
    "FASTRPC_MAP_FD_NOMAP": 16,
    "FASTRPC_MAP_FD_EXTENDED": 17,
    "FASTRPC_MAP_FD_DELAYED_EXTENDED": 18,
    "FASTRPC_GET_DOMAINS": 0,
    "FASTRPC_NSP": 1,
    "DOMAINS_LIST_FLAGS_SET_TYPE(0, FASTRPC_NSP)": 1,
    "RPCMEM_HEAP_ID_SYSTEM": 25,
    "RPCMEM_DEFAULT_FLAGS": 1,
    "RPCMEM_HEAP_NOREG": 0x40000000,
    "DSPQUEUE_TIMEOUT_NONE": 0xFFFFFFFF,
    "DSPQUEUE_PACKET_FLAG_USER_READY": 0x10,
    "DSPQUEUE_BUFFER_FLAG_FLUSH_SENDER | DSPQUEUE_BUFFER_FLAG_INVALIDATE_RECIPIENT": 0x90,
    "DSP_AEE_EOFFSET": 0x80000400,
    "AEE_EUNSUPPORTED": 0x14,
    "AEE_EEXPIRED": 0x0C,
    "AEE_EWOULDBLOCK": 516,
    "AEE_ECONNRESET": 104,
    "AEE_EUNSUPPORTEDAPI": 0x6C,
}


def test_layouts_and_values(tmp_path: Path) -> None:
    program = compile_program(tmp_path / "layout", [C_DIR / "layout.c"], sanitize=False)
    out = _tool_output(str(program))
    got = {name: int(value) for name, value in (line.rsplit(" ", 1) for line in out.splitlines())}
    assert got == LAYOUT


def test_aee_codes_match_npu_protocol(tmp_path: Path) -> None:
    header = (INCLUDE / "AEEStdErr.h").read_text()
    names = sorted(set(re.findall(r"^#define (AEE_E[A-Z0-9_]+)\s", header, re.MULTILINE)))
    source = tmp_path / "aee.c"
    source.write_text(
        '#include <stdio.h>\n#include "AEEStdErr.h"\nint main(void) {\n'
        + "".join(f'    printf("{n} %d\\n", (int)({n}));\n' for n in names)
        + "    return 0;\n}\n"
    )
    program = compile_program(tmp_path / "aee", [source], sanitize=False)
    got = {
        name: int(value)
        for name, value in (line.split() for line in _tool_output(str(program)).splitlines())
    }
    common = [member for member in AEE if f"AEE_{member.name}" in got]
    assert len(common) >= 40, common
    for member in common:
        assert got[f"AEE_{member.name}"] == int(member), member
    assert DSP_AEE_EOFFSET == 0x80000400


DSP_RESULT: Final = 0x8000040E
ERPC: Final = 0x200
ECONNRESET: Final = 104
BADPARM: Final = 0x0E

# npud's error -> what a libcdsprpc caller sees (shim/README.md, "Errors"). Every code
# of the protocol is here: a new one needs a decision.
ERROR_TABLE: Final = {
    ErrorCode.FASTRPC: DSP_RESULT,
    ErrorCode.OPEN_FAILED: DSP_RESULT,
    ErrorCode.INVOKE_FAILED: DSP_RESULT,
    ErrorCode.MMAP_FAILED: DSP_RESULT,
    ErrorCode.DSP_RESTARTED: ECONNRESET,
    ErrorCode.NO_FREE_SESSION: ERPC,
    ErrorCode.UNSUPPORTED: 0x14,
    ErrorCode.DEVICE_NOT_FOUND: 0x43,
    ErrorCode.DEVICE_ERROR: ERPC,
    ErrorCode.UNKNOWN_HANDLE: 0x2C,
    ErrorCode.SESSION_CLOSED: ECONNRESET,
    ErrorCode.DMA_BUF_ALLOC: 0x68,
    ErrorCode.DMA_SIZE_OVERFLOW: 0x68,
    ErrorCode.DMA_EXCEEDS_MAX_SIZE: 0x68,
    ErrorCode.INVALID_FD: BADPARM,
    ErrorCode.SLICE_OUT_OF_RANGE: BADPARM,
    ErrorCode.UNKNOWN_BUFFER: BADPARM,
    ErrorCode.INVALID_ARGUMENT: BADPARM,
    ErrorCode.QNN: ERPC,
    ErrorCode.MODEL_NOT_LOADED: ERPC,
    ErrorCode.INVALID_TENSOR_INDEX: ERPC,
    ErrorCode.MODEL_SLOTS_FULL: ERPC,
    ErrorCode.TENSOR_MISMATCH: ERPC,
    ErrorCode.INPUT_NOT_SET: ERPC,
    ErrorCode.MODEL_FILE_UNREADABLE: ERPC,
    ErrorCode.MODEL_FORMAT: ERPC,
    ErrorCode.MODEL_MALFORMED: ERPC,
    ErrorCode.MODEL_REJECTED: ERPC,
    ErrorCode.NO_OUTPUTS: ERPC,
    ErrorCode.OUTPUT_TOO_LARGE: ERPC,  # the default for the models' 3xx
    ErrorCode.SESSION_BUSY: 0x20,
    ErrorCode.SHELL_VERIFY: 0x06,
    ErrorCode.FRAME_TOO_LARGE: ERPC,
    ErrorCode.BAD_FRAME_HEADER: ERPC,
    ErrorCode.TOO_MANY_FDS: ERPC,
    ErrorCode.MISSING_FDS: ERPC,
    ErrorCode.FD_COUNT_MISMATCH: ERPC,
    ErrorCode.FDS_TRUNCATED: ERPC,
    ErrorCode.BAD_MESSAGE: ERPC,
    ErrorCode.UNEXPECTED_MESSAGE: ERPC,
    ErrorCode.UNSUPPORTED_VERSION: 0x04,
    ErrorCode.DUPLICATE_REQUEST_ID: ERPC,
    ErrorCode.UNKNOWN_REQUEST_ID: ERPC,
    ErrorCode.TOO_MANY_IN_FLIGHT: ERPC,
    ErrorCode.TRUNCATED_FRAME: ERPC,
    ErrorCode.CONNECTION_CLOSED: ECONNRESET,
    ErrorCode.NOT_PERMITTED: 0x4E,
    ErrorCode.QUOTA_EXCEEDED: 0x02,
    ErrorCode.TIMEOUT: 0x0C,
    ErrorCode.SHUTTING_DOWN: ECONNRESET,
    ErrorCode.INTERNAL_ERROR: ERPC,
    ErrorCode.DEADLINE_EXCEEDED: 0x0C,
    ErrorCode.ADMISSION_REFUSED: 0x4E,
}


def test_every_npud_error_has_its_aee_code(tmp_path: Path) -> None:
    assert set(ERROR_TABLE) == set(ErrorCode)
    program = compile_program(
        tmp_path / "errors_table",
        [C_DIR / "errors_table.c", SHIM / "src" / "errors.c"],
        extra=(f"-I{SHIM / 'src'}",),
        sanitize=False,
    )
    out = _tool_output(str(program), *(str(int(code)) for code in ErrorCode))
    lines = dict(line.rsplit(" ", 1) for line in out.splitlines())
    for code, expected in ERROR_TABLE.items():
        assert int(lines[f"npud {int(code)}"], 16) == expected, code
    # libcdsprpc's errno table, for what the library meets itself
    assert int(lines["errno 32"], 16) == ECONNRESET  # EPIPE
    assert int(lines["errno 111"], 16) == 0x72  # ECONNREFUSED
    assert int(lines["errno 2"], 16) == 0x72  # ENOENT: no socket, npud not running
    assert int(lines["errno 12"], 16) == 0x02  # ENOMEM
    assert int(lines["errno 110"], 16) == 0x0C  # ETIMEDOUT
    assert int(lines["errno 16"], 16) == ERPC  # EBUSY
    # domains: the CDSP's default session is ours, other valid ids are not
    assert [int(lines[f"domain {d}"], 16) for d in (-1, 3, 0, 11, 32)] == [
        0, 0, 0x14, 0x14, BADPARM,
    ]  # fmt: skip


@pytest.mark.parametrize("flag", ["-Wall", "-Wextra", "-Werror"])
def test_built_with_warnings_as_errors(flag: str) -> None:
    assert flag in (SHIM / "Makefile").read_text()
