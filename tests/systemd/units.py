"""Read systemd unit files and the sysusers.d/tmpfiles.d/udev files next to them.

A unit file is INI-like but not INI: a key may repeat (``DeviceAllow=`` twice)
and an empty assignment is meaningful (``CapabilityBoundingSet=``), so
configparser does not fit. These readers keep every assignment in order.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SYSTEMD_DIR = REPO / "systemd"
SERVICE = SYSTEMD_DIR / "npud.service"
SOCKET = SYSTEMD_DIR / "npud.socket"
SYSUSERS = SYSTEMD_DIR / "sysusers.d" / "npud.conf"
TMPFILES = SYSTEMD_DIR / "tmpfiles.d" / "npud.conf"
UDEV_RULES = SYSTEMD_DIR / "udev" / "90-npud-fastrpc.rules"
INSTALL_SCRIPT = REPO / "scripts" / "install.sh"

_SECTION = re.compile(r"^\[(?P<name>[A-Za-z]+)\]$")
_ASSIGNMENT = re.compile(r"^(?P<key>[A-Za-z][A-Za-z0-9]*)=(?P<value>.*)$")


@dataclass(frozen=True)
class Unit:
    path: Path
    assignments: tuple[tuple[str, str, str], ...]
    """(section, key, value) in file order."""

    def values(self, section: str, key: str) -> list[str]:
        return [v for s, k, v in self.assignments if s == section and k == key]

    def value(self, section: str, key: str) -> str:
        """The one value of ``key``; fails if it is missing or repeated."""
        found = self.values(section, key)
        assert len(found) == 1, f"{self.path.name}: [{section}] {key}= set {len(found)} times"
        return found[0]


def read_unit(path: Path) -> Unit:
    section = ""
    assignments: list[tuple[str, str, str]] = []
    for number, raw in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        assert not line.endswith("\\"), f"{path.name}:{number}: continuation lines not expected"
        if match := _SECTION.match(line):
            section = match["name"]
            continue
        match = _ASSIGNMENT.match(line)
        assert match, f"{path.name}:{number}: not an assignment: {raw!r}"
        assert section, f"{path.name}:{number}: assignment before any section"
        assignments.append((section, match["key"], match["value"].strip()))
    return Unit(path, tuple(assignments))


def config_lines(path: Path) -> list[list[str]]:
    """Non-comment lines of a sysusers.d/tmpfiles.d file, split like the tools split them."""
    lines = []
    for raw in path.read_text(encoding="utf-8").splitlines():
        line = raw.strip()
        if line and not line.startswith("#"):
            lines.append(shlex.split(line))
    return lines


def seconds(value: str) -> float:
    """A systemd time span of the simple forms used in these units: ``20s``, ``2min``, ``30``."""
    match = re.fullmatch(r"(\d+(?:\.\d+)?)(s|min|ms)?", value)
    assert match, f"unexpected time span {value!r}"
    scale = {"s": 1.0, None: 1.0, "min": 60.0, "ms": 0.001}[match[2]]
    return float(match[1]) * scale


def install_script_venv() -> str:
    """The venv directory install.sh creates (``readonly VENV_DIR=...``)."""
    match = re.search(
        r"^readonly VENV_DIR=(\S+)$", INSTALL_SCRIPT.read_text(encoding="utf-8"), re.M
    )
    assert match, "install.sh no longer defines VENV_DIR"
    return match[1]
