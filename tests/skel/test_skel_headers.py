"""Our stand-in SDK headers against the C compiler's view, the ctypes mirror and the Python ABI.

skel/include/sdk/remote.h and AEEStdErr.h are written by hand; this test keeps
them equal to npud.fastrpc.kernel.abi's scalars, npu_protocol.aee's codes (bare on
the host, 0x80000400 + n when built for the DSP) and tests/skel's ctypes
remote_arg.
"""

from __future__ import annotations

import ctypes
import subprocess
from pathlib import Path
from typing import Final

import pytest

from npu_protocol.aee import AEE
from npud.fastrpc.kernel import abi
from tests.skel.conftest import SKEL_DIR
from tests.skel.remote_args import remote_arg, remote_buf, remote_dma_handle
from tests.tools import require_tool

AEE_MACROS: Final = (
    "EFAILED",
    "ENOMEMORY",
    "EALREADYLOADED",
    "EUNABLETOLOAD",
    "EBADSTATE",
    "EBADPARM",
    "EINVALIDFORMAT",
    "EUNSUPPORTED",
    "ERESOURCENOTFOUND",
    "EBUFFERTOOSMALL",
    "EINVHANDLE",
    "EOUTOFHANDLES",
    "ENOSUCHSYMBOL",
    "EBADSIZE",
    "ENOTINITIALIZED",
)

DECODE_MACROS: Final = (
    "METHOD_ATTR",
    "METHOD",
    "INBUFS",
    "OUTBUFS",
    "INHANDLES",
    "OUTHANDLES",
    "LENGTH",
)

SCALARS: Final = (
    (0, 2, 2, 1, 0, 0),
    (7, 31, 255, 255, 15, 15),
    (1, 5, 0, 3, 2, 9),
)


def _program() -> str:
    lines = [
        "#include <stdio.h>",
        "#include <stddef.h>",
        '#include "remote.h"',
        '#include "AEEStdErr.h"',
        "int main(void) {",
        'printf("sizeof remote_arg %zu\\n", sizeof(remote_arg));',
        'printf("sizeof remote_buf %zu\\n", sizeof(remote_buf));',
        'printf("sizeof remote_dma_handle %zu\\n", sizeof(remote_dma_handle));',
        'printf("offset remote_buf.nLen %zu\\n", offsetof(remote_buf, nLen));',
        'printf("offset remote_dma_handle.offset %zu\\n", offsetof(remote_dma_handle, offset));',
    ]
    for name in AEE_MACROS:
        lines.append(f'printf("aee {name} %u\\n", (unsigned)(AEE_{name}));')
    for fields in SCALARS:
        args = ", ".join(map(str, fields))
        word = f"REMOTE_SCALARS_MAKEX({args})"
        lines.append(f'printf("makex {args} %u\\n", (unsigned)({word}));')
        for macro in DECODE_MACROS:
            lines.append(
                f'printf("decode {args} {macro} %u\\n", (unsigned)REMOTE_SCALARS_{macro}({word}));'
            )
    lines += ["return 0;", "}"]
    return "\n".join(lines)


def _compile_and_run(tmp_path: Path, *defines: str) -> dict[str, str]:
    """Build and run the probe program; its lines become {"key words": "value"}."""
    require_tool("gcc", "gcc")
    source = tmp_path / "headers.c"
    source.write_text(_program())
    binary = tmp_path / "headers"
    subprocess.run(
        [
            "gcc",
            "-std=c11",
            "-Wall",
            "-Wextra",
            "-Werror",
            *defines,
            f"-I{SKEL_DIR / 'include' / 'sdk'}",
            "-o",
            str(binary),
            str(source),
        ],
        check=True,
        capture_output=True,
    )
    output = subprocess.run([str(binary)], check=True, capture_output=True, text=True).stdout
    values: dict[str, str] = {}
    for line in output.splitlines():
        key, _, value = line.rpartition(" ")
        values[key] = value
    return values


@pytest.fixture(scope="module")
def host_view(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    return _compile_and_run(tmp_path_factory.mktemp("headers-host"))


@pytest.fixture(scope="module")
def hexagon_view(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    # Only the preprocessor branch matters: gcc compiles for the host with __hexagon__ defined.
    return _compile_and_run(tmp_path_factory.mktemp("headers-hexagon"), "-D__hexagon__")


def test_remote_arg_layout_matches_ctypes(host_view: dict[str, str]) -> None:
    seen = host_view
    assert int(seen["sizeof remote_arg"]) == ctypes.sizeof(remote_arg)
    assert int(seen["sizeof remote_buf"]) == ctypes.sizeof(remote_buf)
    assert int(seen["sizeof remote_dma_handle"]) == ctypes.sizeof(remote_dma_handle)
    assert int(seen["offset remote_buf.nLen"]) == remote_buf.nLen.offset
    assert int(seen["offset remote_dma_handle.offset"]) == remote_dma_handle.offset.offset


def test_scalars_macros_match_the_python_abi(host_view: dict[str, str]) -> None:
    seen = host_view
    decoders = dict(
        zip(
            DECODE_MACROS,
            (
                abi.remote_scalars_attr,
                abi.remote_scalars_method,
                abi.remote_scalars_inbufs,
                abi.remote_scalars_outbufs,
                abi.remote_scalars_inhandles,
                abi.remote_scalars_outhandles,
                abi.remote_scalars_length,
            ),
            strict=True,
        )
    )
    for fields in SCALARS:
        args = ", ".join(map(str, fields))
        word = abi.remote_scalars_makex(*fields)
        assert int(seen[f"makex {args}"]) == word
        for macro, decode in decoders.items():
            assert int(seen[f"decode {args} {macro}"]) == decode(word), (fields, macro)


def test_aee_codes_are_bare_on_the_host(host_view: dict[str, str]) -> None:
    for name in AEE_MACROS:
        assert int(host_view[f"aee {name}"]) == AEE[name], name


def test_aee_codes_carry_the_dsp_offset_on_hexagon(hexagon_view: dict[str, str]) -> None:
    for name in AEE_MACROS:
        assert int(hexagon_view[f"aee {name}"]) == AEE[name].dsp, name
