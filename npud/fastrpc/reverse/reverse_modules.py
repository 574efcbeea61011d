"""What the DSP can call on this host through reverse RPC: apps_remotectl and its modules.

libcdsprpc registers ``apps_remotectl`` as the constant reverse handle 0 and
``apps_std``, ``apps_mem`` (and ``adspmsgd_apps``) as static modules the DSP
opens by name through it (``listener_android.c``). :class:`ReverseModules` is
that table: handle 0 opens and closes modules, every other handle is a module
the DSP opened. npud serves ``apps_std`` (files, :mod:`npud.fastrpc.reverse.apps_std`)
and ``apps_mem`` (heap growth, :mod:`npud.fastrpc.reverse.apps_mem`); any other name
fails the open with AEE_ENOSUCHMOD and a dlerror text.

Results are HLOS-side AEE codes (bare ``n``, no DSP offset). A call the
module does not implement answers AEE_EUNSUPPORTED so the DSP can fall back.
Every call is reported to an optional observer (the trace recorder).

apps_remotectl's open and close have remotectl's layouts
(``idl/remotectl.idl``, through :mod:`npud.idl`): the emulator's DSP calls
them from the same description.
"""

from __future__ import annotations

import errno
import logging
import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Final, Protocol

from npu_protocol import AEE
from npud import idl
from npud.fastrpc.kernel import abi
from npud.fastrpc.kernel.marshal import from_c_string

log = logging.getLogger(__name__)

APPS_REMOTECTL_HANDLE: Final = 0
APPS_REMOTECTL_IDL: Final = idl.load("remotectl")
"""apps_remotectl is served with remotectl's methods and layouts."""
MAX_OUTPUT_CAPACITY: Final = 16 * 1024 * 1024
FIRST_MODULE_HANDLE: Final = 0x1000
"""Module handles are FIRST_MODULE_HANDLE + 16 * index: non-static, stable per module."""


@dataclass(frozen=True)
class Reply:
    """A reverse call's result and its output buffers (each exactly the asked capacity)."""

    result: int
    outputs: tuple[bytes, ...] = ()


def fail(code: AEE) -> Reply:
    return Reply(int(code))


def fit(data: bytes, capacity: int) -> bytes:
    """Output buffers must come back at exactly the capacity the DSP announced."""
    return data[:capacity].ljust(capacity, b"\0")


_ERRNO_AEE: Final = {
    errno.ENOMEM: AEE.ENOMEMORY,
    errno.EINVAL: AEE.EBADPARM,
    errno.EFAULT: AEE.EBADPARM,
    errno.EBADF: AEE.EBADPARM,
    errno.EOVERFLOW: AEE.EBADPARM,
    errno.ETIMEDOUT: AEE.EEXPIRED,
    errno.EPIPE: AEE.ECONNRESET,
    errno.ECONNRESET: AEE.ECONNRESET,
    errno.EACCES: AEE.EBADPERMS,
    errno.EPERM: AEE.EBADPERMS,
}


def aee_for_errno(err: int | None) -> int:
    """The HLOS AEE code libcdsprpc reports for a failed ioctl (its
    ``convert_kernel_to_user_error``); AEE_ERPC for anything else."""
    return int(_ERRNO_AEE.get(err or 0, AEE.ERPC))


@dataclass(frozen=True)
class CallDescription:
    """What a reverse call was, for logs and traces."""

    method: str
    file: str | None = None


class ReverseModule(Protocol):
    """One module the DSP opens by name; its methods are numbered qaic-style from 0."""

    @property
    def name(self) -> str: ...

    def invoke(self, method: int, sc: int, inputs: list[bytes], caps: list[int]) -> Reply: ...

    def describe(self, method: int, inputs: list[bytes]) -> CallDescription: ...

    def close(self) -> None:
        """The DSP closed its last handle to the module, or the session ends."""
        ...


ReverseObserver = Callable[[int, str, int, CallDescription, int], None]
"""(handle, module name, method, description, result) of every reverse call."""


class ReverseModules:
    """apps_remotectl on reverse handle 0, and the modules it opens."""

    def __init__(
        self, modules: Sequence[ReverseModule], observer: ReverseObserver | None = None
    ) -> None:
        self._modules = {module.name: module for module in modules}
        self._handles = {
            FIRST_MODULE_HANDLE + 16 * index: module for index, module in enumerate(modules)
        }
        self._opens: dict[int, int] = {}  # handle -> opens not yet closed
        self._observer = observer

    def dispatch(self, handle: int, sc: int, inputs: list[bytes], caps: list[int]) -> Reply:
        """Serve one reverse call; never raises for what the DSP sent."""
        method = abi.remote_scalars_method(sc)
        if abi.remote_scalars_inhandles(sc) or abi.remote_scalars_outhandles(sc):
            return self._observed(handle, "?", method, CallDescription("?"), fail(AEE.EBADPARM))
        if any(cap > MAX_OUTPUT_CAPACITY for cap in caps):
            # We would allocate what the peer asks for.
            return self._observed(handle, "?", method, CallDescription("?"), fail(AEE.EBADPARM))
        if handle == APPS_REMOTECTL_HANDLE:
            description = _describe_remotectl(method, inputs)
            try:
                reply = self._remotectl(method, inputs, caps)
            except (struct.error, IndexError, ValueError):
                reply = fail(AEE.EBADPARM)
            return self._observed(handle, "apps_remotectl", method, description, reply)
        module = self._handles.get(handle)
        if module is None or not self._opens.get(handle):
            return self._observed(handle, "?", method, CallDescription("?"), fail(AEE.EINVHANDLE))
        try:
            description = module.describe(method, inputs)
        except (struct.error, IndexError, ValueError):
            description = CallDescription(f"method {method}")
        try:
            reply = module.invoke(method, sc, inputs, caps)
        except (struct.error, IndexError, ValueError):
            reply = fail(AEE.EBADPARM)
        except OSError as exc:
            reply = Reply(aee_for_errno(exc.errno))
        return self._observed(handle, module.name, method, description, reply)

    def close(self) -> None:
        """The session ends: every module releases what the DSP left behind."""
        self._opens.clear()
        for module in self._modules.values():
            try:
                module.close()
            except Exception:  # one module must not keep the others from closing
                log.exception("closing a reverse module failed", extra={"module": module.name})

    def module(self, name: str) -> ReverseModule | None:
        return self._modules.get(name)

    # --- apps_remotectl ---------------------------------------------------------
    def _remotectl(self, method: int, inputs: list[bytes], caps: list[int]) -> Reply:
        """open and close. As libcdsprpc's apps_remotectl, the name is read up to its NUL
        and the outputs come back at the capacities asked (MarshalError, a ValueError,
        for a primIn too short)."""
        declared = APPS_REMOTECTL_IDL.by_index(method)
        if declared is None or declared.name not in ("open", "close"):
            return fail(AEE.EUNSUPPORTED)
        if declared.name == "open":
            name = from_c_string(inputs[1])
            module = self._modules.get(name)
            if module is None:
                error = f"module {name!r} is not served by npud".encode() + b"\0"
                prim = declared.pack_prim_rout({"handle": 0, "nErr": int(AEE.ENOSUCHMOD)})
                return Reply(0, (fit(prim, caps[0]), fit(error, caps[1])))
            handle = self._handle_of(module)
            self._opens[handle] = self._opens.get(handle, 0) + 1
            prim = declared.pack_prim_rout({"handle": handle, "nErr": 0})
            return Reply(0, (fit(prim, caps[0]), fit(b"", caps[1])))
        handle = declared.prim_in_values(inputs[0]).integer("handle")
        opens = self._opens.get(handle, 0)
        if not opens:
            status = int(AEE.EINVHANDLE)
        else:
            status = 0
            self._opens[handle] = opens - 1
            if opens == 1:
                del self._opens[handle]
                self._handles[handle].close()
        prim = declared.pack_prim_rout({"nErr": status})
        return Reply(0, (fit(prim, caps[0]), fit(b"", caps[1])))

    def _handle_of(self, module: ReverseModule) -> int:
        for handle, known in self._handles.items():
            if known is module:
                return handle
        raise AssertionError(f"{module.name} is not in the table")

    def _observed(
        self, handle: int, module: str, method: int, description: CallDescription, reply: Reply
    ) -> Reply:
        if self._observer is not None:
            try:
                self._observer(handle, module, method, description, reply.result)
            except Exception:  # a trace must never break the DSP's loader
                log.exception("reverse-call observer failed")
        return reply


def _describe_remotectl(method: int, inputs: list[bytes]) -> CallDescription:
    if method == 0 and len(inputs) > 1:
        return CallDescription("open", from_c_string(inputs[1]))
    return CallDescription({1: "close"}.get(method, f"method {method}"))
