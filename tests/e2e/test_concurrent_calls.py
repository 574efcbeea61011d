"""One client shared by threads (blocking) or tasks (trio), against a real npud: every
request kind at once, every answer reaching its own caller, none left waiting.

Each worker checks that what comes back is its own (a buffer's bytes, an echo's
output, a model's output, a ping's payload), so an answer handed to the wrong
waiter fails the test; a worker that never gets its answer trips the hang guard
(generous, and not a measurement: nothing here is timed).
"""

from __future__ import annotations

import struct
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import trio

import npu_client
from tests.e2e.daemon import Npud, start_npud
from tests.emulator import onnx_models

ECHO_URI = "file:///libecho_skel.so?echo_skel_handle_invoke&_modver=1.0&_dom=cdsp"
WORKERS = 6
ROUNDS = 12
HANG_GUARD = 120.0
"""Seconds after which a worker still waiting is a hang (the test fails, naming it)."""


@pytest.fixture
def npud(tmp_path: Path) -> Iterator[Npud]:
    daemon = start_npud(tmp_path)
    yield daemon
    assert daemon.stop() == 0, daemon.log()
    assert '"level": "error"' not in daemon.log()


@pytest.fixture
def model_path(tmp_path: Path) -> Path:
    path = tmp_path / "add_one.onnx"
    path.write_bytes(onnx_models.add_one())
    return path


def _echo_args(payload: bytes) -> tuple[list[bytes], list[int]]:
    return [struct.pack("<II", len(payload), len(payload)), payload], [len(payload)]


def _blocking_worker(client: npu_client.Client, model: npu_client.Model, index: int) -> None:
    """Every request kind, ROUNDS times, each answer checked against what was asked (a
    model each: runs of one model share its tensors)."""
    with client.open(ECHO_URI) as echo:
        for round_ in range(ROUNDS):
            tag = f"w{index}r{round_}".encode()
            with client.alloc(4096 * (index + 1)) as buffer:
                buffer.view()[: len(tag)] = tag
                buffer.map()
                prim = struct.pack("<II", len(tag), len(tag))
                result = echo.invoke(
                    2, [prim, buffer.slice(0, len(tag))], [buffer.slice(64, len(tag))]
                )
                assert result == [None]
                assert bytes(buffer.view()[64 : 64 + len(tag)]) == tag
                buffer.unmap()
            inputs, outputs = _echo_args(tag)
            assert echo.invoke(2, inputs, outputs) == [tag]
            x = np.full((2, 4), index * 100 + round_, np.float32)
            np.testing.assert_array_equal(model.run({"x": x})["y"], x + 1)
            assert client.ping(tag) == tag
            assert any(row.name == "shared" for row in client.status().clients)


def test_threads_share_one_client_for_every_request_kind(npud: Npud, model_path: Path) -> None:
    errors: list[BaseException] = []
    with npu_client.connect(str(npud.socket_path), name="shared") as client:
        # Loaded one at a time: npud bounds a user's loads in flight (QUOTA_EXCEEDED).
        models = [client.load_model(model_path) for _ in range(WORKERS)]

        def run(index: int) -> None:
            try:
                _blocking_worker(client, models[index], index)
            except BaseException as exc:
                errors.append(exc)

        threads = [threading.Thread(target=run, args=(i,)) for i in range(WORKERS)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(HANG_GUARD)
        hung = [thread.name for thread in threads if thread.is_alive()]
        stats = client.statistics()
        if hung:
            client.close()  # fails the callers still waiting, so the threads end
            for thread in threads:
                thread.join(HANG_GUARD)
            pytest.fail(f"threads {hung} never got their answers ({stats})")
    assert errors == []
    assert stats.requests_in_flight == 0


async def _trio_worker(client: Any, model: Any, index: int) -> None:
    async with await client.open(ECHO_URI) as echo:
        for round_ in range(ROUNDS):
            tag = f"t{index}r{round_}".encode()
            async with await client.alloc(4096 * (index + 1)) as buffer:
                buffer.view()[: len(tag)] = tag
                await buffer.map()
                prim = struct.pack("<II", len(tag), len(tag))
                result = await echo.invoke(
                    2, [prim, buffer.slice(0, len(tag))], [buffer.slice(64, len(tag))]
                )
                assert result == [None]
                assert bytes(buffer.view()[64 : 64 + len(tag)]) == tag
                await buffer.unmap()
            inputs, outputs = _echo_args(tag)
            assert await echo.invoke(2, inputs, outputs) == [tag]
            x = np.full((2, 4), index * 100 + round_, np.float32)
            np.testing.assert_array_equal((await model.run({"x": x}))["y"], x + 1)
            assert await client.ping(tag) == tag
            assert any(row.name == "shared" for row in (await client.status()).clients)
            # A call given up (here before it could even be written: the task is
            # cancelled at once) must leave nothing behind for the others.
            with trio.CancelScope() as scope:
                scope.cancel()
                await client.status()


async def test_tasks_share_one_trio_client_for_every_request_kind(
    npud: Npud, model_path: Path
) -> None:
    async with npu_client.open_trio_client(str(npud.socket_path), name="shared") as client:
        models = [await client.load_model(model_path) for _ in range(WORKERS)]
        with trio.move_on_after(HANG_GUARD) as guard:
            async with trio.open_nursery() as nursery:
                for index in range(WORKERS):
                    nursery.start_soon(_trio_worker, client, models[index], index)
        assert not guard.cancelled_caught, f"tasks never got their answers ({client.statistics()})"
        assert client.statistics().requests_in_flight == 0
