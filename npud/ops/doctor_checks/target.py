"""The installation ``npud doctor`` looks at and what it reports: the target tree
(:class:`Target`), its accounts, a finding's status and fix, and the names the
deployment fixes (the device group, the service user, the fix texts).
"""

from __future__ import annotations

import enum
import grp
import os
import pwd
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Final, Protocol

from npud.ops.backend import Profile, select_profile
from npud.ops.config import Config

DEVICE_GROUP: Final = "fastrpc"
"""Owns the device nodes (udev rule); the npud service has it as a supplementary group."""
SERVICE_USER: Final = "npud"
CLIENT_GROUP: Final = "npu"
"""The service's primary group and the clients' group: a node it may open is open to clients."""
DEFAULT_QAIRT_ROOT: Final = "/opt/qcom/qairt/2.44"
DEPLOY_FIX: Final = "restore the NPU software from a snapshot: sudo scripts/deploy_npu.sh SNAPSHOT"
SIGNING_FIX: Final = (
    "sign the shell with npud-sign-shell sign and install the files with "
    "sudo scripts/install.sh --signing-dir DIR (docs/deploy.md, step 1)"
)
UDEV_FIX: Final = (
    "install the udev rule (sudo scripts/install.sh), then sudo udevadm trigger "
    "--subsystem-match=misc"
)


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
