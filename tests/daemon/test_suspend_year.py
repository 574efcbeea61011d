"""A year of laptop life: npud through 300 system suspends (issue 29, item 7).

Each suspend interrupts every call waiting for the DSP (each session's listener
in next2, a dspqueue client's wait_signal), and mainline's fastrpc keeps each
interrupted call's context until its fd closes: 255 for the whole CDSP. On one
fd npud would run out after about 85 suspends with these three waiting calls,
and then every call of every program on the CDSP fails (ENOSPC). npud counts
the contexts its sessions hold and reopens the sessions holding the most
before the limit, and says so in its status and log.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import trio
from structlog.testing import capture_logs

import npu_protocol as p
from npu_protocol import ErrorCode
from npud.daemon import server
from npud.ops.config import ConfigError, parse_config
from npud.sim.channel import FASTRPC_CTX_IDS
from npud.sim.skels_dspqueue import URI as DSPQUEUE_URI
from tests.daemon.test_protocol4 import connect, sim_of
from tests.daemon.wire import TEST_URI, RawPeer, busy, serve_daemon

SUSPENDS = 300
LIMIT = 60
WAIT_SIGNAL = 6


class DspQueueClient:
    """In a DSP process of its own, always one wait_signal outstanding (the receive
    thread of dspqueue); after a restart of its domain it opens the skel again."""

    def __init__(self, peer: RawPeer) -> None:
        self.peer = peer
        self.waits_sent = 0
        self.restarts_seen = 0
        self.answers: list[p.ServerMessage] = []

    async def run(self) -> None:
        request_id = 1000
        while True:
            request_id += 1
            await self.peer.write(p.OpenRequest(id=request_id, uri=DSPQUEUE_URI))
            opened = await self._answer(request_id)
            if not isinstance(opened, p.OpenReply):
                continue  # the domain was restarting: try again
            request_id += 1
            wait = p.InvokeRequest(
                id=request_id,
                handle=opened.handle,
                method=WAIT_SIGNAL,
                outputs=(p.InlineOutput(capacity=4),),
                wait=True,
            )
            await self.peer.write(wait)
            self.waits_sent += 1
            self.answers.append(await self._answer(request_id))

    async def _answer(self, request_id: int) -> p.ServerMessage:
        while True:
            message = await self.peer.next()
            if isinstance(message, p.SessionRestarted):
                self.restarts_seen += 1
                continue
            if getattr(message, "id", None) == request_id:
                return message


class VoiceClient:
    """A realtime client in the shared default domain: a call after every resume."""

    def __init__(self, peer: RawPeer) -> None:
        self.peer = peer
        self.handle: int | None = None
        self.calls_done = 0
        self.restarts_seen = 0
        self._ids = 0

    async def call(self) -> None:
        """One call that must succeed; a restart of the domain means opening the skel
        again, as a client does on SessionRestarted."""
        for _ in range(50):
            if self.handle is None:
                self._ids += 1
                await self.peer.write(p.OpenRequest(id=self._ids, uri=TEST_URI))
                opened = await self._answer(self._ids)
                if not isinstance(opened, p.OpenReply):
                    assert isinstance(opened, p.ErrorMessage), opened
                    assert opened.code == ErrorCode.DSP_RESTARTED, opened
                    await trio.sleep(0.01)
                    continue
                self.handle = opened.handle
            self._ids += 1
            await self.peer.write(busy(self._ids, self.handle, 100))
            answer = await self._answer(self._ids)
            if isinstance(answer, p.InvokeReply):
                self.calls_done += 1
                return
            assert isinstance(answer, p.ErrorMessage), answer
            # Only a restart of the domain may get in the way; never ENOSPC.
            assert answer.code == ErrorCode.DSP_RESTARTED, answer
            self.handle = None
        raise AssertionError("the voice client's call never went through")

    async def _answer(self, request_id: int) -> p.ServerMessage:
        while True:
            message = await self.peer.next()
            if isinstance(message, p.SessionRestarted):
                self.restarts_seen += 1
                self.handle = None
                continue
            if getattr(message, "id", None) == request_id:
                return message


@pytest.mark.timeout(600)
async def test_npud_serves_through_300_suspends(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # npud looks at the suspend count every half second: suspends here come faster.
    monkeypatch.setattr(server, "SUSPEND_CHECK_INTERVAL", 0.005)
    config = f"[domains]\nreopen_at_interrupted_contexts = {LIMIT}\n"
    path = tmp_path / "npud.sock"
    with capture_logs() as logs:
        async with serve_daemon(tmp_path, config) as daemon:
            sim = sim_of(daemon)
            queue_peer, welcome = await connect(path, "libcdsprpc", isolate=True)
            assert isinstance(welcome, p.Welcome), welcome
            voice_peer, welcome = await connect(path, "voice", priority=p.Priority.REALTIME)
            assert isinstance(welcome, p.Welcome), welcome
            queue = DspQueueClient(queue_peer)
            voice = VoiceClient(voice_peer)
            most_contexts = 0
            async with trio.open_nursery() as nursery:
                nursery.start_soon(queue.run)
                await voice.call()
                # Two listeners and the wait are waiting on the DSP.
                while sim.statistics().invokes_in_flight < 3:
                    await trio.sleep(0.005)
                for _ in range(SUSPENDS):
                    sim.faults.suspend()
                    seen = sim.statistics().suspends
                    # npud sees the resume before the next suspend, as on a laptop.
                    while daemon.broker.device.driver.suspends() != seen:
                        await trio.sleep(0.001)
                    await trio.sleep(0.01)
                    await voice.call()
                    stats = sim.statistics()
                    most_contexts = max(most_contexts, stats.contexts_in_use)
                    assert stats.contexts_in_use < FASTRPC_CTX_IDS
                rows = daemon.broker.domains.rows()
                nursery.cancel_scope.cancel()
            stats = sim.statistics()
            assert stats.suspends == SUSPENDS
            # Without the reopens: 3 contexts kept per suspend, 900 in all. With them, the
            # sessions being reopened hold theirs a little longer beside the new ones.
            assert most_contexts <= 2 * LIMIT
            assert voice.calls_done == SUSPENDS + 1
            reopens = sum(row.suspend_reopens for row in rows)
            assert reopens >= SUSPENDS * 3 // LIMIT - 2
            assert all(row.interrupted_contexts < LIMIT for row in rows)
            assert queue.waits_sent >= 2  # it waited again in its reopened domain
            assert queue.restarts_seen >= 1
            # And npud still serves: a new client's call goes through.
            fresh = await RawPeer.connect(path, name="after")
            await fresh.write(p.OpenRequest(id=1, uri=TEST_URI))
            opened = await fresh.next()
            assert isinstance(opened, p.OpenReply), opened
            await fresh.write(busy(2, opened.handle, 100))
            assert isinstance(await fresh.next(), p.InvokeReply)
            fresh.close()
            queue_peer.close()
            voice_peer.close()
    reopened = [
        e for e in logs if e["event"] == "session reopened to free contexts that suspends left"
    ]
    assert len(reopened) == reopens
    assert all(e["log_level"] == "warning" for e in reopened)


def test_the_limit_is_a_setting_within_the_channel() -> None:
    assert parse_config("").domains.reopen_at_interrupted_contexts == 128
    assert parse_config("[domains]\nreopen_at_interrupted_contexts = 254\n")
    for bad in (0, 255, -1):
        with pytest.raises(ConfigError, match="reopen_at_interrupted_contexts"):
            parse_config(f"[domains]\nreopen_at_interrupted_contexts = {bad}\n")
