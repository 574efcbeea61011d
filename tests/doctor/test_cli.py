"""`npud doctor` on the command line: the report's lines, --json, exit status, and this
machine (no NPU: it says so, and that npud runs on the emulator)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from npud.ops.config import Config
from npud.ops.doctor import main
from npud.ops.doctor_checks import Target, npu_present
from tests.doctor.fake_tree import FakeTree, healthy_tree
from tests.e2e.daemon import Npud, start_npud

STATUSES = ("OK   ", "WARN ", "FAIL ", "SKIP ")
THIS_MACHINE_HAS_AN_NPU = npu_present(Target(root=Path("/"), config=Config(), socket=""))


def run_doctor(*args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("NPUD_SOCKET", "QAIRT_ROOT")}
    return subprocess.run(
        [sys.executable, "-m", "npud.daemon.main", "doctor", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env=env,
    )


@pytest.fixture
def tree(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> FakeTree:
    monkeypatch.delenv("NPUD_SOCKET", raising=False)
    monkeypatch.delenv("QAIRT_ROOT", raising=False)
    return healthy_tree(tmp_path / "root")


@pytest.fixture
def npud(tmp_path: Path) -> Iterator[Npud]:
    home = tmp_path / "npud"
    home.mkdir()
    daemon = start_npud(home)
    try:
        yield daemon
    finally:
        assert daemon.stop() == 0


def test_text_report(tree: FakeTree, capsys: pytest.CaptureFixture[str]) -> None:
    tree.write("/sys/class/remoteproc/remoteproc1/power/control", "auto\n")
    assert main(["--root", str(tree.root)]) == 1
    lines = capsys.readouterr().out.splitlines()
    *checks, summary = lines
    assert all(line.startswith(STATUSES) for line in checks), lines
    runtime_pm = next(line for line in checks if "CDSP runtime PM" in line)
    assert runtime_pm.startswith(
        'FAIL CDSP runtime PM: remoteproc1 (cdsp): power/control is "auto"'
    )
    assert " — fix: echo on | sudo tee " in runtime_pm
    assert all(" — fix: " not in line for line in checks if line.startswith("OK"))
    assert summary == (
        "summary: 9 OK, 0 WARN, 2 FAIL, 0 SKIP: "
        "the NPU is not usable until the FAIL lines are fixed."
    )


def test_json_report(tree: FakeTree, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--root", str(tree.root), "--json"]) == 1  # no daemon
    report = json.loads(capsys.readouterr().out)
    assert set(report) == {"verdict", "npu_present", "uses", "exit_status", "summary", "checks"}
    assert report["verdict"] == "the NPU is not usable until the FAIL lines are fixed."
    assert (report["npu_present"], report["uses"], report["exit_status"]) == (True, "kernel", 1)
    assert report["summary"] == {"OK": 10, "WARN": 0, "FAIL": 1, "SKIP": 0}
    findings = report["checks"]
    assert all(set(f) == {"check", "status", "detail", "fix"} for f in findings)
    by_check = {f["check"]: f for f in findings}
    assert by_check["CDSP firmware"]["status"] == "OK"
    assert by_check["CDSP firmware"]["fix"] is None
    assert by_check["daemon"]["status"] == "FAIL"
    assert "systemctl enable --now npud.socket" in by_check["daemon"]["fix"]


def test_healthy_tree_exits_zero(tree: FakeTree, npud: Npud) -> None:
    result = run_doctor("--root", str(tree.root), "--socket", str(npud.socket_path))
    assert result.returncode == 0, result.stdout
    assert result.stderr == ""
    assert not any(line.startswith("FAIL") for line in result.stdout.splitlines())
    assert result.stdout.splitlines()[-1].startswith("summary: 11 OK, 1 WARN, 0 FAIL, 0 SKIP")


def test_bad_root_and_bad_options(tmp_path: Path) -> None:
    result = run_doctor("--root", str(tmp_path / "nope"))
    assert result.returncode == 64  # EX_USAGE
    assert result.stderr == f"npud doctor: error: --root {tmp_path / 'nope'} is not a directory\n"
    result = run_doctor("--frobnicate")
    assert result.returncode == 64
    assert result.stderr.splitlines()[-1].startswith("npud doctor: error: unrecognized arguments")


def test_help_and_the_daemon_command_line_still_work() -> None:
    result = run_doctor("--help")
    assert result.returncode == 0
    for needle in ("--root", "--json", "exit status", "emulator"):
        assert needle in result.stdout
    daemon_help = subprocess.run(
        [sys.executable, "-m", "npud.daemon.main", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert "--backend" in daemon_help.stdout
    assert "npud doctor" in daemon_help.stdout


# --- this machine ------------------------------------------------------------------------

needs_no_npu = pytest.mark.skipif(THIS_MACHINE_HAS_AN_NPU, reason="this machine has an NPU")


@needs_no_npu
def test_this_machine_says_no_npu_and_emulator(tmp_path: Path, npud: Npud) -> None:
    config = tmp_path / "empty.toml"
    config.write_text("")
    result = run_doctor("--config", str(config), "--socket", str(npud.socket_path))
    lines = result.stdout.splitlines()
    assert lines[0] == "No NPU on this machine: npud is running on the emulator."
    assert lines[2].startswith("SKIP device nodes: no NPU on this machine")
    assert not any(line.startswith(("FAIL", "WARN")) for line in lines), lines
    daemon = next(line for line in lines if " daemon: " in line)
    assert daemon.startswith("OK   daemon: npud ")
    assert "backend emulator on /dev/fastrpc-cdsp" in daemon
    assert "(emulated)" in daemon
    assert lines[-1] == (
        "summary: 2 OK, 0 WARN, 0 FAIL, 8 SKIP: No NPU on this machine: npud is running on "
        "the emulator. The device checks are skipped."
    )
    assert result.returncode == 0


@needs_no_npu
def test_this_machine_without_the_daemon(tmp_path: Path) -> None:
    config = tmp_path / "empty.toml"
    config.write_text("")
    result = run_doctor("--config", str(config), "--socket", str(tmp_path / "none.sock"), "--json")
    report = json.loads(result.stdout)
    assert report["verdict"] == (
        "No NPU on this machine: npud will use the emulator (backend auto). "
        "Read the WARN lines; the device checks are skipped."
    )
    assert (report["npu_present"], report["uses"], report["exit_status"]) == (
        False,
        "emulator",
        0,
    )
    daemon = report["checks"][-1]
    assert (daemon["check"], daemon["status"]) == ("daemon", "WARN")
    assert "make run" in daemon["fix"]
    assert result.returncode == 0
