"""The CPU side of what runs on the emulated DSP, as the host libraries drive it:
dspqueue (:mod:`.dspqueue_cpu`, qualcomm/fastrpc's ``dspqueue_cpu.c``) and
ggml-hexagon's op batches (:mod:`.htp_host`), over a :class:`FastRpcSession`.

The emulator's tests and the attacks bench use them; the daemon does not (its
clients have no dspqueue API of their own). Their layouts are written out apart
from the emulator's own (:mod:`npud.sim.dspqueue`, :mod:`npud.sim.htp.layout`), so
a drift in either fails the tests.
"""
