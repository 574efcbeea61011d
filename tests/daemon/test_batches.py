"""dspqueue op batches through npud (issue 28, items 2 and 3): a client's ``signal`` on
dspqueue's RPC handle is a batch's doorbell; with ``batches = "gated"`` the batch holds
its scheduler slot until the client's ``wait`` call returns, and doorbell-to-answer is
charged to the client as DSP time; with ``"counted"`` the doorbell ends as a call and
only the time is charged. The answer here is a cancelled ``wait_signal`` (-1): what
ends the wait does not matter to npud."""

from __future__ import annotations

import struct
import time
from pathlib import Path

import pytest
import trio

import npu_protocol as p
from npud.daemon.server import Daemon
from npud.datapath import batches, workers
from npud.requests import Answer
from npud.requests.holdings import is_dspqueue_uri
from npud.requests.skel_requests import Invoke
from npud.sim.skels_dspqueue import URI
from tests.daemon.test_protocol4 import connect
from tests.daemon.wire import TEST_URI, RawPeer, busy, serve_daemon

DSPQUEUE_URI = URI + "&_dom=cdsp"
SIGNAL, WAIT_SIGNAL, CANCEL_WAIT_SIGNAL = 8, 6, 7


def _running(daemon: Daemon) -> int:
    return sum(daemon.broker.scheduler.statistics().running)


def _client(daemon: Daemon) -> p.ClientRow:
    (row,) = [c for c in daemon.broker.status().clients if c.name == "llm"]
    return row


async def _open(path: Path, priority: str) -> tuple[RawPeer, int]:
    peer, welcome = await connect(path / "npud.sock", "llm", isolate=True, priority=priority)
    assert isinstance(welcome, p.Welcome)
    await peer.write(p.OpenRequest(id=1, uri=DSPQUEUE_URI))
    opened = await peer.next()
    assert isinstance(opened, p.OpenReply)
    return peer, opened.handle


async def _batch(daemon: Daemon, peer: RawPeer, handle: int, *, held: bool) -> None:
    wait = p.InvokeRequest(
        id=10, handle=handle, method=WAIT_SIGNAL, outputs=(p.InlineOutput(capacity=4),), wait=True
    )
    await peer.write(wait, p.InvokeRequest(id=11, handle=handle, method=SIGNAL))
    rung = await peer.next()
    assert rung == p.InvokeReply(id=11)
    # The doorbell is answered; its batch holds the slot (gated) until the answer.
    assert _running(daemon) == (1 if held else 0)
    before = _client(daemon).dsp_us
    await trio.sleep(0.05)
    await peer.write(p.InvokeRequest(id=12, handle=handle, method=CANCEL_WAIT_SIGNAL))
    answers = sorted(await peer.answers(2), key=lambda m: getattr(m, "id", 0))
    assert isinstance(answers[0], p.InvokeReply)
    assert answers[0].outputs == (struct.pack("<i", -1),)
    assert answers[1] == p.InvokeReply(id=12)
    # The answer goes out before the batch is accounted (npud.datapath.workers): the slot and the
    # charge follow it, so wait for both (a bound for a loaded machine, not a speed check).
    with trio.fail_after(10):
        while _running(daemon) or _client(daemon).dsp_us - before < 50_000:
            await trio.sleep(0.005)
    (domain,) = [d for d in daemon.broker.status().domains if d.isolated]
    assert domain.dsp_us >= 50_000  # and to its domain


@pytest.mark.parametrize("batches", ["gated", "counted"])
async def test_a_batch_is_charged_from_its_doorbell_to_its_answer(
    tmp_path: Path, batches: str
) -> None:
    config = f'[scheduler]\nbatches = "{batches}"\n'
    async with serve_daemon(tmp_path, config) as daemon:
        peer, handle = await _open(tmp_path, "background")
        await _batch(daemon, peer, handle, held=batches == "gated")
        peer.close()


def test_dspqueue_is_known_by_its_library() -> None:
    assert is_dspqueue_uri(URI)
    assert is_dspqueue_uri("file:///libdspqueue_rpc_skel.so?x&_dom=cdsp&_session=0")
    assert not is_dspqueue_uri("file:///libnpu_test_skel.so?libdspqueue_rpc_skel.so")
    assert not is_dspqueue_uri("file:///mylibdspqueue_rpc_skel.so")


async def test_a_batch_whose_answer_never_comes_gives_its_slot_back(tmp_path: Path) -> None:
    config = "[scheduler]\nbatch_answer_max_s = 0.05\n"
    async with serve_daemon(tmp_path, config) as daemon:
        peer, handle = await _open(tmp_path, "background")
        await peer.write(p.InvokeRequest(id=11, handle=handle, method=SIGNAL))
        assert await peer.next() == p.InvokeReply(id=11)  # no wait call: no answer comes
        with trio.fail_after(10):
            while _running(daemon):
                await trio.sleep(0.005)
        assert _client(daemon).dsp_us >= 50_000  # charged up to the bound
        await peer.write(p.InvokeRequest(id=12, handle=handle, method=SIGNAL))
        assert await peer.next() == p.InvokeReply(id=12)  # the next batch goes as before
        peer.close()


async def test_a_signal_on_another_handle_is_an_ordinary_call(tmp_path: Path) -> None:
    async with serve_daemon(tmp_path) as daemon:
        peer, _ = await _open(tmp_path, "background")
        await peer.write(p.OpenRequest(id=2, uri=TEST_URI))
        opened = await peer.next()
        assert isinstance(opened, p.OpenReply)
        await peer.write(busy(3, opened.handle, 1000))
        assert await peer.next() == p.InvokeReply(id=3)
        assert _running(daemon) == 0  # a call ends when it returns
        peer.close()


async def _busy_peer(path: Path, daemon: Daemon, priority: str, us: int) -> RawPeer:
    """A client of ``priority`` whose call of ``us`` µs on the DSP is running."""
    peer, welcome = await connect(path / "npud.sock", priority, priority=priority)
    assert isinstance(welcome, p.Welcome)
    await peer.write(p.OpenRequest(id=1, uri=TEST_URI))
    opened = await peer.next()
    assert isinstance(opened, p.OpenReply)
    await peer.write(busy(2, opened.handle, us))
    with trio.fail_after(10):
        while not _running(daemon):
            await trio.sleep(0.005)
    return peer


async def test_a_held_doorbell_goes_at_its_bound_while_realtime_work_runs(
    tmp_path: Path,
) -> None:
    """The datapath's side of the gate: the doorbell waits for the running realtime call,
    and a timer lets it go at ``batch_hold_max_s`` though that call still runs."""
    async with serve_daemon(tmp_path, "[scheduler]\nbatch_hold_max_s = 0.05\n") as daemon:
        voice = await _busy_peer(tmp_path, daemon, "realtime", 5_000_000)  # 5 s on the DSP
        llm, handle = await _open(tmp_path, "background")
        await llm.write(p.InvokeRequest(id=11, handle=handle, method=SIGNAL))
        assert await llm.next() == p.InvokeReply(id=11)
        # The voice call still runs beside the batch, which waited for its bound.
        assert daemon.broker.scheduler.statistics().running == (1, 0, 1)
        assert _client(daemon).wait_p50_us >= 50_000
        assert await voice.next() == p.InvokeReply(id=2)
        voice.close()
        llm.close()


@pytest.mark.parametrize("batch_yield", ["normal", "realtime"])
async def test_a_doorbell_waits_for_a_normal_call_as_batch_yield_says(
    tmp_path: Path, batch_yield: str
) -> None:
    """The config reaches the gate: with ``batch_yield = "normal"`` a background doorbell
    waits for a normal client's call to end (and is counted as held for it); with
    ``"realtime"`` it goes beside it."""
    config = f'[scheduler]\nbatch_hold_max_s = 10\nbatch_yield = "{batch_yield}"\n'
    async with serve_daemon(tmp_path, config) as daemon:
        tts = await _busy_peer(tmp_path, daemon, "normal", 300_000)  # a 0.3 s graph
        llm, handle = await _open(tmp_path, "background")
        await llm.write(p.InvokeRequest(id=11, handle=handle, method=SIGNAL))
        if batch_yield == "normal":
            assert await tts.next() == p.InvokeReply(id=2)  # the graph ends first
            assert await llm.next() == p.InvokeReply(id=11)
            (held,) = _client(daemon).held
            assert (held.reason, held.batches) == ("normal_on_dsp", 1)
            assert held.held_us > 0
        else:
            assert await llm.next() == p.InvokeReply(id=11)
            assert daemon.broker.scheduler.statistics().running == (0, 1, 1)  # beside it
            assert _client(daemon).held == ()
            assert await tts.next() == p.InvokeReply(id=2)
        tts.close()
        llm.close()


class _SlowReturns:
    """``time`` for npud.datapath's workers and batches whose clock jumps ``trip``
    seconds whenever a doorbell's invoke returns: its reply took that long to come back
    from the DSP process."""

    def __init__(self) -> None:
        self.trip = 0.0
        self.offset = 0.0

    def monotonic(self) -> float:
        return time.monotonic() + self.offset


async def _charged_batch(
    daemon: Daemon, peer: RawPeer, handle: int, first_id: int, *, cancelled: bool = False
) -> int:
    """A batch whose answer is asked for as soon as its doorbell returned; its charge.

    The emulated skel's ``cancel_wait_signal`` lasts until the process state is made
    again: once ``cancelled``, a ``wait_signal`` answers -1 at once, so it is sent only
    after the doorbell returned (sent beside it, its answer could come first)."""
    before = _client(daemon).dsp_us
    wait = p.InvokeRequest(
        id=first_id,
        handle=handle,
        method=WAIT_SIGNAL,
        outputs=(p.InlineOutput(capacity=4),),
        wait=True,
    )
    doorbell = p.InvokeRequest(id=first_id + 1, handle=handle, method=SIGNAL)
    if cancelled:
        await peer.write(doorbell)
        assert await peer.next() == p.InvokeReply(id=first_id + 1)
        await peer.write(wait)
        answer = await peer.next()
        assert answer == p.InvokeReply(id=first_id, outputs=(b"\xff\xff\xff\xff",))  # -1
    else:
        await peer.write(wait, doorbell)
        assert await peer.next() == p.InvokeReply(id=first_id + 1)
        cancel = p.InvokeRequest(id=first_id + 2, handle=handle, method=CANCEL_WAIT_SIGNAL)
        await peer.write(cancel)
        assert len(await peer.answers(2)) == 2
    with trio.fail_after(10):
        while _running(daemon):
            await trio.sleep(0.005)
    # Less the cancel call's own time (a call's, charged as such): the batch's share.
    return _client(daemon).dsp_us - before


async def test_a_batch_is_charged_without_its_doorbells_round_trip(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """npud counted llama.cpp's DSP time at 1.18 times the DSP's own count (issue 28): it
    counted the doorbell's way to the DSP and the answer's way back. A doorbell is a call
    that does nothing on the DSP: the client's fastest one is the path's round trip, and
    a batch's charge leaves it out. One whose doorbell took 5 s (on npud's clock) and
    whose answer followed at once is not charged the 5 s; a later one whose doorbell
    return took 5 s while the client's fastest took far less is (its DSP process ran the
    batch before it let the doorbell's reply go: those 5 s were the DSP's)."""
    clock = _SlowReturns()
    monkeypatch.setattr(workers, "time", clock)  # when the answer came
    monkeypatch.setattr(batches, "time", clock)  # the doorbell's sending and return
    run = Invoke.run

    def slow_doorbell(self: Invoke) -> Answer:
        answer = run(self)
        if self.doorbell:
            clock.offset += clock.trip
        return answer

    monkeypatch.setattr(Invoke, "run", slow_doorbell)
    config = '[scheduler]\nbatches = "gated"\nbatch_answer_max_s = 60\n'
    async with serve_daemon(tmp_path, config) as daemon:
        peer, handle = await _open(tmp_path, "background")
        clock.trip = 5.0
        assert 0 < await _charged_batch(daemon, peer, handle, 10) < 5_000_000
        clock.trip = 0.0
        await _charged_batch(daemon, peer, handle, 20, cancelled=True)  # the fastest now
        clock.trip = 5.0
        # Less its fastest doorbell (well under 0.1 s): the 5 s stay charged.
        assert await _charged_batch(daemon, peer, handle, 30, cancelled=True) >= 4_900_000
        peer.close()


def _reporting(monkeypatch: pytest.MonkeyPatch, seconds: float) -> None:
    """Each ``wait`` answer comes with ``seconds`` of DSP time reported, as the driver's
    ``dsp_report`` gives it (the emulator's DSP reports for a wait_signal that answers
    packets; the cancelled one here reports nothing of its own)."""
    run = Invoke.run

    def reported(self: Invoke) -> Answer:
        answer = run(self)
        if self.request.wait:
            self.reported_dsp_seconds = seconds
        return answer

    monkeypatch.setattr(Invoke, "run", reported)


@pytest.mark.parametrize("batches", ["gated", "counted"])
async def test_a_batch_is_charged_the_dsp_time_reported_with_its_answer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, batches: str
) -> None:
    """When the DSP tells a batch's time with the answer, that is the charge, not
    doorbell-to-answer (here well under a second) less the path's round trip."""
    _reporting(monkeypatch, 3.0)
    config = f'[scheduler]\nbatches = "{batches}"\nbatch_answer_max_s = 60\n'
    async with serve_daemon(tmp_path, config) as daemon:
        peer, handle = await _open(tmp_path, "background")
        domain_before = next(d for d in daemon.broker.status().domains if d.isolated).dsp_us
        before = _client(daemon).dsp_us
        await _charged_batch(daemon, peer, handle, 10)
        with trio.fail_after(10):  # the charge follows the answer (a bound, not a speed)
            while _client(daemon).dsp_us - before < 3_000_000:
                await trio.sleep(0.005)
        # Plus the calls' own time (the doorbell's when counted, the cancel's), charged
        # as calls': nothing of the estimate's well under a second is added.
        assert _client(daemon).dsp_us - before < 3_900_000
        (domain,) = [d for d in daemon.broker.status().domains if d.isolated]
        assert domain.dsp_us - domain_before >= 3_000_000
        peer.close()


async def test_a_reported_answer_with_no_batch_open_is_charged_all_the_same(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The DSP may take a packet from the ring, and answer it, before npud passes its
    doorbell on (the CPU library sends doorbells from a thread of its own): the answer
    finds no batch open, and the time it reports is still the client's."""
    _reporting(monkeypatch, 2.0)
    async with serve_daemon(tmp_path, '[scheduler]\nbatches = "gated"\n') as daemon:
        peer, handle = await _open(tmp_path, "background")
        await peer.write(p.InvokeRequest(id=5, handle=handle, method=CANCEL_WAIT_SIGNAL))
        assert await peer.next() == p.InvokeReply(id=5)
        before = _client(daemon).dsp_us
        wait = p.InvokeRequest(
            id=6,
            handle=handle,
            method=WAIT_SIGNAL,
            outputs=(p.InlineOutput(capacity=4),),
            wait=True,
        )
        await peer.write(wait)
        assert await peer.next() == p.InvokeReply(id=6, outputs=(b"\xff\xff\xff\xff",))
        with trio.fail_after(10):  # the charge follows the answer (a bound, not a speed)
            while _client(daemon).dsp_us - before < 2_000_000:
                await trio.sleep(0.005)
        assert _running(daemon) == 0
        peer.close()
