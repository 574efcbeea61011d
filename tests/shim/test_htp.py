"""shim/htp: the htp_iface stub libggml-hexagon.so is built with, and the peer script."""

from __future__ import annotations

import subprocess
from pathlib import Path

from tests.shim.programs import C_DIR, INCLUDE, REPO, SHIM, compile_program, need_compiler
from tests.tools import require_tool

HTP = SHIM / "htp"
SCRIPT = REPO / "scripts" / "peer-llama.sh"


def test_the_stub_marshals_as_qaic(tmp_path: Path) -> None:
    """Each htp_iface method's scalars word and primIn/primROut bytes (NOTES section 5)."""
    program = compile_program(
        tmp_path / "htp_stub_test",
        [C_DIR / "htp_stub_test.c", HTP / "htp_iface_stub.c"],
        extra=(f"-I{HTP}",),
    )
    result = subprocess.run([str(program)], capture_output=True, text=True, check=False, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout == "ok htp\n"


def test_the_headers_as_ggml_hexagon_includes_them(tmp_path: Path) -> None:
    """htp-drv.cpp includes domain.h and htp_iface.h after the libcdsprpc headers."""
    need_compiler()
    gxx = require_tool("g++", "g++")
    source = tmp_path / "htp.cc"
    source.write_text(
        "#include <AEEStdErr.h>\n#include <rpcmem.h>\n#include <remote.h>\n"
        '#include <dspqueue.h>\n#include <domain.h>\n#include "htp_iface.h"\n'
        "domain *first() { return &supported_domains[0]; }\n"
        "int info(remote_handle64 h) {\n"
        "    unsigned int threads, hvx, hmx; unsigned long long vtcm;\n"
        "    return htp_iface_hwinfo(h, &threads, &hvx, &hmx, &vtcm) + is_CDSP(3);\n}\n"
    )
    subprocess.run(
        [gxx, "-std=c++17", "-Wall", "-Wextra", "-Werror", f"-I{INCLUDE}", f"-I{HTP}",
         "-fsyntax-only", str(source)],
        check=True, timeout=60,
    )  # fmt: skip


def _script(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", str(SCRIPT), *args],
        env={"PATH": "/usr/bin:/bin", "NPUD_PEER_CACHE": str(tmp_path / "cache")},
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )


def test_peer_script_help_and_steps(tmp_path: Path) -> None:
    helped = _script(tmp_path, "--help")
    assert helped.returncode == 0
    assert helped.stdout.startswith("Usage: peer-llama.sh [STEP...]")
    for step in ("fetch", "cpu", "hexagon", "helpers", "models", "run"):
        assert f"\n  {step} " in helped.stdout
    assert str(tmp_path / "cache") in helped.stdout  # where the cache is
    unknown = _script(tmp_path, "nonsense")
    assert unknown.returncode == 64  # EX_USAGE
    assert "unknown step: nonsense" in unknown.stderr
    assert not (tmp_path / "cache").exists()  # nothing done on bad usage


def test_peer_script_run_needs_the_build(tmp_path: Path) -> None:
    ran = _script(tmp_path, "run")
    assert ran.returncode == 69  # EX_UNAVAILABLE
    assert "the build is not complete: run the other steps first" in ran.stderr


def test_peer_script_steps_need_the_previous_ones(tmp_path: Path) -> None:
    hexagon = _script(tmp_path, "hexagon")
    assert hexagon.returncode == 69
    assert "no CPU build yet" in hexagon.stderr
