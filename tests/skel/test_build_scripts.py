"""The build scripts: strict mode, the host Makefile's outputs, and build_skel.sh against a fake SDK.

The real Hexagon SDK cannot be installed here, so build_skel.sh runs against a
tree laid out like one whose qaic, hexagon-clang and nm are small scripts that
log their arguments and write the files a real tool would. That checks what
the script asks of the SDK: paths, flags, which sources go into which library,
and the outputs, without claiming the cross-compile itself works.
"""

from __future__ import annotations

import os
import shlex
import subprocess
from pathlib import Path
from typing import Final

import pytest

from tests.skel.conftest import REPO, SKEL_DIR, build_host_skels
from tests.tools import require_tool

BUILD_SKEL: Final = REPO / "docker" / "build_skel.sh"


def _shell_scripts() -> list[Path]:
    return sorted([*(REPO / "docker").glob("*.sh"), *SKEL_DIR.glob("**/*.sh")])


def test_shell_scripts_are_strict_and_executable() -> None:
    for script in _shell_scripts():
        text = script.read_text()
        assert text.startswith("#!/usr/bin/env bash\n"), script
        assert "\nset -euo pipefail\n" in text, script
        assert os.access(script, os.X_OK), script


def _tree(root: Path) -> dict[str, int]:
    return {str(p.relative_to(root)): p.stat().st_mtime_ns for p in root.rglob("*")}


def test_host_build_writes_only_to_out_and_clean_removes_it(tmp_path: Path) -> None:
    require_tool("gcc", "gcc")
    require_tool("make", "make")
    before = _tree(SKEL_DIR)
    out = tmp_path / "host"
    built = build_host_skels(out)
    assert built.returncode == 0, built.stdout + built.stderr
    assert "-Werror" in built.stdout
    assert {p.name for p in out.glob("*.so")} == {"libecho_skel.so", "libportal_qnn_skel.so"}
    assert _tree(SKEL_DIR) == before

    build_root = tmp_path / "build-root"
    build_root.mkdir()
    cleaned = subprocess.run(
        ["make", "-C", str(SKEL_DIR), "clean", f"OUT={out}", f"BUILD={build_root}"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert cleaned.returncode == 0, cleaned.stderr
    assert not out.exists()
    assert not build_root.exists()
    assert _tree(SKEL_DIR) == before


# ---- build_skel.sh against a fake SDK --------------------------------------------------------

FAKE_QAIC: Final = """#!/usr/bin/env bash
set -euo pipefail
{ printf qaic; printf ' %q' "$@"; printf '\\n'; } >>"$FAKE_LOG"
out=""
idl=""
while (($#)); do
  case "$1" in
    -o) out="$2"; shift 2 ;;
    -I) shift 2 ;;
    *) idl="$1"; shift ;;
  esac
done
name="$(basename "$idl" .idl)"
for f in "$name.h" "${name}_skel.c" "${name}_stub.c"; do
  printf '/* generated from %s */\\n' "$idl" >"$out/$f"
done
"""

FAKE_CLANG: Final = """#!/usr/bin/env bash
set -euo pipefail
{ printf clang; printf ' %q' "$@"; printf '\\n'; } >>"$FAKE_LOG"
out=""
inputs=()
prev=""
for arg in "$@"; do
  if [[ "$prev" == "-o" ]]; then out="$arg"; fi
  if [[ "$arg" == *.c || "$arg" == *.o ]] && [[ "$prev" != "-o" ]]; then
    [[ -f "$arg" ]] || { echo "no such input: $arg" >&2; exit 1; }
    inputs+=("$(basename "$arg")")
  fi
  prev="$arg"
done
printf '%s\\n' "${inputs[@]}" >"$out"
"""

FAKE_NM: Final = """#!/usr/bin/env bash
set -euo pipefail
lib="${!#}"
name="$(basename "$lib" .so)"
name="${name#lib}"
if [[ -z "${FAKE_NM_HIDE:-}" ]]; then
  printf '00001000 T %s_handle_invoke\\n' "$name"
fi
"""


def _fake_sdk(root: Path, arch: str = "v73", tools: str = "8.7.06") -> Path:
    sdk = root / "Hexagon_SDK"
    for directory in ("incs/stddef", "ipc/fastrpc/incs", f"rtos/qurt/compute{arch}/include/qurt"):
        (sdk / directory).mkdir(parents=True)
    (sdk / f"rtos/qurt/compute{arch}/include/posix").mkdir(parents=True)
    bin_dir = sdk / "tools/HEXAGON_Tools" / tools / "Tools/bin"
    bin_dir.mkdir(parents=True)
    (sdk / "tools/HEXAGON_Tools/8.4.12/Tools/bin").mkdir(parents=True)  # an older one to skip
    qaic_dir = sdk / "ipc/fastrpc/qaic/Ubuntu"
    qaic_dir.mkdir(parents=True)
    for path, text in (
        (qaic_dir / "qaic", FAKE_QAIC),
        (bin_dir / "hexagon-clang", FAKE_CLANG),
        (bin_dir / "hexagon-llvm-nm", FAKE_NM),
    ):
        path.write_text(text)
        path.chmod(0o755)
    return sdk


def _run_build(
    sdk: Path | None, out: Path, log: Path, *args: str, **env: str
) -> subprocess.CompletedProcess[str]:
    environment = {k: v for k, v in os.environ.items() if not k.startswith("HEXAGON_")}
    environment.pop("QAIC", None)
    environment["FAKE_LOG"] = str(log)
    environment.update(env)
    command = [str(BUILD_SKEL), "--out", str(out), *args]
    if sdk is not None:
        command += ["--sdk", str(sdk)]
    return subprocess.run(command, capture_output=True, text=True, env=environment, check=False)


def _logged(log: Path, tool: str) -> list[list[str]]:
    return [shlex.split(line)[1:] for line in log.read_text().splitlines() if line.startswith(tool)]


def test_help() -> None:
    shown = subprocess.run([str(BUILD_SKEL), "--help"], capture_output=True, text=True, check=False)
    assert shown.returncode == 0
    assert shown.stdout.startswith("Usage: build_skel.sh")
    for promise in ("libecho_skel.so", "libportal_qnn_skel.so", "/usr/lib/dsp/cdsp", "qaic"):
        assert promise in shown.stdout


@pytest.mark.parametrize(
    ("args", "status", "message"),
    [
        ((), 69, "no Hexagon SDK"),
        (("--arch", "73"), 64, "--arch must look like v73"),
        (("--frobnicate",), 64, "unknown argument"),
        (("--out",), 64, "--out needs a value"),
    ],
)
def test_usage_errors(tmp_path: Path, args: tuple[str, ...], status: int, message: str) -> None:
    result = _run_build(None, tmp_path / "out", tmp_path / "log", *args)
    assert result.returncode == status  # sysexits: 64 usage, 69 unavailable
    assert message in result.stderr
    assert not (tmp_path / "out").exists()


def test_sdk_layout_errors(tmp_path: Path) -> None:
    not_sdk = tmp_path / "empty"
    not_sdk.mkdir()
    result = _run_build(not_sdk, tmp_path / "out", tmp_path / "log")
    assert (result.returncode, "does not look like a Hexagon SDK root" in result.stderr) == (
        69,
        True,
    )

    sdk = _fake_sdk(tmp_path)
    other_arch = _run_build(sdk, tmp_path / "out", tmp_path / "log", "--arch", "v75")
    assert other_arch.returncode == 69
    assert "no QuRT headers for v75" in other_arch.stderr

    wrong_tools = _run_build(sdk, tmp_path / "out", tmp_path / "log", "--tools-version", "1.0")
    assert wrong_tools.returncode == 69
    assert "hexagon-clang not found" in wrong_tools.stderr


def test_build_against_a_fake_sdk(tmp_path: Path) -> None:
    sdk = _fake_sdk(tmp_path)
    out = tmp_path / "out"
    log = tmp_path / "log"
    result = _run_build(sdk, out, log, HEXAGON_SDK_VERSION="5.5.0.1")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "tools 8.7.06, arch v73" in result.stdout  # the newest toolchain was picked

    # qaic: -mdll, the SDK's IDL includes, one run per interface, output in OUT/qaic.
    assert _logged(log, "qaic") == [
        [
            "-mdll",
            "-I",
            f"{sdk}/incs",
            "-I",
            f"{sdk}/incs/stddef",
            "-o",
            f"{out}/qaic",
            f"{REPO}/idl/{name}.idl",
        ]
        for name in ("echo", "portal_qnn")
    ]

    compiles = [args for args in _logged(log, "clang") if "-c" in args]
    links = [args for args in _logged(log, "clang") if "-shared" in args]
    sources = [Path(args[args.index("-c") + 1]) for args in compiles]
    # The generated marshalling replaces the hand-written one; our implementations go in as is.
    assert [s.name for s in sources] == [
        "echo_skel.c", "echo_imp.c", "skel_handles.c",
        "portal_qnn_skel.c", "portal_qnn_imp.c", "qnn_model.c", "skel_handles.c",
    ]  # fmt: skip
    assert sources[0].parent == out / "qaic"
    assert sources[3].parent == out / "qaic"
    assert all(s.parent == SKEL_DIR for i, s in enumerate(sources) if i not in (0, 3))
    for args in compiles:
        assert {"-mv73", "-G0", "-fPIC", "-fvisibility=hidden"} <= set(args)
        includes = [args[i + 1] for i, a in enumerate(args) if a == "-I"]
        assert includes[:2] == [f"{out}/qaic", f"{SKEL_DIR}/include"]
        assert f"{SKEL_DIR}/include/sdk" not in includes
        assert f"{SKEL_DIR}/include/qaic" not in includes
        assert f"{sdk}/rtos/qurt/computev73/include/posix" in includes
        generated = Path(args[args.index("-c") + 1]).parent == out / "qaic"
        assert ("-Werror" in args) is not generated
        if generated:
            assert '-D__QAIC_SKEL_EXPORT=__attribute__((visibility("default")))' in args

    assert len(links) == 2
    for args, name in zip(links, ("echo", "portal_qnn"), strict=True):
        assert {"-mv73", "-G0", "-fPIC", f"-Wl,-soname,lib{name}_skel.so"} <= set(args)
        assert args[args.index("-o") + 1] == f"{out}/lib{name}_skel.so"
    linked = {
        name: (out / f"lib{name}_skel.so").read_text().split() for name in ("echo", "portal_qnn")
    }
    assert linked == {
        "echo": ["echo_skel_qaic.o", "echo_echo_imp.o", "echo_skel_handles.o"],
        "portal_qnn": [
            "portal_qnn_skel_qaic.o",
            "portal_qnn_portal_qnn_imp.o",
            "portal_qnn_qnn_model.o",
            "portal_qnn_skel_handles.o",
        ],
    }

    sums = (out / "SHA256SUMS").read_text().splitlines()
    assert [line.split()[1] for line in sums] == ["libecho_skel.so", "libportal_qnn_skel.so"]
    assert "/usr/lib/dsp/cdsp" in result.stdout


def test_a_library_without_its_invoke_entry_fails_the_build(tmp_path: Path) -> None:
    sdk = _fake_sdk(tmp_path)
    result = _run_build(sdk, tmp_path / "out", tmp_path / "log", FAKE_NM_HIDE="1")
    assert result.returncode == 1
    assert "does not export echo_skel_handle_invoke" in result.stderr
