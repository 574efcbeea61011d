"""The shell: creating the DSP process from the verified shell (INIT_CREATE) with its
reverse-RPC listener, and ending it (adsp_current_process1.exit)."""

from __future__ import annotations

import hashlib
from typing import Final

from npu_protocol import ErrorCode
from npud import idl
from npud.fastrpc.kernel import abi
from npud.fastrpc.kernel.errors import RpcError
from npud.fastrpc.reverse.apps_mem import AppsMemServer
from npud.fastrpc.reverse.apps_std import AppsStdServer
from npud.fastrpc.reverse.listener import ReverseRpcListener
from npud.fastrpc.reverse.reverse_modules import ReverseModules
from npud.fastrpc.session._exposed import Exposing
from npud.fastrpc.session._reverse_host import ReverseHost
from npud.fastrpc.session._state import log

# FASTRPC_MODE_UNSIGNED_MODULE: load the shell as the unsigned PD, which may
# run skels not signed for this device (ours).
DEFAULT_PROCESS_ATTRS: Final = abi.FASTRPC_MODE_UNSIGNED_MODULE
EXIT_SC: Final = idl.load("adsp_current_process1").method("exit").sc  # 0x02000000
LISTENER_JOIN_TIMEOUT: Final = 10.0  # the kernel's own timeout for internal calls


class Process(Exposing):
    """The DSP process of the session: created once, ended once."""

    @property
    def shell_loaded(self) -> bool:
        return self._shell is not None

    def load_shell(self, shell: bytes, *, attrs: int = DEFAULT_PROCESS_ATTRS) -> None:
        """Create the DSP process from ``shell`` and start the reverse-RPC listener.

        ``shell`` must be the bytes returned by ``verify_shell_binary``: exactly
        those bytes go to the DSP. Sequence: bound the size → allocate a DMA-BUF
        and map it → copy → INIT_CREATE → start the listener. Any failure undoes
        what was done, in reverse order. On success the shell buffer is kept for
        the session's lifetime (the kernel maps it into the process; when the
        DSP reads it is driver-specific). Loading twice is a no-op.
        """
        self._traced(
            "load_shell",
            lambda: {
                "size": len(shell),
                "sha256": hashlib.sha256(shell).hexdigest(),
                "attrs": attrs,
            },
            lambda: self._load_shell(shell, attrs),
        )

    def _load_shell(self, shell: bytes, attrs: int) -> None:
        with self._load_lock:
            self._check_usable()
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
            buffer = self._allocate(len(shell))
            try:
                buffer.view()[: len(shell)] = shell
                create = abi.fastrpc_init_create(
                    filelen=len(shell),
                    filefd=buffer.fd,
                    attrs=attrs,
                    siglen=0,
                    file=buffer.host_address,
                )
                rc = self._ioctl(self._rpc_fd.fileno(), abi.FASTRPC_IOCTL_INIT_CREATE, create)
                if rc != 0:
                    if said_none:
                        raise self._unsigned_pd_refused(rc)
                    raise RpcError(ErrorCode.FASTRPC, rc=rc)
                host = ReverseHost(self)
                apps_std = AppsStdServer(self._library_path, self._exposed, sharing=host)
                modules = ReverseModules(
                    [apps_std, AppsMemServer(host)],
                    observer=self._reverse_observer or self._trace_observer(apps_std),
                )
                listener = ReverseRpcListener(
                    self._listener_invoke(), modules, on_stopped=self._listener_stopped
                )
                try:
                    listener.start()
                except BaseException:
                    self._exit_process()  # undo INIT_CREATE
                    raise
            except BaseException:
                self._discard(buffer)
                raise
            self._shell = buffer
            self._listener = listener
            self._apps_std = apps_std
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
        if not self.capabilities.available or self.capabilities.unsigned_pd:
            return False
        log.warning(
            "the CDSP firmware answers UNSIGNED_PD_SUPPORT = 0; asking for the unsigned PD "
            "anyway, as libcdsprpc does (it never reads the attribute)",
            extra={"device": self.device, "arch": self.capabilities.arch},
        )
        return True

    def _unsigned_pd_refused(self, rc: int) -> RpcError:
        """The INIT_CREATE of the unsigned PD failed with ``rc`` on a firmware that
        answers UNSIGNED_PD_SUPPORT = 0: the firmware has none."""
        return RpcError(
            ErrorCode.UNSUPPORTED,
            what=(
                f"the unsigned PD: the CDSP firmware on {self.device} (Hexagon "
                f"{self.capabilities.arch}) answers UNSIGNED_PD_SUPPORT = 0 and refused "
                f"the unsigned PD (result 0x{rc:08X}), so it cannot run unsigned skels such "
                "as npud's; install a CDSP firmware with unsigned PD support (npud doctor "
                "shows the firmware in use)"
            ),
        )

    def end_process(self) -> None:
        """End the DSP process now (adsp_current_process1.exit), as libcdsprpc's
        FASTRPC_REMOTE_PROCESS_KILL does for a call that never returns: the calls still
        on the DSP fail, and the session can then be closed. Best effort."""
        self._exit_process()

    def _exit_process(self) -> None:
        """Ask the DSP process to exit (adsp_current_process1.exit); best effort.

        Sent even when the session believes the DSP restarted: on a real restart it
        fails at once (EPIPE), and a DSP result of -32 that only looked like EPIPE
        must not leave the listener blocked in next2 forever.
        """
        self._process_ended = True
        invoke = abi.fastrpc_invoke(handle=abi.ADSP_CURRENT_PROCESS1_HANDLE, sc=EXIT_SC, args=0)
        try:
            rc = self._ioctl(self._rpc_fd.fileno(), abi.FASTRPC_IOCTL_INVOKE, invoke)
            if rc != 0:
                log.warning("DSP process exit refused", extra={"result": f"0x{rc:08X}"})
        except RpcError as exc:
            if not self._dead:
                log.warning("DSP process exit failed", extra={"error": str(exc)})

    def _end_process(self, listener: ReverseRpcListener) -> bool:
        """End the DSP process, which completes the listener's pending next2, and join it.

        Returns False when the listener thread is still running after the wait.
        """
        self._exit_process()
        if listener.join(LISTENER_JOIN_TIMEOUT):
            return True
        log.error("reverse-RPC listener did not stop", extra={"timeout_s": LISTENER_JOIN_TIMEOUT})
        return False
