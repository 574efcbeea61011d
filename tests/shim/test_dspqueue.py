"""dspqueue, CPU side, against a DSP in a thread (tests/shim/c/fake_dsp.c).

The fake DSP maps the same memory at addresses of its own and speaks the DSP
side of the ring protocol with code of its own; it answers dspqueue_rpc's
methods as a versioning DSP does (or as an old one, for old_dsp). Each
scenario is a run of tests/shim/c/dspq_test.c under the sanitizers.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.shim.programs import run

SCENARIOS = [
    "basic",  # a round trip: header version negotiation, buffers, fd+offset addresses
    "old_dsp",  # a DSP that takes header version UINT32_MAX: no wait counts
    "wrap",  # 256-byte rings, every packet size: wrap-around and the replicated header
    "many",  # 20000 packets from a send and a receive thread; signals coalesce
    "full",  # the DSP reads nothing: writes time out, a blocked writer waits for room
    "resp_full",  # the CPU reads nothing: the DSP waits, and reads wake it
    "timeout",  # AEE_EEXPIRED and AEE_EWOULDBLOCK
    "errors",  # bad arguments, small read buffers, REF/DEREF
    "restart",  # the DSP process dies: waiters wake, AEE_ECONNRESET, a new process
    "lost_idle",  # it dies while nobody waits
    "callbacks",  # packet and error callbacks
    "imported",  # close refused while the DSP still has the queue
    "multi",  # three queues of one process; the 64-queue limit
    "unsupported",  # no dspqueue_rpc skel on the DSP
    "wakeup",  # early-wakeup packets are skipped
]


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_scenario(dspq_test: Path, scenario: str) -> None:
    run(dspq_test, scenario, None, timeout=120)
