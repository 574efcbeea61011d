"""npud doctor against fake trees: a healthy laptop passes, and each broken thing is named
with its fix while everything else still passes."""

from __future__ import annotations

import lzma
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

import npu_protocol as p
from npud.fastrpc.trust.shell import DEVELOPMENT_PUBLIC_KEY_HEX
from npud.ops.doctor_checks import KNOWN_GOOD_FIRMWARE, Status, check_unsigned_pd, connect_fix
from npud.ops.sign_shell import sign_shell_file
from tests.doctor.fake_tree import (
    CDSP,
    CONFIG,
    FIRMWARE_NAME,
    NODES,
    OTHER_UID,
    PUBLIC_KEY,
    QAIRT_LIB,
    SHELL,
    SHELL_BYTES,
    SKEL,
    FakeTree,
    healthy_tree,
    not_ok,
    only,
)
from tests.e2e.daemon import Npud, start_npud
from tests.tools import require_tool

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="chown to another uid needs root")


@pytest.fixture
def tree(tmp_path: Path) -> FakeTree:
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


# --- the healthy laptop -------------------------------------------------------------------


def test_healthy_tree_passes_with_a_running_daemon(tree: FakeTree, npud: Npud) -> None:
    report = tree.diagnose(socket=npud.socket_path)
    assert report.npu_present
    assert report.headline == ""
    assert not_ok(report) == {}
    checks = [f.check for f in report.findings]
    assert checks == [
        "config",
        *(f"device node {tree.path(node)}" for node in NODES),
        "CDSP remoteproc",
        "CDSP firmware",
        "CDSP runtime PM",
        "shell signing key",
        "DSP shell",
        "QAIRT runtime",
        "DSP libraries",
        "daemon",
        "unsigned PD",
    ]
    assert "remoteproc1 (cdsp): running" in only(report, "CDSP remoteproc").detail
    assert f"{KNOWN_GOOD_FIRMWARE} (known good)" in only(report, "CDSP firmware").detail
    assert "power/control is on" in only(report, "CDSP runtime PM").detail
    assert "digest and signature valid" in only(report, "DSP shell").detail
    node = only(report, f"device node {tree.path(NODES[1])}")
    assert "fastrpc 0660: the npud service can open it" in node.detail

    # The daemon answers with its status. This one really is the emulator, on a
    # machine whose (fake) tree has an NPU: doctor says that is wrong, but it is
    # a warning, so the report still passes.
    daemon = only(report, "daemon")
    assert daemon.status is Status.WARN
    for needle in ("backend emulator", "epoch 1", "0 DSP restart(s)", "0 other client(s)"):
        assert needle in daemon.detail
    assert "shell verified (sha256 " in daemon.detail
    assert "although this machine has an NPU" in daemon.detail
    assert "systemctl restart npud" in daemon.fix
    assert report.exit_status == 0
    assert report.summary().endswith("the NPU is usable; read the WARN lines.")


def test_daemon_on_the_emulator_by_choice_is_ok(tree: FakeTree, npud: Npud) -> None:
    tree.write_config("[backend]\nkind = 'emulator'\n")
    report = tree.diagnose(socket=npud.socket_path)
    assert only(report, "daemon").status is Status.OK
    config = only(report, "config")
    assert config.status is Status.WARN
    assert "npud does not use this machine's NPU" in config.detail
    assert 'kind = "auto"' in config.fix


def test_daemon_not_running(tree: FakeTree) -> None:
    report = tree.diagnose()  # daemon.socket under the tree: nothing listens there
    daemon = only(report, "daemon")
    assert daemon.status is Status.FAIL
    assert f"cannot connect to npud at {tree.path('/run/npud/npud.sock')}" in daemon.detail
    assert "systemctl enable --now npud.socket" in daemon.fix
    assert not_ok(report) == {}
    assert report.exit_status == 1


def test_daemon_socket_from_the_environment(tree: FakeTree, tmp_path: Path) -> None:
    report = tree.diagnose(NPUD_SOCKET=str(tmp_path / "elsewhere.sock"))
    assert str(tmp_path / "elsewhere.sock") in only(report, "daemon").detail


def test_connect_fix_for_each_cause() -> None:
    assert "usermod -aG npu" in connect_fix(PermissionError(13, "Permission denied"))
    assert "enable --now npud.socket" in connect_fix(ConnectionRefusedError(111, "refused"))
    assert "journalctl -u npud" in connect_fix(TimeoutError())
    assert "journalctl -u npud" in connect_fix(None)


def test_a_renamed_key_is_a_warning_that_names_the_new_key(tree: FakeTree) -> None:
    tree.write(CONFIG, "[backend]\nkind = 'emulator'\n[pool]\nidle_seconds = 5.0\n")
    config = only(tree.diagnose(), "config")
    assert config.status is Status.WARN
    assert "pool.idle_seconds is now pool.idle_s" in config.detail
    assert "new names" in config.fix


def test_config_error_is_named_and_the_rest_still_runs(tree: FakeTree) -> None:
    tree.write(CONFIG, "[backend]\nkindd = 'auto'\n")
    report = tree.diagnose()
    config = only(report, "config")
    assert config.status is Status.FAIL
    assert "unknown key backend.kindd (did you mean kind?)" in config.detail
    assert "config/npud.toml" in config.fix
    # The defaults stand in: every other check still runs.
    assert len(report.findings) == 11
    assert only(report, "CDSP firmware").status is Status.OK


# --- device nodes ---------------------------------------------------------------------------


def test_missing_node_while_the_other_works(tree: FakeTree) -> None:
    tree.path(NODES[0]).unlink()
    report = tree.diagnose()
    finding = only(report, f"device node {tree.path(NODES[0])}")
    assert finding.status is Status.WARN
    assert f"npud uses {tree.path(NODES[1])} instead" in finding.detail
    assert "dmesg" in finding.fix
    assert not_ok(report) == {finding.check: Status.WARN}


def test_both_nodes_missing_means_the_dsp_is_down(tree: FakeTree) -> None:
    for node in NODES:
        tree.path(node).unlink()
    report = tree.diagnose()
    for node in NODES:
        finding = only(report, f"device node {tree.path(node)}")
        assert finding.status is Status.FAIL
        assert "the DSP is down" in finding.detail
        assert "CDSP remoteproc" in finding.fix
    assert report.npu_present  # the remoteproc says the machine has one


def test_node_the_service_cannot_open(tree: FakeTree) -> None:
    tree.path(NODES[1]).chmod(0o600)
    report = tree.diagnose()
    finding = only(report, f"device node {tree.path(NODES[1])}")
    assert finding.status is Status.FAIL
    assert "0600: the npud service cannot open it" in finding.detail
    assert "needs group fastrpc with read and write (0660)" in finding.detail
    assert "udevadm trigger" in finding.fix
    assert not_ok(report) == {finding.check: Status.FAIL}


def test_node_group_does_not_exist(tree: FakeTree) -> None:
    tree.write_accounts(fastrpc=False)
    report = tree.diagnose()
    for node in NODES:
        finding = only(report, f"device node {tree.path(node)}")
        assert finding.status is Status.FAIL
        assert "group fastrpc does not exist" in finding.detail
        assert "install.sh" in finding.fix


def test_node_open_to_everyone_is_a_warning(tree: FakeTree) -> None:
    tree.path(NODES[1]).chmod(0o666)
    finding = only(tree.diagnose(), f"device node {tree.path(NODES[1])}")
    assert finding.status is Status.WARN
    assert "every user can open it" in finding.detail
    assert "udev" in finding.fix


def test_node_owned_by_the_npud_user_is_ok(tree: FakeTree) -> None:
    tree.path(NODES[1]).chmod(0o600)
    tree.write("/etc/passwd", f"npud:x:{os.getuid()}:1::/nonexistent:/usr/sbin/nologin\n")
    finding = only(tree.diagnose(), f"device node {tree.path(NODES[1])}")
    assert finding.status is Status.OK


# --- the CDSP remoteproc --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("state", "fix"), [("offline", "echo start | sudo tee"), ("crashed", "the DSP crashed")]
)
def test_remoteproc_not_running(tree: FakeTree, state: str, fix: str) -> None:
    tree.write(f"{CDSP}/state", state + "\n")
    report = tree.diagnose()
    finding = only(report, "CDSP remoteproc")
    assert finding.status is Status.FAIL
    assert f"remoteproc1 (cdsp): state {state}, not running" in finding.detail
    assert fix in finding.fix
    assert str(tree.path(f"{CDSP}/state")) in finding.fix
    assert not_ok(report) == {"CDSP remoteproc": Status.FAIL}


def test_no_cdsp_remoteproc(tree: FakeTree) -> None:
    shutil.rmtree(tree.path(CDSP))
    report = tree.diagnose()
    finding = only(report, "CDSP remoteproc")
    assert finding.status is Status.FAIL
    assert "no remoteproc named cdsp" in finding.detail
    assert "qcom_q6v5_pas" in finding.fix
    assert only(report, "CDSP firmware").status is Status.SKIP
    assert only(report, "CDSP runtime PM").status is Status.SKIP


def test_older_kernels_name_the_remoteproc_after_its_device(tree: FakeTree) -> None:
    tree.write(f"{CDSP}/name", "32300000.remoteproc\n")
    report = tree.diagnose()
    assert not_ok(report) == {}
    assert "remoteproc1 (32300000.remoteproc): running" in only(report, "CDSP remoteproc").detail


def test_runtime_pm_auto(tree: FakeTree) -> None:
    tree.write(f"{CDSP}/power/control", "auto\n")
    report = tree.diagnose()
    finding = only(report, "CDSP runtime PM")
    assert finding.status is Status.FAIL
    assert 'power/control is "auto"' in finding.detail
    assert f"echo on | sudo tee {tree.path(CDSP + '/power/control')}" in finding.fix
    assert "deploy_npu.sh" in finding.fix
    assert not_ok(report) == {"CDSP runtime PM": Status.FAIL}


# --- CDSP firmware --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("version", "why"),
    [
        ("CDSP.HT.2.9.c2-00051-HAMOA-1", "rejects unsigned modules with 0x80000A1A"),
        ("CDSP.HT.2.9.c1-00069-HAMOA-1", "is rejected by TrustZone"),
    ],
)
def test_known_bad_firmware(tree: FakeTree, version: str, why: str) -> None:
    tree.write_firmware(version)
    report = tree.diagnose()
    finding = only(report, "CDSP firmware")
    assert finding.status is Status.FAIL
    assert f"is {version} ({why})" in finding.detail
    assert f"deploy a snapshot with {KNOWN_GOOD_FIRMWARE}" in finding.fix
    assert "reboot" in finding.fix
    assert not_ok(report) == {"CDSP firmware": Status.FAIL}


def test_unknown_firmware_version_is_a_warning(tree: FakeTree) -> None:
    tree.write_firmware("CDSP.HT.2.9.c1-00050-HAMOA-1")
    report = tree.diagnose()
    finding = only(report, "CDSP firmware")
    assert finding.status is Status.WARN
    assert "CDSP.HT.2.9.c1-00050-HAMOA-1 (not a version npud has been checked with" in (
        finding.detail
    )
    assert KNOWN_GOOD_FIRMWARE in finding.fix


def test_firmware_without_a_version_string(tree: FakeTree) -> None:
    tree.write_firmware(None)
    finding = only(tree.diagnose(), "CDSP firmware")
    assert finding.status is Status.WARN
    assert "has no QC_IMAGE_VERSION_STRING" in finding.detail
    assert "snapshot" in finding.fix


def test_firmware_image_missing(tree: FakeTree) -> None:
    tree.path(f"/usr/lib/firmware/{FIRMWARE_NAME}").unlink()
    finding = only(tree.diagnose(), "CDSP firmware")
    assert finding.status is Status.FAIL
    assert f"{FIRMWARE_NAME} is not under" in finding.detail
    assert "deploy_npu.sh" in finding.fix


def test_firmware_under_lib_firmware(tree: FakeTree) -> None:
    tree.path(f"/usr/lib/firmware/{FIRMWARE_NAME}").unlink()
    image = tree.write_firmware(KNOWN_GOOD_FIRMWARE, base="/lib/firmware")
    finding = only(tree.diagnose(), "CDSP firmware")
    assert finding.status is Status.OK
    assert str(image) in finding.detail


def test_firmware_updates_directory_wins_as_in_the_kernel(tree: FakeTree) -> None:
    tree.write_firmware("CDSP.HT.2.9.c2-00051-HAMOA-1")
    tree.write("/proc/sys/kernel/osrelease", "6.12.0-test\n")
    image = tree.write_firmware(KNOWN_GOOD_FIRMWARE, base="/lib/firmware/updates/6.12.0-test")
    finding = only(tree.diagnose(), "CDSP firmware")
    assert finding.status is Status.OK
    assert str(image) in finding.detail


def test_xz_compressed_firmware(tree: FakeTree) -> None:
    plain = tree.path(f"/usr/lib/firmware/{FIRMWARE_NAME}")
    packed = plain.with_name(plain.name + ".xz")
    packed.write_bytes(lzma.compress(plain.read_bytes()))
    plain.unlink()
    finding = only(tree.diagnose(), "CDSP firmware")
    assert finding.status is Status.OK
    assert f"{packed} is {KNOWN_GOOD_FIRMWARE}" in finding.detail


def test_zstd_compressed_firmware(tree: FakeTree) -> None:
    zstd = require_tool("zstd", "zstd")
    plain = tree.path(f"/usr/lib/firmware/{FIRMWARE_NAME}")
    subprocess.run([zstd, "-q", "--rm", str(plain)], check=True)
    finding = only(tree.diagnose(), "CDSP firmware")
    assert finding.status is Status.OK
    assert f"{plain}.zst is {KNOWN_GOOD_FIRMWARE}" in finding.detail


def test_corrupt_xz_firmware(tree: FakeTree) -> None:
    plain = tree.path(f"/usr/lib/firmware/{FIRMWARE_NAME}")
    plain.with_name(plain.name + ".xz").write_bytes(b"\xfd7zXZ\x00 not really")
    plain.unlink()
    finding = only(tree.diagnose(), "CDSP firmware")
    assert finding.status is Status.WARN
    assert "cannot read" in finding.detail
    assert "deploy_npu.sh" in finding.fix


# --- shell, key, libraries ------------------------------------------------------------------


def test_shell_missing(tree: FakeTree) -> None:
    tree.path(SHELL).unlink()
    report = tree.diagnose()
    finding = only(report, "DSP shell")
    assert finding.status is Status.FAIL
    assert f"shell {tree.path(SHELL)} does not exist" in finding.detail
    assert "install.sh --signing-dir" in finding.fix
    assert not_ok(report) == {"DSP shell": Status.FAIL}


def test_tampered_shell(tree: FakeTree) -> None:
    shell = tree.path(SHELL)
    data = bytearray(shell.read_bytes())
    data[100] ^= 0x01
    shell.write_bytes(bytes(data))
    finding = only(tree.diagnose(), "DSP shell")
    assert finding.status is Status.FAIL
    assert f"{shell} does not match {shell}.sha256" in finding.detail
    assert "npud-sign-shell sign" in finding.fix


def test_shell_signed_by_another_key(tree: FakeTree) -> None:
    tree.signing_key = Ed25519PrivateKey.generate()
    tree.write_shell()  # re-signed, but the installed public key is the old one
    finding = only(tree.diagnose(), "DSP shell")
    assert finding.status is Status.FAIL
    assert "is not a valid signature" in finding.detail


def test_writable_digest(tree: FakeTree) -> None:
    digest = tree.path(SHELL + ".sha256")
    digest.chmod(0o664)
    finding = only(tree.diagnose(), "DSP shell")
    assert finding.status is Status.FAIL
    assert f"digest file {digest} is writable by group (mode 0664)" in finding.detail
    assert finding.fix == f"chmod go-w {digest}"


def test_files_owned_by_an_untrusted_user(tree: FakeTree) -> None:
    tree.write(CONFIG, f"[shell]\ntrusted_uids = [{OTHER_UID}]\n")
    report = tree.diagnose()
    key = only(report, "shell signing key")
    assert key.status is Status.FAIL
    assert f"owned by uid {os.getuid()}, not by a trusted uid ({OTHER_UID})" in key.detail
    assert key.fix == "chown it to a trusted uid"
    assert only(report, "DSP shell").status is Status.SKIP


@needs_root
def test_shell_owned_by_another_user(tree: FakeTree) -> None:
    tree.write(CONFIG, "[shell]\ntrusted_uids = [0]\n")
    os.chown(tree.path(SHELL), OTHER_UID, -1)
    report = tree.diagnose()
    finding = only(report, "DSP shell")
    assert finding.status is Status.FAIL
    assert f"owned by uid {OTHER_UID}, not by root" in finding.detail
    assert finding.fix == f"chown root: {tree.path(SHELL)}"
    assert not_ok(report) == {"DSP shell": Status.FAIL}


def test_development_key_is_refused(tree: FakeTree) -> None:
    tree.write_public_key(DEVELOPMENT_PUBLIC_KEY_HEX)
    report = tree.diagnose()
    key = only(report, "shell signing key")
    assert key.status is Status.FAIL
    assert "is the development key" in key.detail
    assert "npud-sign-shell genkey" in key.fix
    assert only(report, "DSP shell").status is Status.SKIP
    assert not_ok(report) == {"shell signing key": Status.FAIL, "DSP shell": Status.SKIP}


def test_public_key_missing(tree: FakeTree) -> None:
    tree.path(PUBLIC_KEY).unlink()
    key = only(tree.diagnose(), "shell signing key")
    assert key.status is Status.FAIL
    assert str(tree.path(PUBLIC_KEY)) in key.detail
    assert "install your key's public half" in key.fix


def test_configured_paths_are_under_the_root(tree: FakeTree) -> None:
    tree.path(SHELL).unlink()
    shell = tree.write("/srv/dsp/my_shell", SHELL_BYTES)
    sign_shell_file(shell, tree.signing_key)
    tree.write_config("path = '/srv/dsp/my_shell'\n")  # continues the [shell] table
    finding = only(tree.diagnose(), "DSP shell")
    assert finding.status is Status.OK
    assert finding.detail.startswith(f"{shell}: ")


def test_qairt_libraries_missing(tree: FakeTree) -> None:
    tree.path(f"{QAIRT_LIB}/libQnnSystem.so").unlink()
    report = tree.diagnose()
    finding = only(report, "QAIRT runtime")
    assert finding.status is Status.FAIL
    assert f"{tree.path(QAIRT_LIB)} lacks libQnnSystem.so" in finding.detail
    assert "deploy_npu.sh" in finding.fix
    assert "QAIRT_ROOT" in finding.fix
    assert not_ok(report) == {"QAIRT runtime": Status.FAIL}


def test_qairt_root_from_the_environment(tree: FakeTree) -> None:
    tree.path("/opt/qcom").rename(tree.path("/opt/qairt-sdk"))
    assert only(tree.diagnose(), "QAIRT runtime").status is Status.FAIL
    finding = only(tree.diagnose(QAIRT_ROOT="/opt/qairt-sdk/qairt/2.44"), "QAIRT runtime")
    assert finding.status is Status.OK


def test_dsp_skel_missing(tree: FakeTree) -> None:
    tree.path(SKEL).unlink()
    report = tree.diagnose()
    finding = only(report, "DSP libraries")
    assert finding.status is Status.FAIL
    assert "libQnnHtpV73Skel.so is in none of" in finding.detail
    assert str(tree.path("/usr/lib/dsp/cdsp")) in finding.detail
    assert "deploy_npu.sh" in finding.fix
    assert not_ok(report) == {"DSP libraries": Status.FAIL}


def test_dsp_skel_found_through_the_configured_library_path(tree: FakeTree) -> None:
    tree.path(SKEL).unlink()
    tree.write("/usr/lib/rfsa/adsp/libQnnHtpV73Skel.so", b"\x7fELF skel")
    finding = only(tree.diagnose(), "DSP libraries")
    assert finding.status is Status.OK
    assert str(tree.path("/usr/lib/rfsa/adsp/libQnnHtpV73Skel.so")) == finding.detail


# --- no NPU ---------------------------------------------------------------------------------


def test_tree_without_an_npu(tmp_path: Path) -> None:
    tree = FakeTree(tmp_path)
    report = tree.diagnose()
    assert not report.npu_present
    assert report.uses == "emulator"
    assert report.headline == ("No NPU on this machine: npud will use the emulator (backend auto).")
    nodes = only(report, "device nodes")
    assert nodes.status is Status.SKIP
    assert nodes.detail.startswith("no NPU on this machine")
    assert nodes.fix == ""
    skipped = [f.check for f in report.findings if f.status is Status.SKIP]
    assert skipped == [
        "device nodes",
        "CDSP remoteproc",
        "CDSP firmware",
        "CDSP runtime PM",
        "shell signing key",
        "DSP shell",
        "QAIRT runtime",
        "DSP libraries",
    ]
    # No daemon answers in the fake tree: worth a WARN, not a FAIL, without an NPU.
    assert only(report, "daemon").status is Status.WARN
    assert report.exit_status == 0
    assert "No NPU on this machine" in report.summary()


def test_no_npu_and_the_kernel_backend(tmp_path: Path) -> None:
    tree = FakeTree(tmp_path)
    tree.write(CONFIG, "[backend]\nkind = 'kernel'\n")
    report = tree.diagnose()
    config = only(report, "config")
    assert config.status is Status.FAIL
    assert "npud refuses to start" in config.detail
    assert "npud will not start" in report.headline
    assert report.uses == "none"
    assert report.exit_status == 1
    assert report.verdict.endswith("Fix the FAIL lines.")


def _status_with(dsp: p.DspCapabilities) -> p.DaemonStatus:
    return p.DaemonStatus(
        daemon_version="0.1.0",
        uptime_ms=5,
        backend="kernel",
        device="/dev/fastrpc-cdsp-secure",
        dsp=dsp,
        shell=p.ShellStatus(verified=True, sha256="ab" * 32),
        epoch=1,
    )


def test_an_unsigned_pd_answer_of_0_is_a_warning_not_a_failure() -> None:
    # Issue 29, item 8: libcdsprpc never reads UNSIGNED_PD_SUPPORT; a daemon that
    # answers runs its unsigned PD, so the answer alone only warns.
    finding = check_unsigned_pd(_status_with(p.DspCapabilities(arch_ver=0x73)))
    assert finding is not None
    assert finding.status is Status.WARN
    assert "UNSIGNED_PD_SUPPORT = 0" in finding.detail
    assert "firmware" in finding.fix
    ok = check_unsigned_pd(_status_with(p.DspCapabilities(arch_ver=0x73, unsigned_pd_support=1)))
    assert ok is not None
    assert ok.status is Status.OK
    # No capabilities reported (the DSP process is not up): nothing to say.
    assert check_unsigned_pd(_status_with(p.DspCapabilities())) is None
