"""The CDSP firmware: its version read from the image (plain, xz or zstd) and judged
against the versions the hardware notes name good and bad.
"""

from __future__ import annotations

import fnmatch
import lzma
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path, PurePosixPath
from typing import Final

from npud.ops.doctor_checks.device import _remoteproc_label, find_cdsp_remoteprocs
from npud.ops.doctor_checks.target import (
    DEPLOY_FIX,
    Finding,
    Readable,
    Status,
    Target,
    read_attribute,
)

KNOWN_GOOD_FIRMWARE: Final = "CDSP.HT.2.9.c1-00046-HAMOA-1"
KNOWN_BAD_FIRMWARE: Final = (
    ("CDSP.HT.2.9.c2-00051-*", "rejects unsigned modules with 0x80000A1A"),
    ("CDSP.HT.2.9.c1-00069-*", "is rejected by TrustZone"),
)
"""(version glob, why): the same table as scripts/deploy_npu.sh (a test keeps them equal)."""
_VERSION_PREFIX: Final = b"QC_IMAGE_VERSION_STRING="
_VERSION: Final = re.compile(rb"QC_IMAGE_VERSION_STRING=(CDSP[A-Za-z0-9._-]{0,200})")
_VERSION_CHUNK: Final = 1 << 20


def read_firmware_version(stream: Readable, chunk_size: int = _VERSION_CHUNK) -> str | None:
    """The first ``QC_IMAGE_VERSION_STRING=CDSP...`` value in ``stream``, or None.

    Reads in chunks: a firmware image is tens of megabytes and the string can
    straddle two chunks.
    """
    if chunk_size < len(_VERSION_PREFIX):
        raise ValueError(f"chunk_size must be at least {len(_VERSION_PREFIX)}, got {chunk_size}")
    pending = b""
    while True:
        chunk = stream.read(chunk_size)
        data = pending + chunk
        match = _VERSION.search(data)
        if match is not None and (match.end() < len(data) or not chunk):
            return match.group(1).decode("ascii")
        if not chunk:
            return None
        # Carry over a version that may go on in the next chunk, or else the
        # longest prefix that could be cut at the chunk's end (the prefix and "CDS").
        keep = match.start() if match is not None else len(data) - len(_VERSION_PREFIX) - 3
        pending = data[max(keep, 0) :]


def firmware_verdict(version: str) -> tuple[Status, str]:
    """OK for the known-good version, FAIL for a known-bad one, WARN otherwise."""
    if version == KNOWN_GOOD_FIRMWARE:
        return Status.OK, "known good"
    for pattern, why in KNOWN_BAD_FIRMWARE:
        if fnmatch.fnmatchcase(version, pattern):
            return Status.FAIL, why
    return (
        Status.WARN,
        f"not a version npud has been checked with (known good: {KNOWN_GOOD_FIRMWARE})",
    )


class FirmwareUnreadableError(Exception):
    """The image exists but its bytes cannot be read; the message says why."""


def firmware_candidates(target: Target, name: str) -> Iterator[Path]:
    """Where the kernel's firmware loader looks for ``name``, in its order.

    The custom path (firmware_class.path), then updates/<release>, updates,
    <release> and the base of /lib/firmware and /usr/lib/firmware; all of them
    uncompressed first, then ``.zst``, then ``.xz``.
    """
    directories: list[Path] = []
    custom = read_attribute(target.path("/sys/module/firmware_class/parameters/path"))
    if custom:
        directories.append(target.path(custom))
    release = read_attribute(target.path("/proc/sys/kernel/osrelease"))
    for base in ("/lib/firmware", "/usr/lib/firmware"):
        rooted = target.path(base)
        for sub in ("updates/" + release if release else None, "updates", release, None):
            directories.append(rooted / sub if sub else rooted)
    for suffix in ("", ".zst", ".xz"):
        for directory in directories:
            yield directory / (name + suffix)


def image_version(image: Path) -> str | None:
    """The version embedded in ``image`` (``.xz`` and ``.zst`` decompressed); None if none."""
    try:
        if image.name.endswith(".xz"):
            with lzma.open(image) as stream:
                return read_firmware_version(stream)
        if image.name.endswith(".zst"):
            return _zstd_image_version(image)
        with image.open("rb") as stream:
            return read_firmware_version(stream)
    except (OSError, lzma.LZMAError, EOFError) as exc:
        raise FirmwareUnreadableError(f"cannot read {image}: {exc}") from None


def _zstd_image_version(image: Path) -> str | None:
    zstd = shutil.which("zstd")
    if zstd is None:
        raise FirmwareUnreadableError(f"{image} is zstd-compressed and zstd is not installed")
    with subprocess.Popen(
        [zstd, "-dcq", "--", str(image)], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL
    ) as process:
        assert process.stdout is not None  # stdout=PIPE
        try:
            version = read_firmware_version(process.stdout)
        finally:
            if process.poll() is None:
                process.kill()  # found early: the rest of the image is not needed
    if version is None and process.returncode not in (0, -9):
        raise FirmwareUnreadableError(f"zstd cannot decompress {image} (exit {process.returncode})")
    return version


def check_firmware(target: Target) -> list[Finding]:
    check = "CDSP firmware"
    remoteprocs = find_cdsp_remoteprocs(target)
    if not remoteprocs:
        return [Finding(check, Status.SKIP, "no CDSP remoteproc (see above)")]
    return [_check_firmware_of(target, rproc) for rproc in remoteprocs]


def _check_firmware_of(target: Target, rproc: Path) -> Finding:
    check = "CDSP firmware"
    label = _remoteproc_label(rproc)
    name = read_attribute(rproc / "firmware")
    if not name:
        return Finding(
            check,
            Status.WARN,
            f"{label}: no firmware name in {rproc / 'firmware'}; cannot tell which image it runs",
        )
    relative = PurePosixPath(name)
    if relative.is_absolute() or ".." in relative.parts:
        return Finding(check, Status.WARN, f"{label}: odd firmware name {name!r}; not checked")
    image = next((path for path in firmware_candidates(target, name) if path.is_file()), None)
    if image is None:
        return Finding(
            check,
            Status.FAIL,
            f"{label}: {name} is not under {target.path('/lib/firmware')} or "
            f"{target.path('/usr/lib/firmware')}; the CDSP cannot boot it again",
            DEPLOY_FIX + ", then reboot",
        )
    try:
        version = image_version(image)
    except FirmwareUnreadableError as exc:
        fix = "sudo apt install zstd" if "zstd is not installed" in str(exc) else DEPLOY_FIX
        return Finding(check, Status.WARN, f"{label}: {exc}", fix)
    if version is None:
        return Finding(
            check,
            Status.WARN,
            f"{label}: {image} has no QC_IMAGE_VERSION_STRING; its version is unknown",
            f"use a snapshot from a laptop where the NPU works ({KNOWN_GOOD_FIRMWARE})",
        )
    status, why = firmware_verdict(version)
    detail = f"{label}: {image} is {version} ({why})"
    if status is Status.OK:
        return Finding(check, status, detail)
    if status is Status.FAIL:
        return Finding(
            check,
            status,
            detail,
            f"deploy a snapshot with {KNOWN_GOOD_FIRMWARE} (sudo scripts/deploy_npu.sh "
            "SNAPSHOT) and reboot",
        )
    return Finding(
        check,
        status,
        detail,
        f"if the NPU misbehaves, deploy a snapshot with {KNOWN_GOOD_FIRMWARE}",
    )
