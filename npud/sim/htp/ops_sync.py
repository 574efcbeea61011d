"""Synchronisation ops of a single emulated device.

* FENCE (op_params[0] seq, [1] 1 = signal, 0 = wait) on a fence slot (src0): a signal
  writes ``slot[1] = status`` of the batch so far, then ``slot[0] = seq``; a wait
  looks at the slot until ``slot[0] - seq >= 0`` (as 32-bit serials), answering the
  status found there, and gives up with INTERNAL_ERR after FENCE_TIMEOUT seconds, as
  the DSP gives up after its spin count.
* CPY_FENCE: CPY, then a signal on src1 (op_params[0] seq).
* MDEV_GROUP (op_params[0] the device's index, src0 ne[1] the group's size): a group
  of one device is nothing to do; a group of several (ggml's tensor split over
  several sessions) is not emulated: NO_SUPPORT.
"""

from __future__ import annotations

import time
from typing import Final

from npud.sim.htp.layout import Op, Status
from npud.sim.htp.opcall import OpCall, OpFunction
from npud.sim.htp.ops_rows import cpy
from npud.sim.htp.tensors import NotSupportedError, OpError, Tensor

FENCE_TIMEOUT: Final = 10.0
FENCE_POLL: Final = 0.0005
"""Seconds between looks at a fence slot another device writes (the DSP spins)."""


def _signal(slot: Tensor, seq: int, status: int) -> None:
    words = slot.words(2)
    words[1] = status
    words[0] = seq & 0xFFFFFFFF


def fence(op: OpCall) -> None:
    slot = op.src(0)
    seq = op.i32(0) & 0xFFFFFFFF
    if op.i32(1) == 1:
        _signal(slot, seq, op.status)
        return
    words = slot.words(2)
    deadline = time.monotonic() + FENCE_TIMEOUT
    while _behind(int(words[0]), seq):
        if time.monotonic() > deadline:
            raise OpError(f"FENCE: slot never reached seq {seq:#x}")
        time.sleep(FENCE_POLL)
    if int(words[1]) > Status.OK:
        raise _PeerFailedError(int(words[1]))


def _behind(have: int, want: int) -> bool:
    """(int32)(have - want) < 0: 32-bit serial arithmetic."""
    return bool((have - want) & 0x8000_0000)


class _PeerFailedError(OpError):
    def __init__(self, status: int) -> None:
        super().__init__(f"FENCE: the signalling side failed with status {status}")
        try:
            self.status = Status(status)
        except ValueError:
            self.status = Status.INTERNAL_ERR


def cpy_fence(op: OpCall) -> None:
    failure: OpError | None = None
    try:
        cpy(op)
    except OpError as exc:
        failure = exc
    status = failure.status if failure is not None else op.status
    _signal(op.src(1), op.i32(0), status if op.status == Status.OK else op.status)
    if failure is not None:
        raise failure


def mdev_group(op: OpCall) -> None:
    slot = op.src(0)
    if slot.ne[1] > 1:
        raise NotSupportedError(f"MDEV_GROUP of {slot.ne[1]} devices")


FUNCTIONS: Final[dict[Op, OpFunction]] = {
    Op.FENCE: fence,
    Op.CPY_FENCE: cpy_fence,
    Op.MDEV_GROUP: mdev_group,
}
