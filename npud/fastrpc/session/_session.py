"""The facade: opening a session (the device node, its capabilities) and the class
every caller uses, made of the jobs below it."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from npud.fastrpc.kernel import abi
from npud.fastrpc.kernel.capabilities import query_capabilities
from npud.fastrpc.kernel.dma import DeviceFd
from npud.fastrpc.kernel.driver import Driver
from npud.fastrpc.kernel.errors import translate_os_error
from npud.fastrpc.kernel.trace_hooks import trace_hooks_of
from npud.fastrpc.session._device import open_first
from npud.fastrpc.session._lifecycle import Lifecycle
from npud.fastrpc.session._state import log


class FastRpcSession(Lifecycle):
    """One FastRPC session to the CDSP (see :mod:`npud.fastrpc.session`). Thread-safe;
    every public method may block in an ioctl."""

    @classmethod
    def open(
        cls,
        driver: Driver,
        *,
        nodes: Sequence[str] = abi.CDSP_NODES,
        library_path: Sequence[Path] = (),
    ) -> FastRpcSession:
        """Open ``rpc_fd`` and read the DSP's capabilities.

        The secure node is tried first; ENOENT or EACCES fall back to the next
        node, as libcdsprpc does. EBUSY does not: both nodes share one pool.
        GET_DSP_INFO proves the DSP answers before anything else is done.
        """
        hooks = trace_hooks_of(driver)
        if hooks is None:
            return cls._open(driver, nodes, library_path, 0)
        trace_session = hooks.new_session()
        with hooks.operation("open", trace_session, nodes=list(nodes)) as op:
            session = cls._open(driver, nodes, library_path, trace_session)
            op.result(device=session.device)
            return session

    @classmethod
    def _open(
        cls,
        driver: Driver,
        nodes: Sequence[str],
        library_path: Sequence[Path],
        trace_session: int,
    ) -> FastRpcSession:
        device, fd = open_first(driver, nodes)
        rpc_fd = DeviceFd(fd, driver.close)
        try:
            capabilities = query_capabilities(
                lambda arg: driver.ioctl(fd, abi.FASTRPC_IOCTL_GET_DSP_INFO, arg)
            )
        except OSError as exc:
            rpc_fd.close()
            raise translate_os_error(exc, abi.FASTRPC_IOCTL_GET_DSP_INFO, device=device) from None
        except BaseException:
            rpc_fd.close()
            raise
        log.info("fastrpc session opened", extra={"device": device, "arch": capabilities.arch})
        return cls(driver, device, rpc_fd, capabilities, library_path, trace_session)

    def fileno(self) -> int:
        """The session's device fd (owned here; -1 once closed): for the emulator's fault
        injection, which names a DSP process by the fd it is bound to."""
        return self._rpc_fd.fileno()
