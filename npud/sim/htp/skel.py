"""The ``htp_iface`` skel of ggml's Hexagon backend: ``libggml-htp-v73.so`` on the
emulated DSP (llama.cpp ``ggml/src/ggml-hexagon/htp/htp_iface.idl``, ``main.c``).

``interface htp_iface : remote_handle64`` (qaic rules: primIn packed at natural
alignment, argument-less methods without buffers):

=============================================  ==  ==========  =====================
method                                         #   sc          primIn / primROut
=============================================  ==  ==========  =====================
start(u32 sess_id, u64 dsp_queue_id,           2   0x02010000  32 B: sess_id @0,
u32 n_hvx, u32 n_hmx, u64 max_vmem)                            queue id @8, n_hvx @16,
                                                               n_hmx @20, vmem @24
stop()                                         3   0x03000000
mmap(u32 fd, u64 size)                         4   0x04010000  16 B: fd @0, size @8
munmap(u32 fd)                                 5   0x05010000  4 B
profiler(u32 mode, {u32 events[8]})            6   0x06010000  36 B
etm(u32 enable)                                7   0x07010000  4 B
hwinfo(rout u32 n_threads, n_hvx, n_hmx,       8   0x08000100  out 24 B: @0, @4, @8,
rout u64 vtcm_size)                                            vtcm @16
=============================================  ==  ==========  =====================

* start imports the session's dspqueue by its id (the dspqueue library of the same
  DSP process, :mod:`npud.sim.skels_dspqueue`) and starts the batch worker
  (:mod:`npud.sim.htp.worker`) on a thread of the PD; AEE_EITEMBUSY when started,
  the import's error for an unknown or busy queue. n_hvx, n_hmx and max_vmem are
  recorded, not used: the ops run in numpy, and the DSP's address space is not
  limited here.
* stop closes the import (the CPU may then close the queue), ends the worker and
  lets go of the session's mappings; AEE_EBADPARM when not started. mmap, munmap
  and profiler need a started session too (AEE_EBADPARM), as on the DSP; mmap maps
  the buffer of that MEM_MAP fd now (AEE_EFAILED when there is none), munmap drops
  the DSP's mapping (after the batch using it).
* hwinfo: 4 threads, 4 HVX contexts, 1 HMX, 8 MiB of VTCM (the X1E's CDSP, v73; the
  host sizes its kernels and fusions with the VTCM size).
* profiler records the mode (the worker then fills each op's profile with its
  opcode and time, zero cycles and counters); etm answers 0 and does nothing.
* Closing the handle stops a started session (the DSP would refuse to close with
  the queue open: remotectl close cannot be refused here). The end of the PD stops
  it too.
"""

from __future__ import annotations

import logging
import struct
import threading
from collections.abc import Callable, Mapping
from typing import Final

from npu_protocol.aee import AEE
from npud.sim import dspqueue
from npud.sim.htp.worker import BatchWorker, Mappings
from npud.sim.pd_services import NoSuchMapError, PdServices
from npud.sim.skels import Skel, SkelCall, SkelMethod
from npud.sim.skels_dspqueue import QueueEndpoint, service_of

log = logging.getLogger("npud.sim.htp")

SKEL_NAME: Final = "htp_iface"
URI: Final = "file:///libggml-htp-v73.so?htp_iface_skel_handle_invoke&_modver=1.0"
WORKER_THREAD: Final = "dsp-htp-worker"

SC_START: Final = 0x02010000
SC_STOP: Final = 0x03000000
SC_MMAP: Final = 0x04010000
SC_MUNMAP: Final = 0x05010000
SC_PROFILER: Final = 0x06010000
SC_ETM: Final = 0x07010000
SC_HWINFO: Final = 0x08000100

HW_THREADS: Final = 4
HW_HVX: Final = 4
HW_HMX: Final = 1
VTCM_SIZE: Final = 8 * 1024 * 1024

START: Final = struct.Struct("<I4xQIIQ")
MMAP: Final = struct.Struct("<I4xQ")
U32: Final = struct.Struct("<I")
PROFILER: Final = struct.Struct("<I8I")
HWINFO: Final = struct.Struct("<III4xQ")


class _Session:
    """A started htp session: the import, the worker and its thread."""

    def __init__(self, pd: PdServices, endpoint: QueueEndpoint, mappings: Mappings) -> None:
        self.endpoint = endpoint
        self.worker = BatchWorker(endpoint, mappings)
        self.thread = pd.start_thread(WORKER_THREAD, self.worker.run)

    def stop(self) -> None:
        self.endpoint.close()  # the worker's read returns
        if self.thread is not threading.current_thread():
            self.thread.join()


class HtpIfaceSkel(Skel):
    """One htp_iface handle (see the module docstring)."""

    name = SKEL_NAME

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._session: _Session | None = None
        self._mappings: Mappings | None = None
        self._profiler = 0
        self._cancel_end: Callable[[], None] | None = None
        handlers: list[tuple[str, int, int, Callable[[SkelCall], int]]] = [
            ("start", 1, 0, self._start),
            ("stop", 0, 0, self._stop),
            ("mmap", 1, 0, self._mmap),
            ("munmap", 1, 0, self._munmap),
            ("profiler", 1, 0, self._profiler_method),
            ("etm", 1, 0, self._etm),
            ("hwinfo", 0, 1, self._hwinfo),
        ]
        self._methods = {
            index: SkelMethod(name, inbufs, outbufs, handler)
            for index, (name, inbufs, outbufs, handler) in enumerate(handlers)
        }

    def methods(self) -> Mapping[int, SkelMethod]:
        return self._methods

    # -- methods ------------------------------------------------------------------------

    def _start(self, call: SkelCall) -> int:
        sess_id, queue_id, n_hvx, n_hmx, max_vmem = call.prim_in(START)
        pd = call.pd
        if pd is None:
            return AEE.EUNSUPPORTED.dsp
        with self._lock:
            if self._session is not None:
                log.warning("htp start: the session is already started")
                return AEE.EITEMBUSY.dsp
            try:
                endpoint = service_of(pd).import_queue(queue_id)
            except dspqueue.QueueError as exc:
                log.warning(
                    "htp start: queue import failed",
                    extra={"queue": f"{queue_id:#x}", "reason": str(exc)},
                )
                return exc.code
            if self._mappings is None:
                self._mappings = Mappings(pd)
            self._session = _Session(pd, endpoint, self._mappings)
            self._session.worker.profiler = self._profiler
            if self._cancel_end is None:
                self._cancel_end = pd.on_end(self.close)
        log.info(
            "htp session started",
            extra={
                "sess_id": sess_id,
                "queue": f"{queue_id:#x}",
                "n_hvx": n_hvx,
                "n_hmx": n_hmx,
                "max_vmem": max_vmem,
            },
        )
        return 0

    def _stop(self, call: SkelCall) -> int:
        if not self._halt():
            return AEE.EBADPARM.dsp
        return 0

    def _halt(self) -> bool:
        """Stop the session and let go of its mappings; False when it was not started."""
        with self._lock:
            session, self._session = self._session, None
            mappings, self._mappings = self._mappings, None
        if session is None:
            return False
        session.stop()
        if mappings is not None:
            mappings.close()
        return True

    def _mmap(self, call: SkelCall) -> int:
        fd, _size = call.prim_in(MMAP)
        with self._lock:
            mappings = self._mappings if self._session is not None else None
        if mappings is None:
            return AEE.EBADPARM.dsp
        try:
            mappings.map(fd)
        except NoSuchMapError:
            log.warning("htp mmap: no MEM_MAP with that fd", extra={"fd": fd})
            return AEE.EFAILED.dsp
        return 0

    def _munmap(self, call: SkelCall) -> int:
        (fd,) = call.prim_in(U32)
        with self._lock:
            mappings = self._mappings if self._session is not None else None
        if mappings is None:
            return AEE.EBADPARM.dsp
        mappings.unmap(fd)
        return 0

    def _profiler_method(self, call: SkelCall) -> int:
        mode, *_events = call.prim_in(PROFILER)
        with self._lock:
            if self._session is None:
                return AEE.EBADPARM.dsp
            self._profiler = mode
            self._session.worker.profiler = mode
        return 0

    def _etm(self, call: SkelCall) -> int:
        call.prim_in(U32)
        return 0

    def _hwinfo(self, call: SkelCall) -> int:
        if len(call.outputs[0]) != HWINFO.size:
            return AEE.EBADPARM.dsp
        call.outputs[0][:] = HWINFO.pack(HW_THREADS, HW_HVX, HW_HMX, VTCM_SIZE)
        return 0

    # -- the handle's end -------------------------------------------------------------------

    def close(self) -> None:
        with self._lock:
            cancel, self._cancel_end = self._cancel_end, None
        if cancel is not None:
            cancel()
        self._halt()
