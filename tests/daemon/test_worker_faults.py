"""A bug of ours on a data-path worker (any exception but a CodedError) answers the
request with INTERNAL_ERROR, is logged once, and leaves every worker alive (issue 17,
item 7): in the arrival step, in the work and in a DSP call."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio
from structlog.testing import capture_logs

import npu_protocol as p
from npu_protocol import ErrorCode
from npud.requests import daemon_requests, skel_requests
from tests.daemon.wire import RawPeer, serve_daemon


class BoomError(RuntimeError):
    pass


def _explode(*args: object) -> None:
    raise BoomError("Set changed size during iteration")


@pytest.mark.parametrize(
    ("handler", "step"),
    [
        (daemon_requests.Ping, "arrive"),
        (daemon_requests.Ping, "run"),
        (skel_requests.Invoke, "arrive"),
    ],
)
async def test_a_bug_answers_internal_error_and_the_workers_live_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, handler: type, step: str
) -> None:
    async with serve_daemon(tmp_path) as daemon:
        datapath = daemon.broker.datapath
        workers = len(datapath._threads)
        peer = await RawPeer.connect(tmp_path / "npud.sock")
        monkeypatch.setattr(handler, step, _explode)
        with capture_logs() as logs:
            # More faulty requests than there are workers: a dead worker would show.
            faulty = [
                p.PingRequest(id=i)
                if handler is daemon_requests.Ping
                else p.InvokeRequest(id=i, handle=1, method=2)
                for i in range(1, workers + 3)
            ]
            await peer.write(*faulty)
            answers = await peer.answers(len(faulty))
        assert all(isinstance(a, p.ErrorMessage) for a in answers)
        assert {a.code for a in answers if isinstance(a, p.ErrorMessage)} == {
            ErrorCode.INTERNAL_ERROR
        }
        failed = [entry for entry in logs if entry["log_level"] in ("error", "critical")]
        assert len(failed) == len(faulty)  # one line each, with the traceback
        monkeypatch.undo()
        await peer.write(*(p.PingRequest(id=100 + i) for i in range(workers * 2)))
        pongs = await peer.answers(workers * 2)
        assert all(isinstance(a, p.PongReply) for a in pongs)
        assert datapath.alive()
        peer.close()
        await trio.sleep(0)
