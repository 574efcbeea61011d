"""A DSP-side consumer of a dspqueue for the ring tests: it imports a queue and answers
every request with a packet holding the same buffer references and message.

Importable by name (``tests.emulator.queue_echo_skel.QueueEchoSkel``), as a factory
sent to a PD child must be; ``SimConfig(skels=ECHO_SKELS)`` installs it and
:func:`write_descriptor` writes ``libqueue_echo_skel.so``.

Methods (domain numbers, user methods from 2):

* start(u64 queue id): import the queue, start the echo thread; the import's AEE
  result otherwise (sc 0x02010000);
* stop(): close the import, wait for the thread (sc 0x03000000);
* served(rout u32): requests answered so far (sc 0x04000100);
* crash_thread(): start a thread of the PD that raises, and wait for it (sc 0x05000000).

Handling a request is DSP work (``QueueEndpoint.computing``): a message
``work:<microseconds>`` takes that much CPU time on the host, as a batch's ops would.
"""

from __future__ import annotations

import struct
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Final

from npu_protocol import AEE
from npud.sim import dspqueue
from npud.sim.builtin_skels import BUILTIN_SKELS
from npud.sim.skels import Skel, SkelCall, SkelMethod
from npud.sim.skels_dspqueue import QueueClosedError, QueueEndpoint, service_of

URI: Final = "file:///libqueue_echo_skel.so?queue_echo_skel_handle_invoke&_modver=1.0&_dom=cdsp"
DESCRIPTOR: Final = "NPUD-SIM-SKEL 1\nskel=queue_echo\nsymbols=queue_echo_skel_handle_invoke\n"
SC_START: Final = 0x02010000
SC_STOP: Final = 0x03000000
SC_SERVED: Final = 0x04000100
SC_CRASH_THREAD: Final = 0x05000000
THREAD_NAME: Final = "dsp-queue-echo"
WORK_PREFIX: Final = b"work:"
WAIT_PREFIX: Final = b"wait:"

_U64: Final = struct.Struct("<Q")
_U32: Final = struct.Struct("<I")


class QueueEchoSkel(Skel):
    name = "queue_echo"

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._endpoint: QueueEndpoint | None = None
        self._thread: threading.Thread | None = None
        self._served = 0
        self._methods = {
            0: SkelMethod("start", 1, 0, self._start),
            1: SkelMethod("stop", 0, 0, self._stop),
            2: SkelMethod("served", 0, 1, self._served_count),
            3: SkelMethod("crash_thread", 0, 0, self._crash_thread),
        }

    def methods(self) -> Mapping[int, SkelMethod]:
        return self._methods

    def _start(self, call: SkelCall) -> int:
        (qid,) = call.prim_in(_U64)
        pd = call.pd
        if pd is None:
            return AEE.EUNSUPPORTED.dsp
        with self._lock:
            if self._endpoint is not None:
                return AEE.EITEMBUSY.dsp
            try:
                endpoint = service_of(pd).import_queue(qid)
            except dspqueue.QueueError as exc:
                return exc.code
            self._endpoint = endpoint
            self._thread = pd.start_thread(THREAD_NAME, lambda: self._echo(endpoint))
        return 0

    def _echo(self, endpoint: QueueEndpoint) -> None:
        while True:
            try:
                packet = endpoint.read()
                with endpoint.computing():
                    _compute(packet.message)
                endpoint.write(packet.buffers, packet.message)
            except QueueClosedError:
                return
            with self._lock:
                self._served += 1

    def _stop(self, call: SkelCall) -> int:
        self.close()
        return 0

    @staticmethod
    def _crash_thread(call: SkelCall) -> int:
        if call.pd is None:
            return AEE.EUNSUPPORTED.dsp

        def boom() -> None:
            raise RuntimeError("a thread of the PD raised")

        call.pd.start_thread("dsp-boom", boom).join()
        return 0

    def _served_count(self, call: SkelCall) -> int:
        with self._lock:
            call.outputs[0][:] = _U32.pack(self._served)
        return 0

    def close(self) -> None:
        with self._lock:
            endpoint, self._endpoint = self._endpoint, None
            thread, self._thread = self._thread, None
        if endpoint is not None:
            endpoint.close()
        if thread is not None and thread is not threading.current_thread():
            thread.join()


def _compute(message: bytes) -> None:
    """A request ``work:<microseconds>`` is that much CPU time of the handling thread
    (what the model charges, not the wall time: docs/emulator.md, "Concurrency"); any
    other is (almost) no work. Both are charged. ``wait:<microseconds>`` is that long
    off the CPU (a sleep: the host's scheduler keeping the thread waiting)."""
    if message.startswith(WAIT_PREFIX):
        time.sleep(int(message[len(WAIT_PREFIX) :].rstrip(b"\0") or 0) / 1e6)
    if message.startswith(WORK_PREFIX):
        end = time.thread_time() + int(message[len(WORK_PREFIX) :].rstrip(b"\0") or 0) / 1e6
        while time.thread_time() < end:
            pass


ECHO_SKELS: Final = MappingProxyType({**BUILTIN_SKELS, "queue_echo": QueueEchoSkel})


def write_descriptor(directory: Path) -> Path:
    path = directory / "libqueue_echo_skel.so"
    path.write_text(DESCRIPTOR)
    return path
