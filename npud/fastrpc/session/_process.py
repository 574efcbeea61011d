"""The shell: creating the DSP process from the verified shell (INIT_CREATE) with its
reverse-RPC listener, and ending it (adsp_current_process1.exit)."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Final

from npu_protocol import AEE, ErrorCode
from npud import idl
from npud.fastrpc.kernel import abi
from npud.fastrpc.kernel.capabilities import DspInfo
from npud.fastrpc.kernel.dma import DmaBuffer
from npud.fastrpc.kernel.errors import RpcError
from npud.fastrpc.reverse.apps_mem import AppsMemServer
from npud.fastrpc.reverse.apps_std import AppsStdServer
from npud.fastrpc.reverse.exposed_files import ExposedFiles
from npud.fastrpc.reverse.listener import ReverseRpcListener
from npud.fastrpc.reverse.reverse_modules import ReverseModules
from npud.fastrpc.session._buffers import Buffers
from npud.fastrpc.session._device import Device
from npud.fastrpc.session._invoke import Invoker
from npud.fastrpc.session._life import Life
from npud.fastrpc.session._log import log
from npud.fastrpc.session._mappings import Mappings
from npud.fastrpc.session._reverse_host import ReverseHost
from npud.fastrpc.session._trace import SessionTrace

# FASTRPC_MODE_UNSIGNED_MODULE: load the shell as the unsigned PD, which may
# run skels not signed for this device (ours).
DEFAULT_PROCESS_ATTRS: Final = abi.FASTRPC_MODE_UNSIGNED_MODULE
EXIT_SC: Final = idl.load("adsp_current_process1").method("exit").sc  # 0x02000000
LISTENER_JOIN_TIMEOUT: Final = 10.0  # the kernel's own timeout for internal calls
CRASH_NOTICE_SECONDS: Final = 0.2
"""How long a call that answered AEE_EBADSTATE waits for the listener to stop, the sign
that its DSP process ended under it."""


class Process:
    """The DSP process of the session: created once from the shell (with its reverse-RPC
    listener and the reverse modules it serves), ended once. Owns the shell's buffer, the
    listener's thread and the reverse host's shared files until :meth:`take_all`."""

    def __init__(
        self,
        device: Device,
        life: Life,
        buffers: Buffers,
        mappings: Mappings,
        invoker: Invoker,
        exposed: ExposedFiles,
        *,
        capabilities: DspInfo,
        library_path: Sequence[Path],
        trace: SessionTrace,
    ) -> None:
        self._device = device
        self._life = life
        self._buffers = buffers
        self._mappings = mappings
        self._invoker = invoker
        self._exposed = exposed
        self._capabilities = capabilities
        self._library_path = tuple(library_path)
        self._trace = trace
        self._load_lock = threading.Lock()  # INIT_CREATE runs once
        self._shell: DmaBuffer | None = None
        self._listener: ReverseRpcListener | None = None
        self._apps_std: AppsStdServer | None = None
        self._host: ReverseHost | None = None

    @property
    def listener(self) -> ReverseRpcListener | None:
        return self._listener

    @property
    def apps_std(self) -> AppsStdServer | None:
        return self._apps_std

    @property
    def host(self) -> ReverseHost | None:
        return self._host

    def load(self, shell: bytes, attrs: int) -> None:
        """INIT_CREATE from ``shell`` and the listener started (see
        FastRpcSession.load_shell); loading twice is a no-op."""
        with self._load_lock:
            self._life.check_usable()
            if self._shell is not None:
                return
            if not shell:
                raise RpcError(ErrorCode.SHELL_VERIFY, reason="the shell image is empty")
            if len(shell) > abi.INIT_FILELEN_MAX:
                raise RpcError(
                    ErrorCode.SHELL_VERIFY,
                    reason=f"the shell is {len(shell)} bytes; the kernel accepts at most "
                    f"{abi.INIT_FILELEN_MAX}",
                )
            said_none = self._check_unsigned_pd(attrs)
            buffer = self._buffers.allocate(len(shell))
            try:
                buffer.view()[: len(shell)] = shell
                create = abi.fastrpc_init_create(
                    filelen=len(shell),
                    filefd=buffer.fd,
                    attrs=attrs,
                    siglen=0,
                    file=buffer.host_address,
                )
                rc = self._device.ioctl(abi.FASTRPC_IOCTL_INIT_CREATE, create)
                if rc != 0:
                    if said_none:
                        raise self._unsigned_pd_refused(rc)
                    raise RpcError(ErrorCode.FASTRPC, rc=rc)
                host = ReverseHost(self._device, self._buffers, self._mappings)
                apps_std = AppsStdServer(self._library_path, self._exposed, sharing=host)
                modules = ReverseModules(
                    [apps_std, AppsMemServer(host)], observer=self._trace.observer(apps_std)
                )
                listener = ReverseRpcListener(
                    self._trace.listener_invoke(self._invoker.invoke),
                    modules,
                    on_stopped=self._listener_stopped,
                )
                try:
                    listener.start()
                except BaseException:
                    self.exit()  # undo INIT_CREATE
                    raise
            except BaseException:
                self._buffers.discard(buffer)
                raise
            self._shell = buffer
            self._listener = listener
            self._apps_std = apps_std
            self._host = host
            self._life.loaded()
        log.info("DSP process created", extra={"shell_bytes": len(shell), "attrs": f"0x{attrs:x}"})

    def _check_unsigned_pd(self, attrs: int) -> bool:
        """True (with a warning in the log) when the unsigned PD is asked for on a DSP
        whose firmware answers UNSIGNED_PD_SUPPORT = 0. Advisory only: libcdsprpc never
        reads the attribute (only Qualcomm's sample apps do), so the INIT_CREATE goes
        ahead as it does for every other program; if the firmware then refuses it,
        :meth:`_unsigned_pd_refused` says why. A DSP without the capability API cannot
        say, so it is asked anyway too."""
        if not attrs & abi.FASTRPC_MODE_UNSIGNED_MODULE:
            return False
        if not self._capabilities.available or self._capabilities.unsigned_pd:
            return False
        log.warning(
            "the CDSP firmware answers UNSIGNED_PD_SUPPORT = 0; asking for the unsigned PD "
            "anyway, as libcdsprpc does (it never reads the attribute)",
            extra={"device": self._device.name, "arch": self._capabilities.arch},
        )
        return True

    def _unsigned_pd_refused(self, rc: int) -> RpcError:
        """The INIT_CREATE of the unsigned PD failed with ``rc`` on a firmware that
        answers UNSIGNED_PD_SUPPORT = 0: the firmware has none."""
        return RpcError(
            ErrorCode.UNSUPPORTED,
            what=(
                f"the unsigned PD: the CDSP firmware on {self._device.name} (Hexagon "
                f"{self._capabilities.arch}) answers UNSIGNED_PD_SUPPORT = 0 and refused "
                f"the unsigned PD (result 0x{rc:08X}), so it cannot run unsigned skels such "
                "as npud's; install a CDSP firmware with unsigned PD support (npud doctor "
                "shows the firmware in use)"
            ),
        )

    def exit(self) -> None:
        """Ask the DSP process to exit (adsp_current_process1.exit); best effort.

        Sent even when the session believes the DSP restarted: on a real restart it
        fails at once (EPIPE), and a DSP result of -32 that only looked like EPIPE
        must not leave the listener blocked in next2 forever.
        """
        self._life.ended()
        invoke = abi.fastrpc_invoke(handle=abi.ADSP_CURRENT_PROCESS1_HANDLE, sc=EXIT_SC, args=0)
        try:
            rc = self._device.ioctl(abi.FASTRPC_IOCTL_INVOKE, invoke)
            if rc != 0:
                log.warning("DSP process exit refused", extra={"result": f"0x{rc:08X}"})
        except RpcError as exc:
            if not self._life.dead:
                log.warning("DSP process exit failed", extra={"error": str(exc)})

    def end(self, listener: ReverseRpcListener) -> bool:
        """End the DSP process, which completes the listener's pending next2, and join it.

        Returns False when the listener thread is still running after the wait.
        """
        self.exit()
        if listener.join(LISTENER_JOIN_TIMEOUT):
            return True
        log.error("reverse-RPC listener did not stop", extra={"timeout_s": LISTENER_JOIN_TIMEOUT})
        return False

    def take_all(self) -> tuple[DmaBuffer | None, ReverseRpcListener | None]:
        """At close: the shell's buffer and the listener, handed to the closer (which
        ends the process, then takes the shared files)."""
        shell, self._shell = self._shell, None
        listener, self._listener = self._listener, None
        self._life.unloaded()
        return shell, listener

    def take_shared(self) -> list[DmaBuffer]:
        """At close, once the listener stopped sharing: the files it shared."""
        return self._host.take_all() if self._host is not None else []

    def crashed_under(self, rc: int) -> bool:
        """True when a call that answered ``rc`` met its DSP process's end: AEE_EBADSTATE,
        and the listener (whose pending next2 the end completes too) stops right after.
        A skel's own AEE_EBADSTATE leaves the listener running: that waits
        :data:`CRASH_NOTICE_SECONDS` once, on an error path."""
        listener = self._listener
        if rc != AEE.EBADSTATE.dsp or listener is None or self._life.process_ended:
            return False
        listener.join(CRASH_NOTICE_SECONDS)
        return self._life.dead

    def _listener_stopped(self, reason: str) -> None:
        """The listener's thread: it stopped serving. Unless this session asked its DSP
        process to exit (or is closing), the process ended on its own (it crashed, or
        the DSP killed it): as after a restart, everything it held is gone."""
        if self._life.process_ended or self._life.closing:
            return
        log.warning("DSP process ended on its own", extra={"reason": reason})
        self._life.mark_dead(f"the DSP process ended on its own ({reason})", channel_lost=False)
