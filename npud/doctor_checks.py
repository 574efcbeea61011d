"""The checks behind ``npud doctor``: each one looks at one thing and explains it.

Every check reads the installation under a root directory (``/`` on the
laptop, a fake tree in tests), so ``<root>/dev``, ``<root>/sys``,
``<root>/etc``, ``<root>/usr/lib``, ``<root>/lib/firmware`` and ``<root>/opt``
are what is looked at. Paths that come from the configuration
(``backend.nodes``, ``shell.path``...) or from ``$QAIRT_ROOT`` are paths on the
target system and are looked up under the root too. The daemon's socket is
the exception: it is connected to as given, because it is a live endpoint
rather than a file of the installation.

A check returns :class:`Finding` objects: a status, one line of detail and,
where there is one, the fix. Nothing here writes anything or needs privileges.
"""

from __future__ import annotations

import enum
import errno
import fnmatch
import grp
import lzma
import os
import pwd
import re
import shutil
import stat
import subprocess
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, replace
from pathlib import Path, PurePosixPath
from typing import Final, Protocol

import npu_client
from npu_protocol import DaemonStatus
from npud.backend import EMULATED_SUFFIX, Profile, select_profile
from npud.config import Config
from npud.fastrpc.kernel.errors import ShellVerifyError
from npud.fastrpc.trust.shell import is_development_key, key_fingerprint, load_public_key_file

# --- What the hardware notes and docs/deploy.md fix ------------------------------------

KNOWN_GOOD_FIRMWARE: Final = "CDSP.HT.2.9.c1-00046-HAMOA-1"
KNOWN_BAD_FIRMWARE: Final = (
    ("CDSP.HT.2.9.c2-00051-*", "rejects unsigned modules with 0x80000A1A"),
    ("CDSP.HT.2.9.c1-00069-*", "is rejected by TrustZone"),
)
"""(version glob, why): the same table as scripts/deploy_npu.sh (a test keeps them equal)."""

DEVICE_GROUP: Final = "fastrpc"
"""Owns the device nodes (udev rule); the npud service has it as a supplementary group."""
SERVICE_USER: Final = "npud"
CLIENT_GROUP: Final = "npu"
"""The service's primary group and the clients' group: a node it may open is open to clients."""

DEFAULT_QAIRT_ROOT: Final = "/opt/qcom/qairt/2.44"
QAIRT_HOST_LIBRARIES: Final = ("libQnnHtp.so", "libQnnSystem.so", "libQnnHtpV73Stub.so")
"""What config/portal-npu.sh says ``$QAIRT_ROOT/lib`` holds for QNN on the HTP."""
DSP_SKEL_LIBRARY: Final = "libQnnHtpV73Skel.so"
"""The HTP's DSP-side library, found through npud's DSP library path."""

DEPLOY_FIX: Final = "restore the NPU software from a snapshot: sudo scripts/deploy_npu.sh SNAPSHOT"
SIGNING_FIX: Final = (
    "sign the shell with npud-sign-shell sign and install the files with "
    "sudo scripts/install.sh --signing-dir DIR (docs/deploy.md, step 1)"
)
UDEV_FIX: Final = (
    "install the udev rule (sudo scripts/install.sh), then sudo udevadm trigger "
    "--subsystem-match=misc"
)

_VERSION_PREFIX: Final = b"QC_IMAGE_VERSION_STRING="
_VERSION: Final = re.compile(rb"QC_IMAGE_VERSION_STRING=(CDSP[A-Za-z0-9._-]{0,200})")
_VERSION_CHUNK: Final = 1 << 20
_LIVE_STATES: Final = ("running", "attached")
"""remoteproc states of a booted DSP: "attached" is one an earlier boot stage started."""


class Readable(Protocol):
    """A binary stream: a file, an lzma file, a pipe."""

    def read(self, size: int, /) -> bytes: ...


class Status(enum.StrEnum):
    OK = "OK"
    WARN = "WARN"
    FAIL = "FAIL"
    SKIP = "SKIP"


@dataclass(frozen=True)
class Finding:
    """One line of the report: ``check`` names what was looked at."""

    check: str
    status: Status
    detail: str
    fix: str = ""


@dataclass(frozen=True)
class Target:
    """The installation being checked, and how to reach its daemon."""

    root: Path
    config: Config
    socket: str
    """Connected to as given (not under ``root``)."""
    qairt_root: str = DEFAULT_QAIRT_ROOT
    """A path on the target system, looked up under ``root``."""

    def path(self, system_path: str | os.PathLike[str]) -> Path:
        """Where ``system_path`` (absolute on the target system) is under the root."""
        return self.root / str(system_path).lstrip("/")

    @property
    def is_live(self) -> bool:
        """True when the root is the running system's own ``/``."""
        return self.root == Path("/")

    def kernel_profile(self) -> Profile:
        """The profile npud uses on the device, with its paths under the root."""
        profile = select_profile(self.config, "kernel")
        return replace(
            profile,
            nodes=tuple(str(self.path(node)) for node in profile.nodes),
            library_path=tuple(self.path(p) for p in profile.library_path),
            shell_path=self.path(profile.shell_path),
            public_key_path=self.path(profile.public_key_path),
        )


# --- Small readers ----------------------------------------------------------------------


def read_attribute(path: Path) -> str | None:
    """A sysfs-style one-line file, stripped; None when it cannot be read."""
    try:
        return path.read_text(encoding="utf-8", errors="replace").strip()
    except OSError:
        return None


@dataclass(frozen=True)
class Accounts:
    """User and group names of the target system, for the device-node check."""

    uids: Mapping[str, int]
    gids: Mapping[str, int]

    @classmethod
    def of(cls, target: Target) -> Accounts:
        """The running system's database (NSS) for ``/``; the tree's files otherwise."""
        if target.is_live:
            return cls(
                uids={entry.pw_name: entry.pw_uid for entry in pwd.getpwall()},
                gids={entry.gr_name: entry.gr_gid for entry in grp.getgrall()},
            )
        return cls(
            uids=_parse_id_file(target.path("/etc/passwd")),
            gids=_parse_id_file(target.path("/etc/group")),
        )

    def user_name(self, uid: int) -> str:
        return next((name for name, value in self.uids.items() if value == uid), str(uid))

    def group_name(self, gid: int) -> str:
        return next((name for name, value in self.gids.items() if value == gid), str(gid))


def _parse_id_file(path: Path) -> dict[str, int]:
    """name -> id from a passwd or group file (``name:x:id:...``); missing file: empty."""
    names: dict[str, int] = {}
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return names
    for line in text.splitlines():
        fields = line.split(":")
        if len(fields) >= 3 and fields[0] and fields[2].isdigit():
            names.setdefault(fields[0], int(fields[2]))
    return names


# --- Device nodes -----------------------------------------------------------------------


def npu_present(target: Target) -> bool:
    """A device node or a CDSP remoteproc: the machine has an NPU, working or not."""
    nodes = target.kernel_profile().nodes
    return any(os.path.exists(node) for node in nodes) or bool(find_cdsp_remoteprocs(target))


def check_device_nodes(target: Target, accounts: Accounts) -> list[Finding]:
    """Each configured node: present, a character device, and openable by the service.

    On ``/`` a node must be a character device. Under another root any file
    stands for one, since making device nodes needs privileges tests do not have.
    A machine with no node and no CDSP remoteproc has no NPU: one line says so.
    """
    nodes = target.kernel_profile().nodes
    usable = [node for node in nodes if os.path.exists(node)]
    if not usable and not find_cdsp_remoteprocs(target):
        # Not a fault: npud runs on its emulator here. On a laptop where this is
        # wrong, the CDSP remoteproc would exist (its line then says why).
        return [
            Finding(
                "device nodes",
                Status.SKIP,
                f"no NPU on this machine: none of {', '.join(nodes)} exists and there is "
                "no CDSP remoteproc",
            )
        ]
    findings = []
    for node in nodes:
        check = f"device node {node}"
        if os.path.exists(node):
            findings.append(_check_one_node(target, accounts, check, node))
        elif usable:
            findings.append(
                Finding(
                    check,
                    Status.WARN,
                    f"missing; npud uses {usable[0]} instead",
                    "the driver makes both CDSP nodes when the DSP boots: check "
                    "`dmesg | grep -i fastrpc`, then reboot",
                )
            )
        else:
            findings.append(
                Finding(
                    check,
                    Status.FAIL,
                    "missing: the CDSP is there but its FastRPC nodes are not (the DSP is down)",
                    "see the CDSP remoteproc line; the nodes appear when the DSP runs",
                )
            )
    return findings


def _check_one_node(target: Target, accounts: Accounts, check: str, node: str) -> Finding:
    try:
        st = os.stat(node)
    except OSError as exc:
        return Finding(check, Status.FAIL, f"cannot stat: {exc.strerror}", UDEV_FIX)
    if target.is_live and not stat.S_ISCHR(st.st_mode):
        return Finding(
            check,
            Status.FAIL,
            "exists but is not a character device (something created a file in its place)",
            f"sudo rm {node} and reboot, so the driver creates the node again",
        )
    mode = stat.S_IMODE(st.st_mode)
    owner = f"{accounts.user_name(st.st_uid)}:{accounts.group_name(st.st_gid)}"
    shown = f"{_node_kind(st)} {owner} {mode:04o}"
    you = (
        "you can open it too"
        if os.access(node, os.R_OK | os.W_OK)
        else "you cannot open it (not needed: clients go through npud)"
    )
    rw_group = stat.S_IRGRP | stat.S_IWGRP
    rw_other = stat.S_IROTH | stat.S_IWOTH
    if mode & rw_other == rw_other:
        return Finding(
            check,
            Status.WARN,
            f"{shown}: every user can open it and go around npud's access control",
            UDEV_FIX,
        )
    if st.st_gid == accounts.gids.get(CLIENT_GROUP) and mode & rw_group == rw_group:
        return Finding(
            check,
            Status.WARN,
            f"{shown}: every member of {CLIENT_GROUP} can open it and go around npud",
            UDEV_FIX,
        )
    service_can = (
        st.st_gid == accounts.gids.get(DEVICE_GROUP) and mode & rw_group == rw_group
    ) or (st.st_uid == accounts.uids.get(SERVICE_USER) and mode & 0o600 == 0o600)
    if service_can:
        return Finding(check, Status.OK, f"{shown}: the npud service can open it; {you}")
    if DEVICE_GROUP not in accounts.gids:
        why = f"group {DEVICE_GROUP} does not exist"
        fix = "sudo scripts/install.sh (creates it with systemd-sysusers), then " + UDEV_FIX
    else:
        why = f"needs group {DEVICE_GROUP} with read and write (0660)"
        fix = UDEV_FIX
    return Finding(check, Status.FAIL, f"{shown}: the npud service cannot open it ({why})", fix)


def _node_kind(st: os.stat_result) -> str:
    # On / anything else was refused before this is asked.
    return "character device" if stat.S_ISCHR(st.st_mode) else "file (a device under --root)"


# --- The CDSP remoteproc ----------------------------------------------------------------


def find_cdsp_remoteprocs(target: Target) -> list[Path]:
    """``/sys/class/remoteproc/remoteproc*`` of the CDSP, as scripts/deploy_npu.sh finds it.

    Recent kernels name it ``cdsp``; older ones name it after its platform
    device and only the firmware name says cdsp.
    """
    base = target.path("/sys/class/remoteproc")
    try:
        entries = sorted(base.glob("remoteproc*"), key=_remoteproc_number)
    except OSError:
        return []
    found = []
    for entry in entries:
        name = read_attribute(entry / "name") or ""
        firmware = read_attribute(entry / "firmware") or ""
        if "cdsp" in name or "cdsp" in firmware:
            found.append(entry)
    return found


def _remoteproc_number(path: Path) -> tuple[int, str]:
    suffix = path.name.removeprefix("remoteproc")
    return (int(suffix) if suffix.isdigit() else -1, path.name)


def _remoteproc_label(rproc: Path) -> str:
    return f"{rproc.name} ({read_attribute(rproc / 'name') or 'no name'})"


def check_remoteproc_state(target: Target) -> list[Finding]:
    check = "CDSP remoteproc"
    remoteprocs = find_cdsp_remoteprocs(target)
    if not remoteprocs:
        return [
            Finding(
                check,
                Status.FAIL,
                f"no remoteproc named cdsp under {target.path('/sys/class/remoteproc')}",
                "the kernel has not probed the CDSP: check the qcom_q6v5_pas module "
                "(`lsmod`, `dmesg | grep -i remoteproc`)",
            )
        ]
    findings = []
    for rproc in remoteprocs:
        label = _remoteproc_label(rproc)
        state = read_attribute(rproc / "state")
        if state in _LIVE_STATES:
            findings.append(Finding(check, Status.OK, f"{label}: {state}"))
            continue
        state_file = rproc / "state"
        fix = (
            f"echo start | sudo tee {state_file}; if it does not stay running, "
            "`dmesg | grep -i remoteproc` says why (often the firmware)"
        )
        if state == "crashed":
            fix = (
                f"the DSP crashed: echo stop | sudo tee {state_file}, then echo start; "
                "`dmesg | grep -i remoteproc` shows the crash reason"
            )
        shown = state if state is not None else "unreadable"
        findings.append(Finding(check, Status.FAIL, f"{label}: state {shown}, not running", fix))
    return findings


def check_runtime_pm(target: Target) -> list[Finding]:
    """power/control of the CDSP remoteproc must be "on" (the hardware notes)."""
    check = "CDSP runtime PM"
    remoteprocs = find_cdsp_remoteprocs(target)
    if not remoteprocs:
        return [Finding(check, Status.SKIP, "no CDSP remoteproc (see above)")]
    findings = []
    for rproc in remoteprocs:
        control_file = rproc / "power" / "control"
        control = read_attribute(control_file)
        label = _remoteproc_label(rproc)
        if control == "on":
            findings.append(
                Finding(check, Status.OK, f"{label}: power/control is on (runtime PM off)")
            )
            continue
        shown = f'"{control}"' if control is not None else "unreadable"
        findings.append(
            Finding(
                check,
                Status.FAIL,
                f"{label}: power/control is {shown}; the CDSP must not be runtime-suspended",
                f"echo on | sudo tee {control_file} (the udev rule from "
                "scripts/install.sh and scripts/deploy_npu.sh set it at every boot)",
            )
        )
    return findings


# --- CDSP firmware ----------------------------------------------------------------------


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


# --- Shell, key and libraries -----------------------------------------------------------


def check_signing_key(target: Target) -> tuple[Finding, bool]:
    """The kernel profile's public key; also whether the shell can be checked with it."""
    check = "shell signing key"
    profile = target.kernel_profile()
    path = profile.public_key_path
    if not os.path.lexists(path):
        # Said here rather than by load_public_key_file, which has no message for it.
        return (
            Finding(
                check,
                Status.FAIL,
                f"public key {path} does not exist",
                "install your key's public half: " + SIGNING_FIX,
            ),
            False,
        )
    try:
        key = load_public_key_file(path, trusted_uids=profile.trusted_uids)
    except ShellVerifyError as exc:
        detail, fix = _split_fix(exc.reason)
        return Finding(check, Status.FAIL, detail, fix or SIGNING_FIX), False
    if is_development_key(key):
        return (
            Finding(
                check,
                Status.FAIL,
                f"{path} is the development key, whose private half is public; "
                "npud refuses it on the device",
                "make your own key (npud-sign-shell genkey), sign the shell with it and "
                "install its .pub: " + SIGNING_FIX,
            ),
            False,
        )
    return Finding(
        check, Status.OK, f"{path}: Ed25519, fingerprint {key_fingerprint(key)[:16]}"
    ), True


def check_shell(target: Target, key_usable: bool) -> Finding:
    """The shell, its .sha256 and .sig: present, owned, not writable, matching, signed."""
    check = "DSP shell"
    profile = target.kernel_profile()
    if not key_usable:
        return Finding(
            check,
            Status.SKIP,
            f"{profile.shell_path} not checked: no usable signing key (see above)",
        )
    try:
        verified = profile.verify_shell()
    except ShellVerifyError as exc:
        detail, fix = _split_fix(exc.reason)
        return Finding(check, Status.FAIL, detail, fix or SIGNING_FIX)
    return Finding(
        check,
        Status.OK,
        f"{verified.path}: {verified.size} bytes, sha256 {verified.sha256[:16]}..., "
        "digest and signature valid",
    )


def _split_fix(reason: str) -> tuple[str, str]:
    """Shell verification messages end in "; fix: ..." where they know the fix."""
    detail, _, fix = reason.partition("; fix: ")
    return detail, fix


def check_qairt(target: Target) -> Finding:
    check = "QAIRT runtime"
    lib = target.path(target.qairt_root) / "lib"
    missing = [name for name in QAIRT_HOST_LIBRARIES if not (lib / name).is_file()]
    if not missing:
        return Finding(check, Status.OK, f"{lib}: {', '.join(QAIRT_HOST_LIBRARIES)}")
    return Finding(
        check,
        Status.FAIL,
        f"{lib} lacks {', '.join(missing)} (QAIRT_ROOT={target.qairt_root})",
        DEPLOY_FIX + " (or set QAIRT_ROOT to where the runtime is)",
    )


def check_dsp_libraries(target: Target) -> Finding:
    """The HTP skel in npud's DSP library path: what the DSP asks npud for."""
    check = "DSP libraries"
    directories = target.kernel_profile().library_path
    for directory in directories:
        if (directory / DSP_SKEL_LIBRARY).is_file():
            return Finding(check, Status.OK, f"{directory / DSP_SKEL_LIBRARY}")
    return Finding(
        check,
        Status.FAIL,
        f"{DSP_SKEL_LIBRARY} is in none of {', '.join(map(str, directories))} "
        "(npud's DSP library path)",
        DEPLOY_FIX,
    )


# --- The daemon -------------------------------------------------------------------------


def check_daemon(target: Target, *, timeout: float = 5.0) -> tuple[Finding, DaemonStatus | None]:
    """Connect to npud and report its status; say why and what to do when that fails."""
    check = "daemon"
    try:
        with npu_client.connect(target.socket, name="npud-doctor", timeout=timeout) as client:
            status = client.status()
    except npu_client.ConnectFailed as exc:
        return Finding(check, Status.FAIL, str(exc), connect_fix(exc.__cause__)), None
    except npu_client.NotPermitted as exc:
        fix = (
            f"add uid {os.getuid()} to [access] allow_uids (or a group to allow_gids) in "
            "/etc/npud/npud.toml, then sudo systemctl reload npud"
        )
        return Finding(check, Status.FAIL, f"npud refused this user: {exc}", fix), None
    except (npu_client.NpuError, OSError) as exc:
        return (
            Finding(
                check,
                Status.FAIL,
                f"npud at {target.socket} did not answer: {exc}",
                "systemctl status npud; journalctl -u npud -b",
            ),
            None,
        )
    return _judge_status(target, status), status


def _judge_status(target: Target, status: DaemonStatus) -> Finding:
    check = "daemon"
    others = max(status.totals.clients - 1, 0)  # the doctor's own connection is one
    shell = (
        f"shell verified (sha256 {status.shell.sha256[:16]}..., {status.shell.detail})"
        if status.shell.verified
        else f"shell NOT verified ({status.shell.detail or 'no detail'})"
    )
    device = f" on {status.device}" if status.device else ""
    if status.device and status.backend != "kernel" and EMULATED_SUFFIX not in status.device:
        device += f" {EMULATED_SUFFIX}"  # from a daemon that does not label it itself
    detail = (
        f"npud {status.daemon_version} at {target.socket}: backend {status.backend}{device}, "
        f"epoch {status.epoch}, {status.restarts} DSP restart(s), {others} other client(s), "
        f"{shell}"
    )
    if not status.shell.verified:
        return Finding(check, Status.FAIL, detail, "journalctl -u npud -b says why; " + SIGNING_FIX)
    emulated_by_choice = target.config.backend.kind == "emulator"
    if status.backend == "emulator" and npu_present(target) and not emulated_by_choice:
        return Finding(
            check,
            Status.WARN,
            detail + "; it runs on the emulator although this machine has an NPU",
            "it started before the CDSP was up (backend auto): sudo systemctl restart npud; "
            "the shipped unit runs --backend kernel to prevent this",
        )
    return Finding(check, Status.OK, detail)


def check_unsigned_pd(status: DaemonStatus) -> Finding | None:
    """WARN when the DSP answers UNSIGNED_PD_SUPPORT = 0 (None when it reported no
    capabilities). Advisory: libcdsprpc never reads the attribute, and npud asks for
    the unsigned PD anyway; a daemon that answers runs it, so the firmware accepted it."""
    dsp = status.dsp
    if not dsp.arch_ver:
        return None  # no capabilities reported (the DSP process is not up)
    check = "unsigned PD"
    if dsp.unsigned_pd_support:
        return Finding(check, Status.OK, f"the CDSP (Hexagon v{dsp.arch_ver:x}) has unsigned PDs")
    return Finding(
        check,
        Status.WARN,
        f"the CDSP firmware (Hexagon v{dsp.arch_ver:x}) answers UNSIGNED_PD_SUPPORT = 0, yet "
        "runs npud's unsigned PD (libcdsprpc never reads the attribute either)",
        'nothing while npud works; if a firmware update makes npud stop with "refused the '
        'unsigned PD", install a CDSP firmware with unsigned PD support',
    )


def connect_fix(cause: BaseException | None) -> str:
    """What to do about the OSError that stopped the connection."""
    if isinstance(cause, PermissionError):
        return (
            "add yourself to the socket's group: sudo usermod -aG npu $USER, then log in "
            "again (or run as a member of npu)"
        )
    if isinstance(cause, OSError) and cause.errno in (errno.ENOENT, errno.ECONNREFUSED):
        return (
            "npud is not running: sudo systemctl enable --now npud.socket (or start it by "
            "hand, `make run` in a checkout; --socket or NPUD_SOCKET if it listens elsewhere)"
        )
    return "systemctl status npud.socket npud.service; journalctl -u npud -b"
