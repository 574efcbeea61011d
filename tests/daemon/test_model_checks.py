"""A model file's checks through the daemon (issue 27, item 3): on a thread of the
load's own, not the domain's loader lane, and bounded in time by
``[daemon] model_check_s``."""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any

import pytest
import trio
from onnx import helper

import npu_client
from npu_client import trio_client
from npud.fastrpc.stubs import model_walks
from npud.formats import onnx_proto
from tests.daemon.wire import serve_daemon
from tests.emulator import onnx_models


def tiny_fields_model(size: int) -> bytes:
    """About ``size`` bytes of empty nodes: the review's crafted file."""
    head = b"\x08\x08" + onnx_proto.length_field(8, b"\x10\x11")
    return head + onnx_proto.length_field(7, b"\x0a\x00" * ((size - len(head) - 6) // 2))


async def test_a_long_check_holds_no_other_load(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One client's file check is held (as a file of millions of fields holds it); another
    client's load meanwhile goes through the same domain's loader lane and runs. The
    checks ran on that lane: the second load waited for the first check."""
    held = tmp_path / "held.onnx"
    held.write_bytes(onnx_models.add_one())
    steady = tmp_path / "affine.onnx"
    steady.write_bytes(onnx_models.affine())
    entered, release = threading.Event(), threading.Event()
    real = model_walks.walk_model_file

    def walk(fd: int, backend: str, *args: Any) -> Any:
        if os.fstat(fd).st_size == held.stat().st_size:
            entered.set()
            release.wait(60)
        return real(fd, backend, *args)

    monkeypatch.setattr(model_walks, "walk_model_file", walk)  # a small file: on the thread
    socket_path = str(tmp_path / "npud.sock")
    async with (
        serve_daemon(tmp_path),
        trio_client.open_trio_client(socket_path, name="held") as first,
        trio_client.open_trio_client(socket_path, name="steady") as second,
        trio.open_nursery() as nursery,
    ):
        loaded: list[Any] = []

        async def load_held() -> None:
            loaded.append(await first.load_model(held))

        nursery.start_soon(load_held)
        await trio.to_thread.run_sync(entered.wait, 60)
        with trio.fail_after(60):  # the lane held by the first check would never answer
            model = await second.load_model(steady)
        assert loaded == []  # the first check is still held
        await model.unload()
        release.set()
    assert len(loaded) == 1


async def test_a_check_past_model_check_s_is_refused(tmp_path: Path) -> None:
    """A file of tiny fields whose checks take longer than ``model_check_s`` is refused
    MODEL_REJECTED, saying why; a model checked in time loads after it."""
    crafted = tmp_path / "crafted.onnx"
    crafted.write_bytes(tiny_fields_model(1 << 20))
    steady = tmp_path / "affine.onnx"
    steady.write_bytes(onnx_models.affine())
    async with (
        serve_daemon(tmp_path, "[daemon]\nmodel_check_s = 0.001\n"),
        trio_client.open_trio_client(str(tmp_path / "npud.sock")) as npu,
    ):
        with pytest.raises(npu_client.ModelRejected, match="not checked in time"):
            await npu.load_model(crafted)
        status = await npu.status()
        assert status.totals.models == 0


async def test_a_crafted_file_is_refused_by_its_contents_not_its_size(tmp_path: Path) -> None:
    """Checked in time (the default bound), a file of tiny fields is what it is: a model
    whose graph the DSP cannot load, refused as such, the daemon none the worse."""
    crafted = tmp_path / "crafted.onnx"
    crafted.write_bytes(tiny_fields_model(256 * 1024))
    async with (
        serve_daemon(tmp_path),
        trio_client.open_trio_client(str(tmp_path / "npud.sock")) as npu,
    ):
        with pytest.raises(npu_client.QnnError, match="onnxruntime refused the model"):
            await npu.load_model(crafted)
        steady = tmp_path / "affine.onnx"
        steady.write_bytes(onnx_models.affine())
        model = await npu.load_model(steady)
        await model.unload()


async def test_a_model_past_the_walks_bounds_is_refused_before_the_dsp(tmp_path: Path) -> None:
    """An input of 65 dimensions: graph_io keeps at most 64 (its memory bound), so npud
    refuses the model MODEL_REJECTED naming the bound; the DSP's own walk of the same
    bytes treats it as a model it cannot size (never a crash of its process)."""
    from npud.sim.tensor_specs import with_input_shapes

    wide = onnx_models.model(
        [helper.make_node("Identity", ["x"], ["y"])],
        [onnx_models.tensor("x", "float32", [1] * 65)],
        [onnx_models.tensor("y", "float32", ["n"])],
    )
    assert with_input_shapes(wide, {}) is None
    path = tmp_path / "wide.onnx"
    path.write_bytes(wide)
    async with (
        serve_daemon(tmp_path),
        trio_client.open_trio_client(str(tmp_path / "npud.sock")) as npu,
    ):
        with pytest.raises(npu_client.ModelRejected, match="more than 64 dimensions"):
            await npu.load_model(path)
