"""A fake root of a healthy NPU laptop for ``npud doctor``, and ways to break it.

The tree holds what doctor reads: ``/dev`` (the two nodes, as plain files:
doctor accepts any file under a root other than /), ``/sys/class/remoteproc``
(an adsp and the cdsp), the CDSP firmware image with its version string, the
signed shell with its key, the DSP and QAIRT libraries, ``/etc/passwd`` and
``/etc/group`` with the npud user and the fastrpc and npu groups, and
``/etc/npud/npud.toml`` trusting the files' owner.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from npud.fastrpc.trust.shell import public_key_hex
from npud.ops.doctor import Report, diagnose
from npud.ops.doctor_checks import KNOWN_GOOD_FIRMWARE, Finding, Status
from npud.ops.sign_shell import sign_shell_file

FIRMWARE_NAME = "qcom/x1e80100/LENOVO/21N1/qccdsp8380.mbn"
SHELL = "/usr/lib/dsp/cdsp/fastrpc_shell_unsigned_3"
PUBLIC_KEY = "/etc/npud/shell-signing.pub"
CONFIG = "/etc/npud/npud.toml"
NODES = ("/dev/fastrpc-cdsp-secure", "/dev/fastrpc-cdsp")
CDSP = "/sys/class/remoteproc/remoteproc1"
QAIRT_LIB = "/opt/qcom/qairt/2.44/lib"
QAIRT_LIBRARIES = ("libQnnHtp.so", "libQnnSystem.so", "libQnnHtpV73Stub.so")
SKEL = "/usr/lib/dsp/cdsp/libQnnHtpV73Skel.so"
SHELL_BYTES = b"\x7fELF\x02\x01\x01" + b"hexagon shell " * 200

# Ids that are not the test's own: the npud user and the npu group.
MY_UID = os.getuid()
MY_GID = os.getgid()
OTHER_UID = MY_UID + 4321
NPU_GID = MY_GID + 4321


def firmware_image(version: str | None, *, padding: int = 5000) -> bytes:
    """Bytes shaped like a signed image: the version string somewhere in the middle."""
    body = b"\x7fELF" + bytes(range(256)) * (padding // 256 + 1)
    marker = b"" if version is None else b"QC_IMAGE_VERSION_STRING=" + version.encode() + b"\0"
    return body + b"OEM_IMAGE_VERSION_STRING=ignored\0" + marker + body


@dataclass
class FakeTree:
    root: Path
    signing_key: Ed25519PrivateKey = field(default_factory=Ed25519PrivateKey.generate)

    def path(self, system_path: str) -> Path:
        return self.root / system_path.lstrip("/")

    def write(self, system_path: str, data: bytes | str, mode: int = 0o644) -> Path:
        target = self.path(system_path)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data.encode() if isinstance(data, str) else data)
        target.chmod(mode)
        return target

    # --- the pieces -----------------------------------------------------------------

    def write_config(self, text: str = "") -> None:
        uids = sorted({0, MY_UID})
        self.write(CONFIG, f"[shell]\ntrusted_uids = {uids}\n{text}")

    def write_accounts(self, *, fastrpc: bool = True) -> None:
        groups = f"npu:x:{NPU_GID}:\n"
        if fastrpc:
            groups = f"fastrpc:x:{MY_GID}:npud\n" + groups
        self.write("/etc/group", groups)
        self.write(
            "/etc/passwd",
            "root:x:0:0::/root:/bin/sh\n"
            f"npud:x:{OTHER_UID}:{NPU_GID}::/nonexistent:/usr/sbin/nologin\n",
        )

    def write_remoteproc(
        self,
        directory: str,
        *,
        name: str,
        firmware: str,
        state: str = "running",
        control: str = "on",
    ) -> None:
        self.write(f"{directory}/name", name + "\n")
        self.write(f"{directory}/firmware", firmware + "\n")
        self.write(f"{directory}/state", state + "\n")
        self.write(f"{directory}/power/control", control + "\n")

    def write_firmware(self, version: str | None, base: str = "/usr/lib/firmware") -> Path:
        return self.write(f"{base}/{FIRMWARE_NAME}", firmware_image(version))

    def write_shell(self, data: bytes = SHELL_BYTES) -> None:
        shell = self.write(SHELL, data)
        sign_shell_file(shell, self.signing_key)

    def write_public_key(self, key_hex: str | None = None) -> None:
        text = key_hex or public_key_hex(self.signing_key.public_key())
        self.write(PUBLIC_KEY, text + "\n")

    # --- running doctor -------------------------------------------------------------

    def diagnose(self, socket: Path | None = None, **environ: str) -> Report:
        """Doctor on this tree; without ``socket`` it looks for daemon.socket in the tree."""
        return diagnose(
            self.root, socket=str(socket) if socket else None, environ=environ, timeout=10.0
        )


def healthy_tree(root: Path) -> FakeTree:
    tree = FakeTree(root)
    for node in NODES:
        tree.write(node, b"", mode=0o660)
    tree.write_accounts()
    tree.write_config()
    tree.write_remoteproc(
        "/sys/class/remoteproc/remoteproc0",
        name="adsp",
        firmware="qcom/x1e80100/LENOVO/21N1/qcadsp8380.mbn",
        control="auto",  # not the CDSP: doctor must leave it alone
    )
    tree.write_remoteproc(CDSP, name="cdsp", firmware=FIRMWARE_NAME)
    tree.write_firmware(KNOWN_GOOD_FIRMWARE)
    tree.write_shell()
    tree.write_public_key()
    tree.write(SKEL, b"\x7fELF skel")
    for name in QAIRT_LIBRARIES:
        tree.write(f"{QAIRT_LIB}/{name}", b"\x7fELF lib")
    return tree


def by_check(report: Report) -> dict[str, list[Finding]]:
    found: dict[str, list[Finding]] = {}
    for finding in report.findings:
        found.setdefault(finding.check, []).append(finding)
    return found


def only(report: Report, check: str) -> Finding:
    findings = by_check(report)[check]
    assert len(findings) == 1, findings
    return findings[0]


def not_ok(report: Report) -> dict[str, Status]:
    """The checks that did not pass, except the daemon (absent unless a test starts one)."""
    return {
        f.check: f.status
        for f in report.findings
        if f.status is not Status.OK and f.check != "daemon"
    }
