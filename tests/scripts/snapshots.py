"""Fake NPU snapshots, fake sysfs trees and runners for the deployment scripts.

A snapshot is what docs/deploy.md describes: ``SHA256SUMS`` plus ``root/``.
The builders write real tarballs with :mod:`tarfile`, so the scripts read them
with the same GNU tar they use on the laptop.
"""

from __future__ import annotations

import hashlib
import io
import os
import subprocess
import tarfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "scripts" / "deploy_npu.sh"
INSTALL = REPO / "scripts" / "install.sh"
DEV_PUBLIC_KEY = REPO / "npud" / "devshell" / "shell-signing.pub"

GOOD_FIRMWARE = "CDSP.HT.2.9.c1-00046-HAMOA-1"
FIRMWARE_PATH = "usr/lib/firmware/qcom/x1e80100/LENOVO/21N1/qccdsp8380.mbn"
DTB_PATH = "usr/lib/firmware/qcom/x1e80100/LENOVO/21N1/cdsp_dtb.mbn"
SHELL_PATH = "usr/lib/dsp/cdsp/fastrpc_shell_unsigned_3"
SKEL_PATH = "usr/lib/dsp/cdsp/libQnnHtpV73Skel.so"
QAIRT_LIB_PATH = "opt/qcom/qairt/2.44/lib/libQnnHtp.so"
QAIRT_TOOL_PATH = "opt/qcom/qairt/2.44/bin/qnn-net-run"


def firmware_image(version: str | None) -> bytes:
    """Bytes shaped like a Qualcomm image: an ELF header, padding, the version string."""
    body = b"\x7fELF\x01\x01\x01" + bytes(57) + b"\xa5" * 300
    if version is not None:
        body += b"\0QC_IMAGE_VERSION_STRING=" + version.encode() + b"\0"
    return body + b"\x5a" * 300


def default_files(firmware_version: str | None = GOOD_FIRMWARE) -> dict[str, bytes]:
    """Paths below root/ -> content, for a complete snapshot."""
    return {
        FIRMWARE_PATH: firmware_image(firmware_version),
        DTB_PATH: b"\xd0\x0d\xfe\xed device tree",
        SHELL_PATH: b"\x7fELF shell image",
        SKEL_PATH: b"\x7fELF skel",
        QAIRT_LIB_PATH: b"\x7fELF htp backend",
        QAIRT_TOOL_PATH: b"#!/bin/sh\necho qnn-net-run\n",
    }


EXECUTABLES = frozenset({QAIRT_TOOL_PATH})


def manifest_for(files: Mapping[str, bytes]) -> str:
    return "".join(
        f"{hashlib.sha256(content).hexdigest()}  root/{path}\n"
        for path, content in sorted(files.items())
    )


@dataclass(frozen=True)
class ExtraMember:
    """A tar member added as is: a symlink, an unsafe name, a stray file."""

    name: str
    type: bytes = tarfile.REGTYPE
    content: bytes = b""
    linkname: str = ""


def build_snapshot(
    path: Path,
    files: Mapping[str, bytes],
    *,
    manifest: str | None = None,
    executables: frozenset[str] = EXECUTABLES,
    extra: Sequence[ExtraMember] = (),
) -> Path:
    """Write a snapshot tarball; ``manifest`` replaces the correct SHA256SUMS."""
    text = manifest_for(files) if manifest is None else manifest
    compressed = path.name.endswith(".gz")
    with tarfile.open(path, "w:gz") if compressed else tarfile.open(path, "w") as tar:
        _add(tar, "SHA256SUMS", text.encode(), 0o644)
        for name, content in sorted(files.items()):
            _add(tar, f"root/{name}", content, 0o755 if name in executables else 0o644)
        for member in extra:
            info = tarfile.TarInfo(member.name)
            info.type = member.type
            info.linkname = member.linkname
            info.size = len(member.content) if member.type == tarfile.REGTYPE else 0
            tar.addfile(info, io.BytesIO(member.content) if info.size else None)
    return path


def _add(tar: tarfile.TarFile, name: str, content: bytes, mode: int) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(content)
    info.mode = mode
    tar.addfile(info, io.BytesIO(content))


def make_sysfs(base: Path, remoteprocs: Mapping[str, tuple[str, str]]) -> Path:
    """A fake /sys: remoteprocN -> (name, power/control)."""
    for entry, (name, control) in remoteprocs.items():
        directory = base / "class" / "remoteproc" / entry
        (directory / "power").mkdir(parents=True)
        (directory / "name").write_text(name + "\n")
        (directory / "power" / "control").write_text(control + "\n")
    return base


def tree_state(*roots: Path) -> dict[str, tuple[int, int, int, str]]:
    """Every entry below ``roots``: (mode, inode, mtime_ns, sha256 of content)."""
    state: dict[str, tuple[int, int, int, str]] = {}
    for root in roots:
        for directory, dirnames, filenames in os.walk(root):
            for name in sorted(dirnames + filenames):
                entry = Path(directory) / name
                info = entry.lstat()
                digest = hashlib.sha256(entry.read_bytes()).hexdigest() if entry.is_file() else ""
                state[str(entry)] = (info.st_mode, info.st_ino, info.st_mtime_ns, digest)
    return state


def run_script(
    script: Path, *args: str | os.PathLike[str], tmp: Path
) -> subprocess.CompletedProcess[str]:
    """Run a deployment script with a clean environment of its own."""
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "LC_ALL": "C.UTF-8",
        "TMPDIR": str(tmp),
    }
    return subprocess.run(
        [str(script), *map(str, args)],
        capture_output=True,
        text=True,
        env=env,
        check=False,
        timeout=60,
    )
