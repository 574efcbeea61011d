"""Which driver npud runs on, and the shell, key and library path that go with it.

``auto`` picks the kernel driver where a CDSP device node exists and the
emulator otherwise. The two profiles differ in what they trust:

* kernel: the shell and key installed under /usr/lib/dsp and /etc/npud, owned
  by root; the development key is refused (its private half is public).
* emulator: the development shell and key that ship with npud; files owned by
  root or by the user running npud are accepted, so a developer's checkout works.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from npud.config import (
    DEFAULT_KERNEL_LIBRARY_PATH,
    DEFAULT_KERNEL_PUBLIC_KEY,
    DEFAULT_KERNEL_SHELL,
    Config,
)
from npud.fastrpc.driver import Driver, KernelDriver
from npud.fastrpc.errors import ShellVerifyError
from npud.fastrpc.shell import (
    VerifiedShell,
    is_development_key,
    load_public_key_file,
    verify_shell,
)
from npud.sim import DSP_LIBRARY_DIR, EmulatedDriver, SimConfig

BackendKind = Literal["kernel", "emulator"]

EMULATED_SUFFIX = "(emulated)"
"""Appended to the emulator's device node wherever it is shown (:meth:`Profile.device_label`)."""

DEV_SHELL_DIR = Path(__file__).resolve().parent / "devshell"
DEV_SHELL = DEV_SHELL_DIR / "fastrpc_shell_unsigned_3"
DEV_PUBLIC_KEY = DEV_SHELL_DIR / "shell-signing.pub"


@dataclass(frozen=True)
class Profile:
    kind: BackendKind
    reason: str
    """Why this backend was chosen, for the log and for status."""
    nodes: tuple[str, ...]
    library_path: tuple[Path, ...]
    shell_path: Path
    public_key_path: Path
    trusted_uids: frozenset[int]
    allow_development_key: bool
    emulator_dsp_units: int = 0
    """The emulated DSP's shared execution units (``[emulator] dsp_units``)."""

    def device_label(self, node: str) -> str:
        """How status and logs name the device node in use.

        The emulator opens the real nodes' names (the session code is the same on
        both), but no such node exists: say so, so no one looks for it in /dev.
        """
        if self.kind == "kernel" or not node:
            return node
        return f"{node} {EMULATED_SUFFIX}"

    def make_driver(self) -> Driver:
        if self.kind == "kernel":
            return KernelDriver()
        return EmulatedDriver(SimConfig(dsp_units=self.emulator_dsp_units))

    def verify_shell(self) -> VerifiedShell:
        """Load the key and verify the shell; ShellVerifyError on any problem (fail closed)."""
        key = self.load_public_key()
        return verify_shell(self.shell_path, public_key=key, trusted_uids=self.trusted_uids)

    def load_public_key(self) -> Ed25519PublicKey:
        key = load_public_key_file(self.public_key_path, trusted_uids=self.trusted_uids)
        if is_development_key(key) and not self.allow_development_key:
            raise ShellVerifyError(
                f"{self.public_key_path} is the development key, whose private half is public; "
                "the kernel backend refuses it: install the real shell-signing key"
            )
        return key


def device_present(nodes: tuple[str, ...]) -> bool:
    return any(os.path.exists(node) for node in nodes)


def select_profile(config: Config, override: str | None = None) -> Profile:
    """The profile for ``--backend`` (``override``) or the config's ``backend.kind``."""
    requested = override or config.backend.kind
    nodes = config.backend.nodes
    if requested == "auto":
        if device_present(nodes):
            kind: BackendKind = "kernel"
            reason = f"auto: found {', '.join(n for n in nodes if os.path.exists(n))}"
        else:
            kind = "emulator"
            reason = f"auto: no FastRPC device node ({', '.join(nodes)}); using the emulator"
    elif requested in ("kernel", "emulator"):
        kind = "kernel" if requested == "kernel" else "emulator"
        reason = f"{requested} requested"
    else:
        raise ValueError(f"unknown backend {requested!r}")

    shell_cfg = config.shell
    if kind == "kernel":
        return Profile(
            kind=kind,
            reason=reason,
            nodes=nodes,
            library_path=tuple(
                Path(p) for p in (config.backend.library_path or DEFAULT_KERNEL_LIBRARY_PATH)
            ),
            shell_path=Path(shell_cfg.path or DEFAULT_KERNEL_SHELL),
            public_key_path=Path(shell_cfg.public_key or DEFAULT_KERNEL_PUBLIC_KEY),
            trusted_uids=frozenset(shell_cfg.trusted_uids),
            allow_development_key=False,
        )
    return Profile(
        kind=kind,
        reason=reason,
        nodes=nodes,
        library_path=(DSP_LIBRARY_DIR, *(Path(p) for p in config.backend.library_path)),
        shell_path=Path(shell_cfg.path) if shell_cfg.path else DEV_SHELL,
        public_key_path=Path(shell_cfg.public_key) if shell_cfg.public_key else DEV_PUBLIC_KEY,
        trusted_uids=frozenset(shell_cfg.trusted_uids) | {os.getuid()},
        allow_development_key=True,
        emulator_dsp_units=config.emulator.dsp_units,
    )
