"""Which driver npud runs on, and the shell, key and library path that go with it.

``auto`` picks the kernel driver where a CDSP device node exists and the
emulator otherwise. The two profiles differ in what they trust:

* kernel: the shell and key installed under /usr/lib/dsp and /etc/npud, owned
  by root; the development key is refused (its private half is public).
* emulator: the development shell and key that ship with npud; files owned by
  root or by the user running npud are accepted, so a developer's checkout works.

Importing this module loads neither the emulator nor ``cryptography``: the
kernel profile never needs the first, and the daemon checks the shell's
signature in a child process (:meth:`Profile.lend_verifier`). Nor the driver
and shell code, which :meth:`Profile.make_driver` and :meth:`Profile.verify_shell`
import: choosing a profile costs nothing, so ``npud`` starts the emulator's
zygote before it imports them (:meth:`Profile.zygote_started`).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from npud.fastrpc.trust.shell_verifier import ShellVerifier
from npud.ops.config import (
    DEFAULT_KERNEL_LIBRARY_PATH,
    DEFAULT_KERNEL_PUBLIC_KEY,
    DEFAULT_KERNEL_SHELL,
    Config,
)

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

    from npud.fastrpc.kernel.driver import Driver
    from npud.fastrpc.recording.trace import TraceWriter
    from npud.fastrpc.trust.shell import VerifiedShell

BackendKind = Literal["kernel", "emulator"]

EMULATED_SUFFIX = "(emulated)"
"""Appended to the emulator's device node wherever it is shown (:meth:`Profile.device_label`)."""

DEV_SHELL_DIR = Path(__file__).resolve().parent.parent / "devshell"
DEV_SHELL = DEV_SHELL_DIR / "fastrpc_shell_unsigned_3"
DEV_PUBLIC_KEY = DEV_SHELL_DIR / "shell-signing.pub"


class EmulatorStartError(Exception):
    """The emulator cannot start as ``[emulator]`` says (an unknown ``pd_user``...)."""


class _VerifierSlot:
    """At most one lent ShellVerifier, until a verification takes it."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._verifier: ShellVerifier | None = None

    def put(self, verifier: ShellVerifier) -> None:
        with self._lock:
            self._verifier = verifier

    def take(self) -> ShellVerifier | None:
        with self._lock:
            verifier, self._verifier = self._verifier, None
        return verifier


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
    emulator_hmx_units: int = 0
    """The emulated DSP's HMX units (``[emulator] hmx_units``)."""
    emulator_report_dsp_time: bool = True
    """dspqueue answers report their DSP time (``[emulator] report_dsp_time``)."""
    emulator_pd_isolation: Literal["process", "thread"] = "process"
    emulator_pd_user: str = "nobody"
    emulator_pd_memory_limit: int = 4 << 30
    emulator_dma_heap: bool = True
    emulator_unsigned_pd_support: bool = True
    emulator_domain_handles: bool = True
    emulator_absent_module_result: int = 0x8000043E
    emulator_loader_probes: tuple[str, ...] = ()
    _verifier: _VerifierSlot = field(default_factory=_VerifierSlot, compare=False, repr=False)
    trace: TraceWriter | None = None
    """Where every Driver call is recorded (``npud --trace``); the caller owns the writer."""

    def device_label(self, node: str) -> str:
        """How status and logs name the device node in use.

        The emulator opens the real nodes' names (the session code is the same on
        both), but no such node exists: say so, so no one looks for it in /dev.
        """
        if self.kind == "kernel" or not node:
            return node
        return f"{node} {EMULATED_SUFFIX}"

    def make_driver(self) -> Driver:
        driver = self._make_driver()
        if self.trace is None:
            return driver
        from npud.fastrpc.recording.trace import TracingDriver  # noqa: PLC0415  (only when tracing)

        return TracingDriver(driver, self.trace)

    def _make_driver(self) -> Driver:
        if self.kind == "kernel":
            from npud.fastrpc.kernel.driver import KernelDriver  # noqa: PLC0415  (see the docstring)

            return KernelDriver()
        from npud.sim import EmulatedDriver, SimConfig  # noqa: PLC0415  (not on a device)

        try:
            return EmulatedDriver(
                SimConfig(
                    dsp_units=self.emulator_dsp_units,
                    hmx_units=self.emulator_hmx_units,
                    report_dsp_time=self.emulator_report_dsp_time,
                    pd_isolation=self.emulator_pd_isolation,
                    pd_user=self.emulator_pd_user,
                    pd_memory_limit=self.emulator_pd_memory_limit,
                    dma_heap=self.emulator_dma_heap,
                    # 0 answers UNSIGNED_PD_SUPPORT as a firmware without unsigned PDs does.
                    capabilities={} if self.emulator_unsigned_pd_support else {1: 0},
                    domain_handles=self.emulator_domain_handles,
                    absent_module_result=self.emulator_absent_module_result,
                    loader_probes=self.emulator_loader_probes,
                )
            )
        except (ValueError, OSError) as exc:
            raise EmulatorStartError(f"[emulator]: {exc}") from exc

    def fault_methods(self, uri: str) -> frozenset[int]:
        """The invoke methods of the module ``uri`` names that crash its DSP process on
        purpose: the emulator's fault injection (:mod:`npud.sim.fault_methods`); none on
        the kernel backend. Reads the module's descriptor: call it on a lane."""
        if self.kind != "emulator":
            return frozenset()
        from npud.sim.fault_methods import fault_methods  # noqa: PLC0415  (not on a device)

        return fault_methods(uri, self.library_path)

    @contextmanager
    def zygote_started(self) -> Iterator[None]:
        """On the emulator with PD processes (``pd_isolation = "process"``), its zygote
        started now, for the time of the ``with``: the zygote's interpreter and imports
        (numpy, the skels, onnxruntime) then overlap the daemon's own imports, and the
        driver made later shares it (:func:`npud.sim.pd_host.acquire_zygote`). Nothing
        on a device or with PD threads. A ``pd_user`` that does not resolve starts
        nothing here: :meth:`make_driver` reports it."""
        if self.kind != "emulator" or self.emulator_pd_isolation != "process":
            yield
            return
        from npud.sim.pd_host import acquire_zygote  # noqa: PLC0415  (not on a device)

        try:
            lease = acquire_zygote(self.emulator_pd_user)
        except (ValueError, OSError):
            yield  # make_driver raises the same as an EmulatorStartError
            return
        try:
            yield
        finally:
            lease.release()

    def lend_verifier(self, verifier: ShellVerifier) -> None:
        """A verifier started earlier, for the next :meth:`verify_shell` to use up.
        The lender keeps ownership: it closes it if it was never used."""
        self._verifier.put(verifier)

    def verify_shell(self) -> VerifiedShell:
        """Verify the shell with the profile's key, the signature checked in a child
        process (a lent one, or one started now); ShellVerifyError on any problem
        (fail closed)."""
        from npud.fastrpc.trust.shell import verify_shell_isolated  # noqa: PLC0415  (the docstring)

        return verify_shell_isolated(
            self.shell_path,
            public_key_path=self.public_key_path,
            trusted_uids=self.trusted_uids,
            refuse_development_key=not self.allow_development_key,
            verifier=self._verifier.take(),
        )

    def load_public_key(self) -> Ed25519PublicKey:
        """The profile's key, parsed in this process (loads ``cryptography``: tools only)."""
        from npud.fastrpc.trust.shell import (  # noqa: PLC0415  (see the module docstring)
            development_key_refused,
            is_development_key,
            load_public_key_file,
        )

        key = load_public_key_file(self.public_key_path, trusted_uids=self.trusted_uids)
        if is_development_key(key) and not self.allow_development_key:
            raise development_key_refused(str(self.public_key_path))
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
    from npud.sim import DSP_LIBRARY_DIR  # noqa: PLC0415  (a path; the emulator loads later)

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
        emulator_hmx_units=config.emulator.hmx_units,
        emulator_report_dsp_time=config.emulator.report_dsp_time,
        emulator_pd_isolation=config.emulator.pd_isolation,
        emulator_pd_user=config.emulator.pd_user,
        emulator_pd_memory_limit=config.emulator.pd_memory_limit,
        emulator_dma_heap=config.emulator.dma_heap,
        emulator_unsigned_pd_support=config.emulator.unsigned_pd_support,
        emulator_domain_handles=config.emulator.domain_handles,
        emulator_absent_module_result=config.emulator.absent_module_result,
        emulator_loader_probes=config.emulator.loader_probes,
    )
