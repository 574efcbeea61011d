"""scripts/install.sh into a temporary root: layout, modes, idempotence, refusals."""

from __future__ import annotations

import hashlib
import os
import stat
import subprocess
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import (
    Ed25519PrivateKey,
    Ed25519PublicKey,
)

from npud.fastrpc.shell import DEVELOPMENT_PUBLIC_KEY_HEX
from tests.scripts.snapshots import DEV_PUBLIC_KEY, INSTALL, REPO, run_script, tree_state

SHELL = "usr/lib/dsp/cdsp/fastrpc_shell_unsigned_3"

# Installed path -> source in the repository (None: from --signing-dir).
EXPECTED = {
    "etc/systemd/system/npud.service": "systemd/npud.service",
    "etc/systemd/system/npud.socket": "systemd/npud.socket",
    "etc/sysusers.d/npud.conf": "systemd/sysusers.d/npud.conf",
    "etc/tmpfiles.d/npud.conf": "systemd/tmpfiles.d/npud.conf",
    "etc/udev/rules.d/90-npud-fastrpc.rules": "systemd/udev/90-npud-fastrpc.rules",
    "etc/npud/npud.toml": "config/npud.toml",
    "usr/share/npud/portal-npu.sh": "config/portal-npu.sh",
    "usr/share/doc/npud/deploy.md": "docs/deploy.md",
}
SIGNING = {
    "etc/npud/shell-signing.pub": "shell-signing.pub",
    f"{SHELL}.sha256": "fastrpc_shell_unsigned_3.sha256",
    f"{SHELL}.sig": "fastrpc_shell_unsigned_3.sig",
}
PUBLIC_KEY = b"cd" * 32 + b"\n"


def install(root: Path, *args: str | os.PathLike[str]) -> subprocess.CompletedProcess[str]:
    return run_script(INSTALL, "--root", root, *args, tmp=root.parent)


def make_signing_dir(base: Path, shell: bytes, *, key: bytes = PUBLIC_KEY) -> Path:
    base.mkdir()
    (base / "shell-signing.pub").write_bytes(key)
    digest = hashlib.sha256(shell).hexdigest()
    (base / "fastrpc_shell_unsigned_3.sha256").write_text(f"{digest}  fastrpc_shell_unsigned_3\n")
    (base / "fastrpc_shell_unsigned_3.sig").write_bytes(b"\x5a" * 64)
    return base


def _pem(key: Ed25519PublicKey) -> bytes:
    return key.public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )


def test_install_script_knows_npuds_development_key() -> None:
    text = INSTALL.read_text()
    assert f"readonly DEVELOPMENT_PUBLIC_KEY_HEX={DEVELOPMENT_PUBLIC_KEY_HEX}\n" in text


@pytest.fixture
def root(tmp_path: Path) -> Path:
    path = tmp_path / "root"
    path.mkdir()
    return path


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_help_lists_what_goes_where(tmp_path: Path) -> None:
    result = run_script(INSTALL, "--help", tmp=tmp_path)
    assert result.returncode == 0
    for installed in EXPECTED:
        assert Path(installed).name in result.stdout


def test_lays_out_the_files_with_their_modes(root: Path) -> None:
    result = install(root)
    assert result.returncode == 0, result.stderr
    for installed, source in EXPECTED.items():
        path = root / installed
        assert path.read_bytes() == (REPO / source).read_bytes(), installed
        assert _mode(path) == 0o644, installed
        assert path.stat().st_uid == os.geteuid()
    assert _mode(root / "etc/npud") == 0o755
    assert "not activating" in result.stdout
    # Without --signing-dir and without a venv it says what is still missing.
    assert "shell-signing.pub is missing" in result.stderr
    assert "/opt/npud/venv/bin/npud does not exist" in result.stderr


def test_dry_run_writes_nothing(root: Path) -> None:
    before = tree_state(root)
    result = install(root, "--dry-run")
    assert result.returncode == 0, result.stderr
    assert tree_state(root) == before
    assert "would install /etc/systemd/system/npud.service (mode 644)" in result.stdout


def test_second_run_changes_nothing_and_says_so(root: Path) -> None:
    assert install(root).returncode == 0
    before = tree_state(root)
    result = install(root)
    assert result.returncode == 0, result.stderr
    assert tree_state(root) == before
    assert "nothing to change" in result.stdout
    assert "installed" not in result.stdout


def test_drift_is_repaired(root: Path) -> None:
    assert install(root).returncode == 0
    unit = root / "etc/systemd/system/npud.service"
    unit.write_text("[Service]\nExecStart=/bin/false\n")
    rules = root / "etc/udev/rules.d/90-npud-fastrpc.rules"
    rules.chmod(0o666)
    result = install(root)
    assert result.returncode == 0, result.stderr
    assert unit.read_bytes() == (REPO / "systemd/npud.service").read_bytes()
    assert _mode(rules) == 0o644
    assert "2 change(s) made" in result.stdout


def test_an_edited_config_is_kept_and_the_new_one_goes_beside_it(root: Path) -> None:
    assert install(root).returncode == 0
    config = root / "etc/npud/npud.toml"
    config.write_text("[daemon]\nlog_level = 'debug'\n")
    result = install(root)
    assert result.returncode == 0, result.stderr
    assert config.read_text() == "[daemon]\nlog_level = 'debug'\n"
    assert (root / "etc/npud/npud.toml.new").read_bytes() == (
        REPO / "config/npud.toml"
    ).read_bytes()
    assert "kept your /etc/npud/npud.toml" in result.stderr


def test_signing_files_are_installed_and_checked_against_the_installed_shell(
    root: Path, tmp_path: Path
) -> None:
    shell = b"\x7fELF shell"
    (root / SHELL).parent.mkdir(parents=True)
    (root / SHELL).write_bytes(shell)
    signing = make_signing_dir(tmp_path / "signing", shell)
    result = install(root, "--signing-dir", signing)
    assert result.returncode == 0, result.stderr
    for installed, name in SIGNING.items():
        assert (root / installed).read_bytes() == (signing / name).read_bytes()
        assert _mode(root / installed) == 0o644
    assert "is missing" not in result.stderr


@pytest.mark.parametrize(
    ("problem", "message"),
    [
        ("development-key", "development key"),
        ("development-key-as-pem", "development key"),
        ("short-signature", "64-byte Ed25519 signature"),
        ("bad-digest-file", "sha256sum format"),
        ("digest-of-another-shell", "does not match"),
        ("missing-file", "has no fastrpc_shell_unsigned_3.sig"),
    ],
)
def test_bad_signing_files_are_refused_before_anything_is_written(
    root: Path, tmp_path: Path, problem: str, message: str
) -> None:
    shell = b"\x7fELF shell"
    (root / SHELL).parent.mkdir(parents=True)
    (root / SHELL).write_bytes(shell)
    signing = make_signing_dir(tmp_path / "signing", shell)
    if problem == "development-key":
        (signing / "shell-signing.pub").write_bytes(DEV_PUBLIC_KEY.read_bytes())
    elif problem == "development-key-as-pem":
        dev_key = Ed25519PublicKey.from_public_bytes(bytes.fromhex(DEVELOPMENT_PUBLIC_KEY_HEX))
        (signing / "shell-signing.pub").write_bytes(_pem(dev_key))
    elif problem == "short-signature":
        (signing / "fastrpc_shell_unsigned_3.sig").write_bytes(b"\x5a" * 63)
    elif problem == "bad-digest-file":
        (signing / "fastrpc_shell_unsigned_3.sha256").write_text("not a digest\n")
    elif problem == "digest-of-another-shell":
        (root / SHELL).write_bytes(shell + b"changed")
    else:
        (signing / "fastrpc_shell_unsigned_3.sig").unlink()
    before = tree_state(root)
    result = install(root, "--signing-dir", signing)
    assert result.returncode == 1
    assert message in result.stderr
    assert tree_state(root) == before


def test_a_pem_public_key_of_your_own_is_accepted(root: Path, tmp_path: Path) -> None:
    shell = b"\x7fELF shell"
    key = _pem(Ed25519PrivateKey.generate().public_key())
    signing = make_signing_dir(tmp_path / "signing", shell, key=key)
    result = install(root, "--signing-dir", signing, "--dry-run")
    assert result.returncode == 0, result.stderr
    assert "would install /etc/npud/shell-signing.pub" in result.stdout


def test_shell_image_replaces_the_installed_shell_for_the_digest_check(
    root: Path, tmp_path: Path
) -> None:
    image = tmp_path / "staged_shell"
    image.write_bytes(b"\x7fELF staged")
    signing = make_signing_dir(tmp_path / "signing", image.read_bytes())
    ok = install(root, "--signing-dir", signing, "--shell-image", image, "--dry-run")
    assert ok.returncode == 0, ok.stderr
    image.write_bytes(b"\x7fELF something else")
    refused = install(root, "--signing-dir", signing, "--shell-image", image, "--dry-run")
    assert refused.returncode == 1
    assert "does not match" in refused.stderr


@pytest.mark.parametrize(
    ("args", "status", "message"),
    [
        (["--with-venv"], 1, "cannot go below --root"),
        (["--bogus"], 2, "unknown argument"),
        (["--shell-image", "/nonexistent"], 2, "only makes sense with --signing-dir"),
        (["--signing-dir"], 2, "needs a value"),
    ],
)
def test_refusals(root: Path, args: list[str], status: int, message: str) -> None:
    before = tree_state(root)
    result = install(root, *args)
    assert result.returncode == status
    assert message in result.stderr
    assert tree_state(root) == before


def test_a_missing_root_is_an_error(tmp_path: Path) -> None:
    result = run_script(INSTALL, "--root", tmp_path / "nope", tmp=tmp_path)
    assert result.returncode == 1
    assert "is not a directory" in result.stderr
