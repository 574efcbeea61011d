"""shim/htp: the htp_iface stub libggml-hexagon.so is built with, and the peer script."""

from __future__ import annotations

import importlib.util
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
    for step in ("fetch", "cpu", "hexagon", "helpers", "models", "llm", "run"):
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
    llm = _script(tmp_path, "llm")
    assert llm.returncode == 69
    assert "llm: no CPU build yet: run the cpu step" in llm.stderr


FAKE_CMAKE = """#!/bin/bash
# cmake -S SRC -B BUILD ...: configure; cmake --build BUILD ...: three coloured steps.
if [[ $1 == --build ]]; then
    for i in 1 2 3; do
        printf '\\033[32m[%d/3] Building CXX object step%d.o\\033[0m\\n' "$i" "$i"
        sleep 1.2
    done
    echo "an error: the end of the log"
    exit "${FAKE_STATUS:-0}"
fi
mkdir -p "$4" && touch "$4/CMakeCache.txt" && echo configured
"""


def _fake_build(tmp_path: Path, status: int) -> subprocess.CompletedProcess[str]:
    stubs = tmp_path / "stubs"
    stubs.mkdir()
    cmake = stubs / "cmake"
    cmake.write_text(FAKE_CMAKE)
    cmake.chmod(0o755)
    return subprocess.run(
        ["bash", str(SCRIPT), "cpu"],
        env={
            "PATH": f"{stubs}:/usr/bin:/bin",
            "NPUD_PEER_CACHE": str(tmp_path / "cache"),
            "NPUD_PEER_HEARTBEAT": "1",
            "FAKE_STATUS": str(status),
        },
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )


def test_peer_script_says_its_log_first_and_shows_progress_without_colours(
    tmp_path: Path,
) -> None:
    """`make peer-llama` printed nothing for the ~15 minutes of the build, named its log
    only at the end, and carried raw colour codes."""
    require_tool("g++", "g++")
    built = _fake_build(tmp_path, 0)
    assert built.returncode == 0, built.stderr
    lines = built.stderr.splitlines()
    log = tmp_path / "cache" / "cpu-build.log"
    named = lines.index(f"peer-llama.sh: cpu: log: {log}")
    beats = [i for i, line in enumerate(lines) if "cpu: still running after" in line]
    assert beats, built.stderr
    assert named < beats[0]
    assert any(", at [" in lines[i] and "/3]" in lines[i] for i in beats), built.stderr
    assert lines[0].startswith("peer-llama.sh: steps: cpu; cache: ")
    assert lines[1] == "peer-llama.sh: step 1/1: cpu"
    assert lines[-2].startswith("peer-llama.sh: cpu: done in ")
    assert "\x1b" not in built.stderr + built.stdout


def test_peer_script_a_failed_build_shows_the_end_of_its_log(tmp_path: Path) -> None:
    require_tool("g++", "g++")
    failed = _fake_build(tmp_path, 2)
    assert failed.returncode == 1
    log = tmp_path / "cache" / "cpu-build.log"
    assert "an error: the end of the log" in failed.stderr
    assert "[3/3] Building CXX object step3.o" in failed.stderr
    assert failed.stderr.rstrip().endswith(f"the CPU build failed: see {log}")
    assert "\x1b" not in failed.stderr


def test_the_peer_checks_print_test_llama_archs_rows_without_colours() -> None:
    """test-llama-archs colours its OK whatever its stdout is; the run step's lines are
    plain text (they reached CI's log as ESC[1;32mOK ESC[0m)."""
    spec = importlib.util.spec_from_file_location("check_llama", SHIM / "peer" / "check_llama.py")
    assert spec is not None
    assert spec.loader is not None
    check_llama = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(check_llama)
    row = "|           llama|Hexagon| Dense|  \x1b[1;32mOK\x1b[0m (1.03e-13)|       \x1b[1;32mOK\x1b[0m|"
    assert check_llama.plain(row) == "|           llama|Hexagon| Dense|  OK (1.03e-13)|       OK|"


def test_docs_llm_names_where_the_peer_build_puts_things() -> None:
    """docs/llm.md's table and command name the cache's paths as the script makes them."""
    doc = (REPO / "docs" / "llm.md").read_text()
    script = SCRIPT.read_text()
    for path, variable in (
        ("build-cpu/bin", "BIN"),
        ("shim", "SHIM_BUILD"),
        ("models", "MODELS"),
        ("helpers", "HELPERS"),
    ):
        assert f"| `{path}/` |" in doc, path
        assert f"readonly {variable}=$CACHE/{path}\n" in script or (
            variable == "BIN" and "readonly CPU_BUILD=$CACHE/build-cpu\n" in script
        ), variable
    assert "~/.cache/npud-peer" in doc
    assert "CACHE=${NPUD_PEER_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/npud-peer}" in script
    command = doc.split("### Running llama.cpp by hand", 1)[1]
    for needed in (
        "LD_LIBRARY_PATH=$CACHE/shim",
        "$CACHE/build-cpu/bin/llama-simple",
        "$CACHE/models/tiny-llama-q4_0.gguf",
        "GGML_HEXAGON_MBUF=256",
        "NPUD_SOCKET=",
    ):
        assert needed in command, needed
