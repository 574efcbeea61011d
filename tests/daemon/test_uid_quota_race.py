"""A quota that spans a user's connections holds under concurrent requests (issue 27):
the check and the reservation of an object are one step, so requests of several
connections of one uid, read on different worker threads, cannot all pass the
check before any of them reserved."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import trio

import npu_protocol as p
from npud.requests.clients import ObjectTable
from tests.daemon.wire import RawPeer, serve_daemon

CONNECTIONS = 4
ALLOCS = 6
LIMIT = 3


@pytest.fixture
def slow_reserve(monkeypatch: pytest.MonkeyPatch) -> None:
    """A worker thread preempted between a quota's check and its reservation: the
    window every connection's reader thread had, widened so the test sees it."""
    reserve = ObjectTable.reserve

    def slowly(self: ObjectTable, *args: object, **kwargs: object) -> object:
        time.sleep(0.01)
        return reserve(self, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(ObjectTable, "reserve", slowly)


@pytest.mark.usefixtures("slow_reserve")
async def test_concurrent_allocs_of_one_user_never_pass_its_quota(tmp_path: Path) -> None:
    config = f"[uid_limits]\nmax_buffers = {LIMIT}\n[scheduler]\nworkers = 6\n"
    async with serve_daemon(tmp_path, config) as daemon:
        peers = [
            await RawPeer.connect(tmp_path / "npud.sock", name=f"racer-{n}")
            for n in range(CONNECTIONS)
        ]
        answers: list[p.ServerMessage] = []

        async def race(peer: RawPeer) -> None:
            await peer.write(*(p.AllocRequest(id=i + 1, size=4096) for i in range(ALLOCS)))
            answers.extend(await peer.answers(ALLOCS))

        with trio.fail_after(30):
            async with trio.open_nursery() as nursery:
                for peer in peers:
                    nursery.start_soon(race, peer)
        granted = [a for a in answers if isinstance(a, p.AllocReply)]
        refused = [a for a in answers if isinstance(a, p.ErrorMessage)]
        assert len(granted) == LIMIT, [type(a).__name__ for a in answers]
        assert {a.error_code for a in refused} == {p.ErrorCode.QUOTA_EXCEEDED}
        assert all("buffers of this user" in a.message for a in refused)
        held = sum(row.buffers for row in daemon.broker.status().clients)
        assert held == LIMIT
        for peer in peers:
            peer.close()
