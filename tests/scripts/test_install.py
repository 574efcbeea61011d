"""scripts/install.sh into a temporary root: layout, modes, idempotence, refusals."""

from __future__ import annotations

import ctypes
import hashlib
import os
import re
import stat
import subprocess
import tempfile
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import (
    Ed25519PrivateKey,
    Ed25519PublicKey,
)

from npud.fastrpc.trust.shell import DEVELOPMENT_PUBLIC_KEY_HEX
from tests.scripts.snapshots import DEPLOY, DEV_PUBLIC_KEY, INSTALL, REPO, run_script, tree_state

SHELL = "usr/lib/dsp/cdsp/fastrpc_shell_unsigned_3"

# Vendor files: path under the prefix -> source in the repository.
VENDOR = {
    "lib/systemd/system/npud.service": "systemd/npud.service",
    "lib/systemd/system/npud.socket": "systemd/npud.socket",
    "lib/sysusers.d/npud.conf": "systemd/sysusers.d/npud.conf",
    "lib/tmpfiles.d/npud.conf": "systemd/tmpfiles.d/npud.conf",
    "lib/udev/rules.d/90-npud-fastrpc.rules": "systemd/udev/90-npud-fastrpc.rules",
    "share/man/man8/npud.8": "man/npud.8",
    "share/man/man1/npuctl.1": "man/npuctl.1",
    "share/man/man5/npud.toml.5": "man/npud.toml.5",
    "share/bash-completion/completions/npud": "completions/bash/npud",
    "share/bash-completion/completions/npuctl": "completions/bash/npuctl",
    "share/npud/portal-npu.sh": "config/portal-npu.sh",
    "share/doc/npud/deploy.md": "docs/deploy.md",
}
# Installed path -> source in the repository, with the default prefix /usr.
EXPECTED = {
    **{f"usr/{path}": source for path, source in VENDOR.items()},
    "etc/npud/npud.toml": "config/npud.toml",
}
# Where an older install.sh put the vendor files that systemd and udev read.
LEGACY = {
    "etc/systemd/system/npud.service": "systemd/npud.service",
    "etc/systemd/system/npud.socket": "systemd/npud.socket",
    "etc/sysusers.d/npud.conf": "systemd/sysusers.d/npud.conf",
    "etc/tmpfiles.d/npud.conf": "systemd/tmpfiles.d/npud.conf",
    "etc/udev/rules.d/90-npud-fastrpc.rules": "systemd/udev/90-npud-fastrpc.rules",
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
    assert "--prefix" in result.stdout
    assert ".new" in result.stdout


def test_lays_out_the_files_with_their_modes(root: Path) -> None:
    result = install(root)
    assert result.returncode == 0, result.stderr
    for installed, source in EXPECTED.items():
        path = root / installed
        assert path.read_bytes() == (REPO / source).read_bytes(), installed
        assert _mode(path) == 0o644, installed
        assert path.stat().st_uid == os.geteuid()
    assert _mode(root / "etc/npud") == 0o755
    # The admin's /etc holds only npud.toml: every vendor file is under /usr.
    assert sorted(p.relative_to(root).as_posix() for p in (root / "etc").rglob("*")) == [
        "etc/npud",
        "etc/npud/npud.toml",
    ]
    assert "not activating" in result.stdout
    # Without --signing-dir and without a venv it says what is still missing.
    assert "shell-signing.pub is missing" in result.stderr
    assert "/opt/npud/venv/bin/npud does not exist" in result.stderr


def test_dry_run_writes_nothing(root: Path) -> None:
    before = tree_state(root)
    result = install(root, "--dry-run")
    assert result.returncode == 0, result.stderr
    assert tree_state(root) == before
    assert "would install /usr/lib/systemd/system/npud.service (mode 644)" in result.stdout


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
    unit = root / "usr/lib/systemd/system/npud.service"
    unit.write_text("[Service]\nExecStart=/bin/false\n")
    rules = root / "usr/lib/udev/rules.d/90-npud-fastrpc.rules"
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
    assert "npud.toml.new" in result.stderr
    # Said again on every run, and the admin's file is still untouched.
    again = install(root)
    assert config.read_text() == "[daemon]\nlog_level = 'debug'\n"
    assert "kept your /etc/npud/npud.toml" in again.stderr


def test_the_admins_modes_in_etc_are_kept(root: Path) -> None:
    assert install(root).returncode == 0
    (root / "etc/npud").chmod(0o750)
    (root / "etc/npud/npud.toml").chmod(0o600)
    result = install(root)
    assert result.returncode == 0, result.stderr
    assert _mode(root / "etc/npud") == 0o750
    assert _mode(root / "etc/npud/npud.toml") == 0o600
    assert "nothing to change" in result.stdout


def test_a_prefix_moves_every_vendor_file_and_leaves_etc_alone(root: Path) -> None:
    result = install(root, "--prefix", "/usr/local")
    assert result.returncode == 0, result.stderr
    for path, source in VENDOR.items():
        assert (root / "usr/local" / path).read_bytes() == (REPO / source).read_bytes(), path
    assert not (root / "usr/lib").exists()
    assert not (root / "usr/share").exists()
    assert (root / "etc/npud/npud.toml").is_file()


def test_a_staging_prefix_alone_plans_nothing_outside_it(tmp_path: Path) -> None:
    """Without --root, a prefix systemd does not search must not reach the running
    system's /etc nor activate anything (a dry run: safe whatever the script does)."""
    stage = tmp_path / "stage"
    result = run_script(INSTALL, "--prefix", stage, "--dry-run", tmp=tmp_path)
    assert result.returncode == 0, result.stderr
    planned = [line for line in result.stdout.splitlines() if " /" in line]
    assert planned, result.stdout
    for line in planned:
        if "would" in line or "unchanged" in line:
            assert str(stage) in line, line
    assert "would run" not in result.stdout
    assert f"would install {stage}/etc/npud/npud.toml" in result.stdout
    assert f"not activating: {stage} is a staging tree" in result.stdout
    assert " /etc/npud" not in result.stderr


def test_help_says_what_a_staging_prefix_leaves_alone(tmp_path: Path) -> None:
    result = run_script(INSTALL, "--help", tmp=tmp_path)
    assert "DIR/etc/npud" in result.stdout
    assert "nothing is activated" in result.stdout


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to run the script as nobody")
def test_a_staging_prefix_needs_no_root_and_writes_only_below_it() -> None:
    # Not tmp_path: pytest's directory is private to root, and nobody must get in.
    with tempfile.TemporaryDirectory(dir=os.path.realpath(os.environ.get("TMPDIR", "/tmp"))) as d:
        Path(d).chmod(0o755)
        stage = Path(d) / "stage"
        stage.mkdir()
        os.chown(stage, 65534, 65534)
        _install_as_nobody_into(stage)


def _install_as_nobody_into(stage: Path) -> None:
    result = subprocess.run(
        [str(INSTALL), "--prefix", str(stage)],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
        user=65534,
        env={"PATH": "/usr/bin:/bin", "LC_ALL": "C.UTF-8", "TMPDIR": str(stage)},
    )
    assert result.returncode == 0, result.stderr
    for path, source in VENDOR.items():
        assert (stage / path).read_bytes() == (REPO / source).read_bytes(), path
    assert (stage / "etc/npud/npud.toml").read_bytes() == (REPO / "config/npud.toml").read_bytes()
    assert "not activating" in result.stdout


def test_a_staging_prefix_refuses_the_venv(tmp_path: Path) -> None:
    stage = tmp_path / "stage"
    result = run_script(INSTALL, "--prefix", stage, "--with-venv", "--dry-run", tmp=tmp_path)
    assert result.returncode == 64
    assert "--with-venv installs into the running system's /opt/npud/venv" in result.stderr


@pytest.mark.parametrize("prefix", ["usr", "/usr/", "/etc", "/etc/npud", ""])
def test_a_bad_prefix_is_a_usage_error(root: Path, prefix: str) -> None:
    before = tree_state(root)
    result = install(root, f"--prefix={prefix}")
    assert result.returncode == 64, result.stderr
    assert "--prefix" in result.stderr
    assert tree_state(root) == before


def test_unchanged_copies_from_an_older_install_are_removed(root: Path) -> None:
    for legacy, source in LEGACY.items():
        (root / legacy).parent.mkdir(parents=True, exist_ok=True)
        (root / legacy).write_bytes((REPO / source).read_bytes())
    dry = install(root, "--dry-run")
    assert "would remove /etc/systemd/system/npud.service" in dry.stdout
    assert all((root / legacy).exists() for legacy in LEGACY)
    result = install(root)
    assert result.returncode == 0, result.stderr
    for legacy in LEGACY:
        assert not (root / legacy).exists(), legacy
    assert "removed    /etc/systemd/system/npud.service" in result.stdout


def test_an_edited_copy_in_etc_is_kept_and_named(root: Path) -> None:
    unit = root / "etc/systemd/system/npud.service"
    unit.parent.mkdir(parents=True)
    unit.write_text("[Service]\nExecStart=/usr/local/bin/my-npud\n")
    result = install(root)
    assert result.returncode == 0, result.stderr
    assert unit.read_text() == "[Service]\nExecStart=/usr/local/bin/my-npud\n"
    assert (
        "/etc/systemd/system/npud.service overrides /usr/lib/systemd/system/npud.service"
        in result.stderr
    )
    assert "drop-in" in result.stderr


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


def test_another_public_key_never_replaces_the_admins(root: Path, tmp_path: Path) -> None:
    shell = b"\x7fELF shell"
    (root / SHELL).parent.mkdir(parents=True)
    (root / SHELL).write_bytes(shell)
    assert install(root, "--signing-dir", make_signing_dir(tmp_path / "a", shell)).returncode == 0
    other = make_signing_dir(tmp_path / "b", shell, key=b"ef" * 32 + b"\n")
    result = install(root, "--signing-dir", other)
    assert result.returncode == 0, result.stderr
    assert (root / "etc/npud/shell-signing.pub").read_bytes() == PUBLIC_KEY
    assert (root / "etc/npud/shell-signing.pub.new").read_bytes() == b"ef" * 32 + b"\n"
    assert "kept your /etc/npud/shell-signing.pub" in result.stderr


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
        (["--bogus"], 64, "unknown argument"),
        (["--shell-image", "/nonexistent"], 64, "only makes sense with --signing-dir"),
        (["--signing-dir"], 64, "needs a value"),
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


def test_with_shim_builds_and_installs_npuds_libcdsprpc(root: Path) -> None:
    result = install(root, "--with-shim")
    assert result.returncode == 0, result.stderr
    library = root / "usr/lib/npud/libcdsprpc.so.1"
    link = root / "usr/lib/npud/libcdsprpc.so"
    assert _mode(library) == 0o755
    assert os.readlink(link) == "libcdsprpc.so.1"  # the name llama.cpp dlopens
    loaded = ctypes.CDLL(str(link))
    for symbol in ("remote_handle64_open", "rpcmem_alloc2", "dspqueue_create"):
        assert hasattr(loaded, symbol), symbol
    again = install(root, "--with-shim")
    assert again.returncode == 0, again.stderr
    assert "nothing to change" in again.stdout  # the build is reproducible


def test_with_shim_never_replaces_a_file_where_its_link_goes(root: Path) -> None:
    (root / "usr/lib/npud").mkdir(parents=True)
    (root / "usr/lib/npud/libcdsprpc.so").write_bytes(b"someone's library")
    result = install(root, "--with-shim")
    assert result.returncode == 1
    assert "libcdsprpc.so exists and is not a symbolic link" in result.stderr
    assert (root / "usr/lib/npud/libcdsprpc.so").read_bytes() == b"someone's library"


def test_the_helpers_install_and_deploy_share_are_defined_once() -> None:
    """install.sh and deploy_npu.sh source scripts/install-lib.sh rather than keep copies."""
    definition = re.compile(r"^([a-z_]+)\(\) \{", re.MULTILINE)
    library = REPO / "scripts" / "install-lib.sh"
    shared = set(definition.findall(library.read_text()))
    assert {"die", "usage_error", "note", "warn", "report", "need_value", "target"} <= shared
    assert "hash_of" in shared
    for script in (INSTALL, DEPLOY):
        text = script.read_text()
        assert "# shellcheck source=scripts/install-lib.sh\n" in text, script.name
        copies = shared & set(definition.findall(text))
        assert not copies, f"{script.name} defines {sorted(copies)} again"
