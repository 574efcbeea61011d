"""The ``dspqueue_rpc`` skel: the DSP side of ``libdspqueue_rpc_skel.so``'s interface.

Methods 2-8 of ``interface dspqueue_rpc : remote_handle64`` unpack their
arguments and call the DSP process's dspqueue library
(:class:`npud.sim.skels_dspqueue.DspQueueService`, whose module docstring says
what each does); this module is only the skel's binding of calls to it.
"""

from __future__ import annotations

import struct
import threading
from collections.abc import Callable, Mapping
from typing import Final

from npu_protocol.aee import AEE
from npud.sim.skels import Skel, SkelCall, SkelMethod
from npud.sim.skels_dspqueue import SKEL_NAME, DspQueueService, service_of

_I32: Final = struct.Struct("<i")
_U64: Final = struct.Struct("<Q")
_CREATE_IN: Final = struct.Struct("<IiI")


class DspQueueRpcSkel(Skel):
    """``interface dspqueue_rpc : remote_handle64`` (methods 2-8, see the module docstring)."""

    name = SKEL_NAME

    def __init__(self) -> None:
        self._service: DspQueueService | None = None
        self._lock = threading.Lock()
        handlers: list[tuple[str, int, int, Callable[[SkelCall], int]]] = [
            ("init_process_state", 1, 0, self._init_process_state),
            ("create_queue", 1, 1, self._create_queue),
            ("destroy_queue", 1, 0, self._destroy_queue),
            ("is_imported", 1, 1, self._is_imported),
            ("wait_signal", 0, 1, self._wait_signal),
            ("cancel_wait_signal", 0, 0, self._cancel_wait_signal),
            ("signal", 0, 0, self._signal),
        ]
        self._methods = {
            index: SkelMethod(name, inbufs, outbufs, handler)
            for index, (name, inbufs, outbufs, handler) in enumerate(handlers)
        }

    def methods(self) -> Mapping[int, SkelMethod]:
        return self._methods

    def close(self) -> None:
        with self._lock:
            service = self._service
        if service is not None:
            service.release_owner(self)

    def _bind(self, call: SkelCall) -> DspQueueService | None:
        if call.pd is None:
            return None
        service = service_of(call.pd)
        with self._lock:
            self._service = service
        return service

    def _init_process_state(self, call: SkelCall) -> int:
        service = self._bind(call)
        (fd,) = call.prim_in(_I32)
        return AEE.EUNSUPPORTED.dsp if service is None else service.init_process_state(fd, self)

    def _create_queue(self, call: SkelCall) -> int:
        service = self._bind(call)
        slot, fd, count = call.prim_in(_CREATE_IN)
        if len(call.outputs[0]) != _U64.size:
            return AEE.EBADPARM.dsp
        if service is None:
            return AEE.EUNSUPPORTED.dsp
        code, qid = service.create_queue(slot, fd, count, self)
        if code == 0:
            call.outputs[0][:] = _U64.pack(qid)
        return code

    def _destroy_queue(self, call: SkelCall) -> int:
        service = self._bind(call)
        (qid,) = call.prim_in(_U64)
        return AEE.EUNSUPPORTED.dsp if service is None else service.destroy_queue(qid)

    def _is_imported(self, call: SkelCall) -> int:
        service = self._bind(call)
        (qid,) = call.prim_in(_U64)
        if len(call.outputs[0]) != _I32.size:
            return AEE.EBADPARM.dsp
        if service is None:
            return AEE.EUNSUPPORTED.dsp
        code, imported = service.is_imported(qid)
        if code == 0:
            call.outputs[0][:] = _I32.pack(imported)
        return code

    def _wait_signal(self, call: SkelCall) -> int:
        service = self._bind(call)
        if len(call.outputs[0]) != _I32.size:
            return AEE.EBADPARM.dsp
        if service is None:
            return AEE.EUNSUPPORTED.dsp
        signal = service.wait_signal(call.meter)
        call.outputs[0][:] = _I32.pack(signal.value)
        if signal.value == 0:
            call.report_dsp_seconds(signal.dsp_seconds)
        return 0

    def _cancel_wait_signal(self, call: SkelCall) -> int:
        service = self._bind(call)
        if service is None:
            return AEE.EUNSUPPORTED.dsp
        service.cancel_wait_signal()
        return 0

    def _signal(self, call: SkelCall) -> int:
        service = self._bind(call)
        if service is None:
            return AEE.EUNSUPPORTED.dsp
        service.signal()
        return 0
