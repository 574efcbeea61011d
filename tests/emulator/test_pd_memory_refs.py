"""An invoke that names memory its DSP process does not hold (issue 27).

Hostile traffic beside a good client made the shared DSP process die with a KeyError
in the child's memory table: an invoke named memories the child did not know (one
unmapped before the call was sent, or dropped by a table change the child read while
the call waited for a worker). On the DSP a bad reference is an error code for the
caller, never the end of the process: AEE_EBADPARM, and the process serves on.
"""

from __future__ import annotations

import os
import pickle
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Final

import pytest

from npu_protocol.aee import AEE
from npud.sim.pd_child import MemoryTable
from npud.sim.pd_host import BufferSpan, MemoryRef, PdChild, acquire_zygote
from npud.sim.skels import EchoSkel

SIZE: Final = 4096
SC_ONE_INPUT: Final = (31 << 24) | (1 << 16)
"""Method 31 (which echo lacks: AEE_EUNSUPPORTED once its buffers were found), one input."""
MEMORY: Final = 1_000_001


@dataclass
class Transfer:
    spans: Sequence[BufferSpan]
    inbufs: int = 1
    payload: memoryview = field(default_factory=lambda: memoryview(b""))
    payload_fd: int | None = None


class Services:
    """An unmetered host: no piece of work is modelled (the calls here never compute)."""

    metered = False

    def work(self, seconds: float) -> None:
        pass

    def work_begin(self, matrix: bool, started: float | None = None) -> object:
        raise AssertionError("not metered")

    def work_end(self, job: object, seconds: float) -> None:
        raise AssertionError("not metered")

    def work_drop(self, job: object) -> None:
        raise AssertionError("not metered")

    def read_host_file(self, name: str, *, limit: int) -> bytes:
        raise AssertionError("not asked")


@pytest.fixture
def child() -> Iterator[PdChild]:
    lease = acquire_zygote()
    try:
        child = lease.spawn()
        try:
            yield child
        finally:
            child.kill()
    finally:
        lease.release()


@pytest.fixture
def memfd() -> Iterator[int]:
    fd = os.memfd_create("buffer", os.MFD_CLOEXEC)
    os.ftruncate(fd, SIZE)
    yield fd
    os.close(fd)


def _invoke(child: PdChild, instance: int, ref: MemoryRef) -> int:
    transfer = Transfer([BufferSpan(ref, 0, 16)])
    return child.invoke(instance, 0, SC_ONE_INPUT, transfer, [], Services())


def test_memory_unmapped_before_its_call_is_ebadparm_and_the_pd_serves_on(
    child: PdChild, memfd: int
) -> None:
    instance = child.create("echo", pickle.dumps(EchoSkel))
    mapped = MemoryRef(MEMORY, memfd, SIZE, cached=True)
    assert _invoke(child, instance, mapped) == AEE.EUNSUPPORTED.dsp  # found: the method next
    child.drop([MEMORY])  # unmapped (a MEM_MAP's munmap): the child lets it go
    bound = MemoryRef(MEMORY, None, SIZE, cached=True)  # a MEM_MAP binding, known by id
    assert _invoke(child, instance, bound) == AEE.EBADPARM.dsp
    assert _invoke(child, instance, MemoryRef(7, None, SIZE, cached=True)) == AEE.EBADPARM.dsp
    assert child.alive
    assert _invoke(child, instance, mapped) == AEE.EUNSUPPORTED.dsp  # sent again, found
    child.destroy(instance)


def test_drops_racing_invokes_never_end_the_pd(child: PdChild, memfd: int) -> None:
    """The ordering race: a buffer's memory dropped while calls that name it are sent.
    A call names it only with an fd (it is re-sent when dropped), so every call finds it."""
    instance = child.create("echo", pickle.dumps(EchoSkel))
    mapped = MemoryRef(MEMORY, memfd, SIZE, cached=True)
    stop = threading.Event()

    def dropping() -> None:
        while not stop.is_set():
            child.drop([MEMORY])

    dropper = threading.Thread(target=dropping)
    dropper.start()
    try:
        results = {_invoke(child, instance, mapped) for _ in range(2000)}
    finally:
        stop.set()
        dropper.join()
    assert results == {AEE.EUNSUPPORTED.dsp}
    assert child.alive


def test_a_memory_dropped_while_two_calls_use_it_stays_mapped_until_the_last(memfd: int) -> None:
    """The child's table: a memory dropped (unmapped, or sent again under its id) while
    calls use it is closed by its last user, not its first (the first closed it, and
    the other call's next look at it crashed the PD: "mmap closed or invalid")."""
    table = MemoryTable()
    table.add(MEMORY, os.dup(memfd), SIZE)
    first, second = table.acquire(MEMORY), table.acquire(MEMORY)
    assert first is not None
    assert second is first
    table.drop([MEMORY])
    table.release(first)
    assert not second.mapping.closed  # the second call still reads it
    assert second.mapping[:4] == bytes(4)
    table.release(second)
    assert second.mapping.closed

    table.add(MEMORY, os.dup(memfd), SIZE)
    held = table.acquire(MEMORY)
    assert held is not None
    table.add(MEMORY, os.dup(memfd), SIZE)  # sent again: the id names the new one
    assert not held.mapping.closed
    table.release(held)
    assert held.mapping.closed
    renewed = table.acquire(MEMORY)
    assert renewed is not None
    assert not renewed.mapping.closed
    table.release(renewed)
    table.drop([MEMORY])
    assert renewed.mapping.closed
    assert table.acquire(MEMORY) is None
    assert table.acquire_all([MEMORY]) == MEMORY
