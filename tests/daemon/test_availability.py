"""npu_client.is_available and Client.utilization, in both clients (issue 20's consumer API)."""

from __future__ import annotations

import functools
import gc
import socket
from pathlib import Path

import pytest
import trio

import npu_client
from npu_client import trio_client
from npud.daemon import server
from tests.daemon.wire import serve_daemon


async def test_available_when_npud_answers_with_its_dsp_up(tmp_path: Path) -> None:
    path = tmp_path / "npud.sock"
    async with serve_daemon(tmp_path):
        assert await trio.to_thread.run_sync(lambda: npu_client.is_available(path))
        assert await trio_client.is_available(path)


async def test_not_available_and_never_raising_where_nothing_answers(tmp_path: Path) -> None:
    (tmp_path / "a-directory").mkdir()
    silent = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    silent.bind(str(tmp_path / "silent.sock"))
    silent.listen(1)  # accepts the connection, never answers the Hello
    try:
        for name in ("missing.sock", "a-directory", "silent.sock"):
            path = tmp_path / name
            probe = functools.partial(npu_client.is_available, path, timeout=0.2)
            assert not await trio.to_thread.run_sync(probe)
            assert not await trio_client.is_available(path, timeout=0.2)
    finally:
        silent.close()


async def test_utilization_is_the_daemons_busy_share(tmp_path: Path) -> None:
    path = str(tmp_path / "npud.sock")
    async with serve_daemon(tmp_path), trio_client.open_trio_client(path) as npu:
        status = await npu.status()
        assert status.scheduler is not None
        share = await npu.utilization()
        assert 0.0 <= share <= 1.0
        assert share == status.scheduler.utilisation_pct / 100  # idle: both 0

        def blocking() -> float:
            with npu_client.connect(path) as client:
                return client.utilization()

        assert await trio.to_thread.run_sync(blocking) == share


async def test_start_up_is_frozen_a_moment_after_ready_not_before(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The collection before gc.freeze() costs tens of ms: ready does not wait for it.
    monkeypatch.setattr(server, "FREEZE_AFTER_READY", 0.05)
    gc.unfreeze()
    async with serve_daemon(tmp_path):
        assert gc.get_freeze_count() == 0
        with trio.fail_after(10):
            while gc.get_freeze_count() == 0:
                await trio.sleep(0.01)
    gc.unfreeze()
