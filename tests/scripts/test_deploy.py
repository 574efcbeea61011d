"""scripts/deploy_npu.sh against fake snapshots, a fake install root and a fake /sys."""

from __future__ import annotations

import hashlib
import io
import os
import stat
import subprocess
import tarfile
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.scripts.snapshots import (
    DEPLOY,
    DEV_PUBLIC_KEY,
    FIRMWARE_PATH,
    GOOD_FIRMWARE,
    QAIRT_LIB_PATH,
    QAIRT_TOOL_PATH,
    REPO,
    SHELL_PATH,
    SKEL_PATH,
    ExtraMember,
    build_snapshot,
    default_files,
    make_sysfs,
    manifest_for,
    run_script,
    tree_state,
)

EXIT_USAGE, EXIT_REFUSED, EXIT_BAD_FIRMWARE = 64, 65, 69  # sysexits


@dataclass
class Site:
    """One fake machine: install root, sysfs, and a scratch directory for snapshots."""

    root: Path
    sysfs: Path
    work: Path

    def deploy(
        self, snapshot: Path, *extra: str | os.PathLike[str]
    ) -> subprocess.CompletedProcess[str]:
        return run_script(
            DEPLOY,
            "--root",
            self.root,
            "--sysfs",
            self.sysfs,
            *extra,
            snapshot,
            tmp=self.work,
        )

    def state(self) -> dict[str, tuple[int, int, int, str]]:
        return tree_state(self.root, self.sysfs)

    def control(self, entry: str) -> str:
        path = self.sysfs / "class" / "remoteproc" / entry / "power" / "control"
        return path.read_text().strip()


@pytest.fixture
def site(tmp_path: Path) -> Site:
    root = tmp_path / "root"
    root.mkdir()
    work = tmp_path / "work"
    work.mkdir()
    sysfs = make_sysfs(
        tmp_path / "sys",
        {"remoteproc0": ("adsp", "auto"), "remoteproc1": ("cdsp", "auto")},
    )
    return Site(root, sysfs, work)


@pytest.fixture
def snapshot(site: Site) -> Path:
    return build_snapshot(site.work / "npu.tar.gz", default_files())


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_help_names_the_options() -> None:
    result = run_script(DEPLOY, "--help", tmp=Path("/"))
    assert result.returncode == 0
    for option in ("--dry-run", "--force", "--root", "--sysfs", "--backup-dir", "--signing-dir"):
        assert option in result.stdout
    assert GOOD_FIRMWARE in result.stdout


@pytest.mark.parametrize(
    "args",
    [[], ["--bogus", "x.tar"], ["a.tar", "b.tar"], ["--root"]],
    ids=["no-snapshot", "unknown-option", "two-snapshots", "root-without-value"],
)
def test_usage_errors(args: list[str], tmp_path: Path) -> None:
    result = run_script(DEPLOY, *args, tmp=tmp_path)
    assert result.returncode == EXIT_USAGE, result.stderr
    assert "--help" in result.stderr


def test_dry_run_writes_nothing(site: Site, snapshot: Path) -> None:
    before = site.state()
    result = site.deploy(snapshot, "--dry-run")
    assert result.returncode == 0, result.stderr
    assert site.state() == before
    assert "nothing was written" in result.stdout
    assert f"new        /{FIRMWARE_PATH}" in result.stdout
    assert 'would write "on"' in result.stdout
    assert "would install /usr/lib/systemd/system/npud.service" in result.stdout


def test_deploy_installs_the_snapshot_the_units_and_runtime_pm(site: Site, snapshot: Path) -> None:
    result = site.deploy(snapshot)
    assert result.returncode == 0, result.stderr
    for path, content in default_files().items():
        installed = site.root / path
        assert installed.read_bytes() == content
        assert _mode(installed) == (0o755 if path == QAIRT_TOOL_PATH else 0o644)
        assert installed.stat().st_uid == os.geteuid()
    assert site.control("remoteproc1") == "on"
    assert site.control("remoteproc0") == "auto"  # the ADSP is not ours to touch
    unit = site.root / "usr/lib/systemd/system/npud.service"
    assert unit.read_bytes() == (REPO / "systemd/npud.service").read_bytes()
    assert "reboot to load it" in result.stdout
    # Nothing existed before, so nothing was backed up; the new files are listed.
    backups = site.root / "var/backups/npud"
    assert not list(backups.glob("*.tar.gz"))
    [added] = backups.glob("npu-added-*.txt")
    assert sorted(added.read_text().split()) == sorted(f"/{p}" for p in default_files())


def test_second_run_changes_nothing_and_says_so(site: Site, snapshot: Path) -> None:
    assert site.deploy(snapshot).returncode == 0
    before = site.state()
    result = site.deploy(snapshot)
    assert result.returncode == 0, result.stderr
    assert site.state() == before
    assert "snapshot: nothing to change (6 file(s) already in place)" in result.stdout
    assert "runtime PM already off" in result.stdout
    assert "install.sh: nothing to change" in result.stdout
    assert "done: snapshot and runtime PM: nothing changed" in result.stdout


def test_a_corrupted_file_is_refused_before_anything_is_written(site: Site) -> None:
    good = default_files()
    bad = {**good, SKEL_PATH: good[SKEL_PATH] + b"\0"}
    snapshot = build_snapshot(site.work / "bad.tar", bad, manifest=manifest_for(good))
    before = site.state()
    result = site.deploy(snapshot)
    assert result.returncode == EXIT_REFUSED
    assert f"checksum mismatch: root/{SKEL_PATH}" in result.stderr
    assert "Nothing was written" in result.stderr
    assert site.state() == before


def _refused_snapshot(kind: str, work: Path) -> Path:
    files = default_files()
    target = work / f"{kind}.tar"
    if kind == "no-manifest":
        build_snapshot(target, files)
        with tarfile.open(target) as tar:
            members = [(m, tar.extractfile(m)) for m in tar.getmembers()]
            kept = [(m, f.read() if f else None) for m, f in members if m.name != "SHA256SUMS"]
        with tarfile.open(target, "w") as tar:
            for member, data in kept:
                tar.addfile(member, None if data is None else io.BytesIO(data))
        return target
    if kind == "unlisted-file":
        return build_snapshot(
            target,
            files,
            extra=[ExtraMember("root/usr/lib/dsp/cdsp/stray.so", content=b"stray")],
        )
    if kind == "listed-but-missing":
        manifest = manifest_for({**files, "usr/lib/dsp/cdsp/gone.so": b"gone"})
        return build_snapshot(target, files, manifest=manifest)
    if kind == "outside-allowed-paths":
        return build_snapshot(target, {**files, "etc/passwd": b"root::0:0::/:/bin/sh\n"})
    if kind == "symlink":
        return build_snapshot(
            target,
            files,
            extra=[ExtraMember("root/usr/lib/dsp/cdsp/link.so", tarfile.SYMTYPE, linkname="/etc")],
        )
    if kind == "dot-dot":
        return build_snapshot(target, files, extra=[ExtraMember("root/../escape", content=b"x")])
    if kind == "stray-top-level":
        return build_snapshot(target, files, extra=[ExtraMember("README", content=b"hi")])
    if kind == "malformed-manifest":
        return build_snapshot(target, files, manifest=manifest_for(files) + "not a checksum\n")
    if kind == "duplicate-manifest-line":
        manifest = manifest_for(files)
        return build_snapshot(target, files, manifest=manifest + manifest.splitlines()[0] + "\n")
    if kind == "not-a-tarball":
        target.write_bytes(b"this is not tar\n" * 100)
        return target
    raise AssertionError(kind)


@pytest.mark.parametrize(
    ("kind", "message"),
    [
        ("no-manifest", "no SHA256SUMS"),
        ("unlisted-file", "not in SHA256SUMS"),
        ("listed-but-missing", "does not contain"),
        ("outside-allowed-paths", "outside what a snapshot may restore"),
        ("symlink", "not a regular file or directory"),
        ("dot-dot", "unsafe path"),
        ("stray-top-level", "unexpected member"),
        ("malformed-manifest", "is not a sha256sum line"),
        ("duplicate-manifest-line", "twice"),
        ("not-a-tarball", "cannot read"),
    ],
)
def test_unsound_snapshots_are_refused_before_anything_is_written(
    site: Site, kind: str, message: str
) -> None:
    snapshot = _refused_snapshot(kind, site.work)
    before = site.state()
    result = site.deploy(snapshot)
    assert result.returncode == EXIT_REFUSED, result.stdout + result.stderr
    assert message in result.stderr
    assert site.state() == before


def test_a_mismatching_checksum_file_beside_the_tarball_is_refused(
    site: Site, snapshot: Path
) -> None:
    Path(f"{snapshot}.sha256").write_text(f"{'0' * 64}  {snapshot.name}\n")
    before = site.state()
    result = site.deploy(snapshot)
    assert result.returncode == EXIT_REFUSED
    assert "does not match" in result.stderr
    assert site.state() == before


def test_a_matching_checksum_file_beside_the_tarball_is_accepted(
    site: Site, snapshot: Path
) -> None:
    digest = hashlib.sha256(snapshot.read_bytes()).hexdigest()
    Path(f"{snapshot}.sha256").write_text(f"{digest}  {snapshot.name}\n")
    result = site.deploy(snapshot)
    assert result.returncode == 0, result.stderr
    assert "tarball matches" in result.stdout


@pytest.mark.parametrize(
    ("version", "why"),
    [
        ("CDSP.HT.2.9.c2-00051-HAMOA-1", "0x80000A1A"),
        ("CDSP.HT.2.9.c1-00069-HAMOA-1", "TrustZone"),
    ],
)
def test_known_bad_firmware_is_refused_unless_forced(site: Site, version: str, why: str) -> None:
    snapshot = build_snapshot(site.work / "bad-fw.tar", default_files(version))
    before = site.state()
    result = site.deploy(snapshot)
    assert result.returncode == EXIT_BAD_FIRMWARE
    assert version in result.stderr
    assert why in result.stderr
    assert GOOD_FIRMWARE in result.stderr
    assert site.state() == before

    forced = site.deploy(snapshot, "--force")
    assert forced.returncode == 0, forced.stderr
    assert "deploying it anyway (--force)" in forced.stderr
    assert (site.root / FIRMWARE_PATH).read_bytes() == default_files(version)[FIRMWARE_PATH]


def test_firmware_without_a_version_is_refused_unless_forced(site: Site) -> None:
    snapshot = build_snapshot(site.work / "nover.tar", default_files(None))
    before = site.state()
    result = site.deploy(snapshot)
    assert result.returncode == EXIT_BAD_FIRMWARE
    assert "cannot read the firmware version" in result.stderr
    assert site.state() == before
    assert site.deploy(snapshot, "--force").returncode == 0


def test_an_unknown_firmware_version_is_deployed_with_a_warning(site: Site) -> None:
    version = "CDSP.HT.2.9.c1-00078-HAMOA-1"
    result = site.deploy(build_snapshot(site.work / "other.tar", default_files(version)))
    assert result.returncode == 0, result.stderr
    assert f"{version} is not one npud has been checked with" in result.stderr


def test_a_changed_file_is_backed_up_and_the_backup_rolls_back(site: Site) -> None:
    first = default_files()
    assert site.deploy(build_snapshot(site.work / "a.tar", first)).returncode == 0
    added_before = set((site.root / "var/backups/npud").glob("npu-added-*"))
    second = {
        **first,
        QAIRT_LIB_PATH: b"\x7fELF htp backend, newer",
        "usr/lib/dsp/cdsp/libExtra.so": b"\x7fELF extra",
    }
    result = site.deploy(build_snapshot(site.work / "b.tar", second))
    assert result.returncode == 0, result.stderr
    assert f"changed    /{QAIRT_LIB_PATH}" in result.stdout
    assert (site.root / QAIRT_LIB_PATH).read_bytes() == second[QAIRT_LIB_PATH]

    backups = site.root / "var/backups/npud"
    [backup] = backups.glob("npu-before-*.tar.gz")
    [added] = set(backups.glob("npu-added-*")) - added_before
    assert added.read_text() == "/usr/lib/dsp/cdsp/libExtra.so\n"

    rollback = site.deploy(backup)
    assert rollback.returncode == 0, rollback.stderr
    assert (site.root / QAIRT_LIB_PATH).read_bytes() == first[QAIRT_LIB_PATH]


def test_mode_drift_is_repaired(site: Site, snapshot: Path) -> None:
    assert site.deploy(snapshot).returncode == 0
    (site.root / SKEL_PATH).chmod(0o666)
    result = site.deploy(snapshot)
    assert result.returncode == 0, result.stderr
    assert f"mode       /{SKEL_PATH}" in result.stdout
    assert _mode(site.root / SKEL_PATH) == 0o644


def test_runtime_pm_on_a_kernel_that_names_the_remoteproc_by_device(tmp_path: Path) -> None:
    # Older kernels name the remoteproc after its platform device.
    sysfs = make_sysfs(tmp_path / "sys", {"remoteproc3": ("32300000.remoteproc", "auto")})
    (sysfs / "class/remoteproc/remoteproc3/firmware").write_text(
        "qcom/x1e80100/LENOVO/21N1/qccdsp8380.mbn\n"
    )
    root = tmp_path / "root"
    root.mkdir()
    site = Site(root, sysfs, tmp_path)
    result = site.deploy(build_snapshot(tmp_path / "s.tar", default_files()))
    assert result.returncode == 0, result.stderr
    assert site.control("remoteproc3") == "on"


def test_no_cdsp_remoteproc_is_a_warning(tmp_path: Path) -> None:
    sysfs = make_sysfs(tmp_path / "sys", {"remoteproc0": ("adsp", "auto")})
    root = tmp_path / "root"
    root.mkdir()
    site = Site(root, sysfs, tmp_path)
    result = site.deploy(build_snapshot(tmp_path / "s.tar", default_files()))
    assert result.returncode == 0, result.stderr
    assert "no CDSP remoteproc" in result.stderr
    assert site.control("remoteproc0") == "auto"


def _signing_dir(base: Path, shell: bytes, public_key: bytes | None = None) -> Path:
    base.mkdir()
    (base / "shell-signing.pub").write_bytes(public_key or b"ab" * 32 + b"\n")
    digest = hashlib.sha256(shell).hexdigest()
    (base / "fastrpc_shell_unsigned_3.sha256").write_text(f"{digest}  fastrpc_shell_unsigned_3\n")
    (base / "fastrpc_shell_unsigned_3.sig").write_bytes(bytes(range(64)))
    return base


def test_signing_files_are_checked_against_the_shell_being_deployed(
    site: Site, snapshot: Path
) -> None:
    signing = _signing_dir(site.work / "signing", default_files()[SHELL_PATH])
    dry = site.deploy(snapshot, "--dry-run", "--signing-dir", signing)
    assert dry.returncode == 0, dry.stderr
    result = site.deploy(snapshot, "--signing-dir", signing)
    assert result.returncode == 0, result.stderr
    assert (site.root / "etc/npud/shell-signing.pub").read_bytes() == b"ab" * 32 + b"\n"
    assert (site.root / f"{SHELL_PATH}.sig").read_bytes() == bytes(range(64))


@pytest.mark.parametrize("problem", ["wrong-digest", "development-key", "with-venv-below-root"])
def test_install_problems_stop_the_deployment_before_anything_is_written(
    site: Site, snapshot: Path, problem: str
) -> None:
    shell = default_files()[SHELL_PATH]
    args: list[str | os.PathLike[str]] = []
    if problem == "wrong-digest":
        args = ["--signing-dir", _signing_dir(site.work / "signing", shell + b"other")]
    elif problem == "development-key":
        key = DEV_PUBLIC_KEY.read_bytes()
        args = ["--signing-dir", _signing_dir(site.work / "signing", shell, key)]
    else:
        args = ["--with-venv"]
    before = site.state()
    result = site.deploy(snapshot, *args)
    assert result.returncode == EXIT_REFUSED, result.stdout + result.stderr
    assert "install.sh would fail" in result.stderr
    assert site.state() == before
