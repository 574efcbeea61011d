"""What a client holds through its ids, and how each thing is let go, once.

A client's id (``npud.requests.clients.ObjectTable``) names one of:

* a :class:`HeldBuffer`: a DMA-BUF from the daemon's memory, and while the
  client has it mapped, a lease on its mapping into the client's domain;
* an :class:`OpenHandle`: a remote handle from remotectl open, in the domain's
  registry;
* a model (:class:`npud.requests.models.NpuModel`): a lease on a shared load and an arena.

:func:`let_go` gives them back when the client frees them, closes them or goes:
on the domain's lane (a MEM_UNMAP, a remotectl close and a model unload are DSP
calls), in the order the kernel wants (DSP side first, then the buffer).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import TYPE_CHECKING, Final

import structlog

from npu_protocol import CodedError
from npud.domain.life import Domain
from npud.domain.registry import MappingLease
from npud.fastrpc.kernel.dma import DmaBuffer
from npud.fastrpc.session import FastRpcSession

if (
    TYPE_CHECKING
):  # loaded with the first model load (npud.requests.model_requests), not at start-up
    from npud.requests.models import NpuModel

log = structlog.get_logger("npud.requests.holdings")


@dataclasses.dataclass(eq=False)
class HeldBuffer:
    """A buffer as its client holds it: the DMA-BUF, and its lease on the buffer's
    mapping into the client's domain while the client has it mapped."""

    buffer: DmaBuffer
    mapping: MappingLease | None = None

    @property
    def dsp_address(self) -> int | None:
        mapping = self.mapping
        return mapping.address if mapping is not None and mapping.valid else None

    def live_mapping(self) -> MappingLease | None:
        mapping = self.mapping
        return mapping if mapping is not None and mapping.valid else None


DSPQUEUE_SKEL: Final = "libdspqueue_rpc_skel.so"
"""The library of dspqueue's RPC interface (its CPU library opens it by this name)."""
DSPQUEUE_SIGNAL_SC: Final = 0x08000000
"""dspqueue_rpc ``signal()`` (method 8, no arguments): the doorbell of an op batch."""


@dataclasses.dataclass(frozen=True)
class OpenHandle:
    """A remote handle of the client's domain, and the registry generation it is of."""

    handle: int
    generation: int
    waits: frozenset[int] = frozenset()
    """Its methods that wait for the DSP rather than compute: the only ones an invoke
    may send with ``wait`` (:func:`npud.requests.skel_requests.waiting_methods`)."""
    faults: frozenset[int] = frozenset()
    """Its methods that crash the DSP process on purpose (the emulator's fault
    injection): only root and ``[emulator] fault_uids`` may call them."""
    dspqueue: bool = False
    """It is dspqueue's RPC interface: its ``signal`` is an op batch's doorbell."""


def is_dspqueue_uri(uri: str) -> bool:
    """Does remotectl ``uri`` open dspqueue's RPC interface?"""
    path = uri.split("?", 1)[0]
    return path.rsplit("/", 1)[-1] == DSPQUEUE_SKEL


def let_go(
    domain: Domain,
    *,
    buffers: Sequence[HeldBuffer] = (),
    handles: Sequence[OpenHandle] = (),
    models: Sequence[NpuModel] = (),
    strict: bool = False,
) -> None:
    """Release ``models``, close ``handles``, unmap and let go of ``buffers``, here (one of
    ``domain``'s lanes). Things of an earlier generation (a restart since) are gone with
    the old process; only what is not DSP-side (buffers, arenas) is let go of them.

    ``strict``: a client asked for it, so the first failure is raised (as the client's
    code, after everything was let go); otherwise failures are logged.
    """
    session = domain.session
    failures = _release_models(domain, session, models)
    failures += _close_handles(domain, session, handles)
    failures += _release_buffers(domain, session, buffers)
    if not failures:
        return
    if strict and session is not None:
        raise domain.translate(session, failures[0]) from None
    if strict:
        raise failures[0]
    for failure in failures:
        log.warning(
            "release failed", domain=domain.name, code=failure.code.name, error=str(failure)
        )


def _release_models(
    domain: Domain, session: FastRpcSession | None, models: Sequence[NpuModel]
) -> list[CodedError]:
    failures: list[CodedError] = []
    for model in models:
        failures += model.release() if _same(domain, session, model.session) else _forget(model)
    return failures


def _close_handles(
    domain: Domain, session: FastRpcSession | None, handles: Sequence[OpenHandle]
) -> list[CodedError]:
    failures: list[CodedError] = []
    for open_handle in handles:
        if not domain.registry.closed(open_handle.handle, open_handle.generation):
            continue  # of an earlier process: gone with it
        if session is None:
            continue
        try:
            session.remote_close(open_handle.handle)  # deferred while invokes use it
        except CodedError as exc:
            failures.append(exc)
    return failures


def _release_buffers(
    domain: Domain, session: FastRpcSession | None, buffers: Sequence[HeldBuffer]
) -> list[CodedError]:
    failures: list[CodedError] = []
    memory = domain.device.require_memory()
    for held in buffers:
        mapping = held.live_mapping()
        held.mapping = None
        try:
            if mapping is not None:
                domain.registry.unmap(session, mapping, going=True)
        except CodedError as exc:
            failures.append(exc)
        finally:
            memory.release(held.buffer)
    return failures


def _same(domain: Domain, session: FastRpcSession | None, of: FastRpcSession) -> bool:
    return session is not None and session is of and not session.dead


def _forget(model: NpuModel) -> list[CodedError]:
    model.forget()
    return []
