"""scripts/hw_bringup.sh: its help, its refusals, and a full rehearsal on the emulator."""

from __future__ import annotations

import subprocess
import sys
import tarfile
from pathlib import Path

from npud.fastrpc.recording.replay import load_trace
from tests.emulator import onnx_models
from tests.scripts.snapshots import REPO
from tests.shim.programs import make_library

SCRIPT = REPO / "scripts" / "hw_bringup.sh"


def run(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", str(SCRIPT), "--python", sys.executable, *args],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        cwd=cwd,
    )


def command_lines() -> list[str]:
    lines = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                lines.append((entry / "cmdline").read_bytes().replace(b"\0", b" ").decode())
            except OSError:
                continue  # gone meanwhile
    return lines


def test_help_names_every_step_and_option() -> None:
    result = run("--help")
    assert result.returncode == 0
    for word in ("doctor", "pytest -m hardware", "--scenario echo", "npuctl selftest",
                 "--model FILE", "--backend KIND", "--skip-tests", "tar.gz",
                 "--scenario fidelity", "UNSIGNED_PD_SUPPORT", "--suspend",
                 "rtcwake", "library", "17 and 18", "128-131", "300 MiB", "mbuf",
                 "GGML_HEXAGON_MBUF", "NPUD_SHIM_BARRIERS=inner", "dmb sy",
                 "--dspq-rounds"):  # fmt: skip
        assert word in result.stdout, word


def test_bad_command_lines_are_refused(tmp_path: Path) -> None:
    assert run("--frobnicate").returncode == 64
    wrong = run("--backend", "gpu")
    assert (wrong.returncode, "kernel or emulator" in wrong.stderr) == (64, True)
    empty = run("--out")
    assert (empty.returncode, "--out needs a value" in empty.stderr) == (64, True)
    missing = run("--model", str(tmp_path / "none.bin"))
    assert (missing.returncode, "not a readable file" in missing.stderr) == (66, True)
    rounds = run("--dspq-rounds", "0")
    assert (rounds.returncode, "--dspq-rounds is a count" in rounds.stderr) == (64, True)
    alone = run("--llama-bin", str(tmp_path))
    assert (alone.returncode, "go together" in alone.stderr) == (64, True)
    (tmp_path / "model.gguf").write_bytes(b"GGUF")
    no_llama = run("--llama-bin", str(tmp_path), "--gguf", str(tmp_path / "model.gguf"))
    assert (no_llama.returncode, "no llama-simple" in no_llama.stderr) == (66, True)
    (tmp_path / "taken").mkdir()
    taken = run("--out", str(tmp_path / "taken"))
    assert (taken.returncode, "exists" in taken.stderr) == (73, True)


def test_a_rehearsal_on_the_emulator_packs_every_step(tmp_path: Path) -> None:
    model = tmp_path / "add_one.onnx"
    model.write_bytes(onnx_models.add_one())
    out = tmp_path / "bringup"
    shim = make_library(tmp_path / "shim")
    result = run(
        "--backend", "emulator", "--out", str(out), "--skip-tests", "--model", str(model),
        "--suspend", "--shim", str(shim),
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    summary = (out / "summary.txt").read_text()
    for name in ("system", "doctor", "echo", "fidelity", "model", "daemon", "suspend", "library"):
        assert any(line.split()[:2] == [name, "ok"] for line in summary.splitlines()), summary
    assert "tests    skipped --skip-tests" in summary
    assert "llama    skipped no --llama-bin and --gguf" in summary  # run by make peer-llama
    assert "dspqueue skipped no --llama-bin and --gguf" in summary
    # Issue 29: the library's answers to what only the device decides, one line each.
    library = (out / "library.txt").read_text()
    for line in ("ANSWER fastrpc_mmap FD (2): 0 (ok), munmap 0 (ok)",
                 "ANSWER fastrpc_mmap FD_EXTENDED (17): ",
                 "ANSWER fastrpc_mmap FD_DELAYED_EXTENDED (18): ",
                 "ANSWER capability 1: library 1", "ANSWER capability 131: library ",
                 "ANSWER rpcmem 300 MiB: "):  # fmt: skip
        assert line in library, library
    with tarfile.open(f"{out}.tar.gz") as packed:
        names = {Path(member).name for member in packed.getnames()}
    assert {"summary.txt", "system.txt", "doctor.json", "echo.jsonl", "model.jsonl",
            "daemon.jsonl", "daemon.log", "status.json", "fidelity.jsonl",
            "suspend.jsonl"} <= names  # fmt: skip
    for trace in ("echo", "fidelity", "model", "daemon", "suspend"):
        assert load_trace(out / f"{trace}.jsonl").complete, trace
    # What only the device can settle is in fidelity.txt, line by line.
    fidelity = (out / "fidelity.txt").read_text()
    for line in ("UNSIGNED_PD_SUPPORT: 1", "listener: adsp_listener1", "remotectl: remotectl1",
                 "static handle 9 (no module): 0x8000043E",
                 "reverse: apps_std fopen_with_env libecho_skel.so -> 0"):  # fmt: skip
        assert line in fidelity, fidelity
    suspended = (out / "suspend.txt").read_text()
    assert ", 0 failed," in suspended
    assert "load after the suspend: ok in " in suspended
    assert "interrupted contexts: 0" in suspended  # the emulator's run has no suspend
    assert "selftest passed" in (out / "daemon.txt").read_text()
    assert "no divergence" in (out / "daemon.txt").read_text()
    # The daemons it started are gone.
    assert not [
        cmd for cmd in command_lines() if str(out / "npud") in cmd and "npud.daemon.main" in cmd
    ]
    assert not (out / "npud.sock").exists()
    assert not (out / "npud-library.sock").exists()


def test_the_library_checks_refuse_bad_command_lines(tmp_path: Path) -> None:
    checks = REPO / "scripts" / "hw_checks.py"

    def checked(*args: str) -> subprocess.CompletedProcess[str]:
        command = [sys.executable, str(checks), *args]
        return subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)

    assert checked("frobnicate", "--library", "x").returncode == 64
    assert checked("maps").returncode == 64  # --library is required
    assert checked("rpcmem", "--library", "x", "--mib", "0").returncode == 64
    missing = checked("maps", "--library", str(tmp_path / "libnone.so"))
    assert missing.returncode == 69
    assert "libnone.so" in missing.stderr
