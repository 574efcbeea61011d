"""The typed portal_qnn API over the emulator: ONNX models on the simulated DSP, every error path.

Models are built by the tests (tests/emulator/onnx_models.py); tensors travel
as slices of one session DMA-BUF; each test ends with nothing left behind
(fds, exposed files, DSP handles).
"""

from __future__ import annotations

import os
import struct
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import numpy.typing as npt
import pytest

from npu_protocol import AEE, ErrorCode
from npud import idl
from npud.fastrpc.kernel.dma import DmaBuffer
from npud.fastrpc.kernel.errors import RpcError
from npud.fastrpc.kernel.invoke_args import Slice
from npud.fastrpc.session import FastRpcSession
from npud.fastrpc.stubs import portal_qnn
from npud.fastrpc.stubs.portal_qnn import (
    MAX_MODELS,
    DataType,
    LoadedModel,
    ModelError,
    ModelFailure,
    PortalQnn,
    arena_layout,
    model_uri_query,
)
from npud.formats import graph_pack
from npud.ops.backend import DEV_SHELL
from npud.sim import DSP_LIBRARY_DIR, EmulatedDriver
from tests.emulator import onnx_models
from tests.emulator.conftest import open_fds
from tests.emulator.onnx_models import opened

SLOT_BYTES = 4096


@pytest.fixture
def driver() -> EmulatedDriver:
    return EmulatedDriver()


@pytest.fixture
def session(driver: EmulatedDriver) -> Iterator[FastRpcSession]:
    before = open_fds()
    session = FastRpcSession.open(driver, library_path=[DSP_LIBRARY_DIR])
    session.load_shell(DEV_SHELL.read_bytes())
    yield session
    assert session.exposed_files == 0, "a model file is still lent to the DSP"
    session.close()
    assert open_fds() == before, "fds leaked"
    assert driver.statistics().remote_handles_open == 0


@pytest.fixture
def portal(session: FastRpcSession) -> Iterator[PortalQnn]:
    with PortalQnn.open(session, backend="emulator") as portal:
        yield portal


class Tensors:
    """Arrays in and out of one DMA-BUF, a SLOT_BYTES slot each."""

    def __init__(self, session: FastRpcSession) -> None:
        self.buffer: DmaBuffer = session.alloc(64 * SLOT_BYTES)
        self._next = 0

    def slot(self, length: int) -> Slice:
        assert length <= SLOT_BYTES
        data = Slice(self.buffer, self._next * SLOT_BYTES, length)
        self._next += 1
        return data

    def put(self, array: npt.NDArray[np.generic]) -> Slice:
        data = self.slot(array.nbytes)
        raw = np.ascontiguousarray(array).reshape(-1).view(np.uint8).tobytes()
        self.buffer.view()[data.offset : data.offset + data.length] = raw
        return data

    def get(self, data: Slice, dtype: str, shape: tuple[int, ...]) -> npt.NDArray[np.generic]:
        raw = bytes(self.buffer.view()[data.offset : data.offset + data.length])
        count = int(np.prod(shape, dtype=np.int64))
        return np.frombuffer(raw, dtype, count).reshape(shape)


@pytest.fixture
def tensors(session: FastRpcSession) -> Tensors:
    return Tensors(session)


def load(portal: PortalQnn, tmp_path: Path, data: bytes, **kwargs: object) -> LoadedModel:
    with opened(tmp_path, "model.onnx", data) as fd:
        return portal.load(fd, **kwargs)  # type: ignore[arg-type]


def failure(exc: pytest.ExceptionInfo[ModelError]) -> ModelFailure:
    return exc.value.failure


# --- loading and running ------------------------------------------------------------


def test_load_describes_run_computes_unload_frees(
    portal: PortalQnn, session: FastRpcSession, tensors: Tensors, tmp_path: Path
) -> None:
    requests_before = session.statistics().listener_requests
    with opened(tmp_path, "affine.onnx", onnx_models.affine()) as fd:
        model = portal.load(fd)
        assert os.pread(fd, 2, 0)  # the caller's fd is still its own, open
    assert session.exposed_files == 0  # lent for the load only
    assert session.statistics().listener_requests > requests_before  # read by the DSP
    assert model.file.description.startswith("an ONNX model (IR version 8, opset 17")
    (graph,) = model.graphs
    assert [(s.name, s.dtype, s.shape, s.nbytes) for s in graph.inputs] == [
        ("a", DataType.FLOAT32, (3,), 12),
        ("b", DataType.FLOAT32, (3,), 12),
        ("k", DataType.INT64, (), 8),
    ]
    assert [(s.name, s.dtype, s.shape) for s in graph.outputs] == [
        ("y", DataType.FLOAT32, (3,)),
        ("n", DataType.INT64, ()),
    ]
    assert portal.models() == {model.slot: model}

    a = np.array([1, 2, 3], np.float32)
    b = np.array([0.5, 0.25, 0.125], np.float32)
    portal.set_input(model.slot, "a", tensors.put(a), dtype=DataType.FLOAT32, shape=(3,))
    portal.set_input(model.slot, 1, tensors.put(b))
    portal.set_input(model.slot, "k", tensors.put(np.array(41, np.int64)))
    portal.execute(model.slot)
    y, n = tensors.slot(12), tensors.slot(16)  # a larger buffer is zero-filled past the output
    assert portal.get_output(model.slot, "y", y) == 12
    assert portal.get_output(model.slot, 1, n) == 8
    np.testing.assert_array_equal(tensors.get(y, "float32", (3,)), a * 2 + b)
    assert tensors.get(n, "int64", (2,)).tolist() == [42, 0]

    # Inputs persist: run again with one input changed, through run().
    produced = portal.run(model.slot, {"k": tensors.put(np.array(9, np.int64))}, {"n": n})
    assert produced == {"n": 8}
    assert int(tensors.get(n, "int64", ())) == 10

    portal.unload(model.slot)
    assert portal.models() == {}
    with pytest.raises(ModelError) as unloaded_twice:
        portal.unload(model.slot)
    assert failure(unloaded_twice) is ModelFailure.NOT_LOADED
    assert unloaded_twice.value.code is ErrorCode.MODEL_NOT_LOADED
    with pytest.raises(ModelError, match=r"no model is loaded: model slot [0-9]"):
        portal.execute(model.slot)


@pytest.mark.parametrize(
    "dtype",
    ["float32", "float16", "int8", "uint8", "int16", "uint16", "int32", "uint32", "int64", "bool"],
)
def test_every_data_type_round_trips(
    portal: PortalQnn, tensors: Tensors, tmp_path: Path, dtype: str
) -> None:
    model = load(portal, tmp_path, onnx_models.identity(dtype))
    spec = model.graphs[0].inputs[0]
    assert spec.dtype == DataType.from_name(dtype)
    assert isinstance(spec.dtype, DataType)
    assert spec.dtype.numpy == dtype
    values = np.arange(5).astype(dtype)
    out = tensors.slot(spec.nbytes)
    portal.run(model.slot, {0: tensors.put(values)}, {0: out})
    np.testing.assert_array_equal(tensors.get(out, dtype, (5,)), values)
    portal.unload(model.slot)


def test_shapes_fix_free_dimensions_and_named_ones_propagate(
    portal: PortalQnn, tensors: Tensors, tmp_path: Path
) -> None:
    named = load(portal, tmp_path, onnx_models.add_one(("N", 4)), shapes={"x": (3, 4)})
    assert [s.shape for s in (*named.graphs[0].inputs, *named.graphs[0].outputs)] == [(3, 4)] * 2
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    y = tensors.slot(48)
    portal.run(named.slot, {"x": tensors.put(x)}, {"y": y})
    np.testing.assert_array_equal(tensors.get(y, "float32", (3, 4)), x + 1)
    # Unnamed free dimensions of an output follow from the inputs' shapes (onnxruntime's
    # inference on the model with x declared [2, 4]); given, they are checked against it.
    unnamed = onnx_models.add_one((None, 4), out_shape=(None, None))
    inferred = load(portal, tmp_path, unnamed, shapes={"x": (2, 4)})
    assert inferred.graphs[0].outputs[0].shape == (2, 4)
    both = load(portal, tmp_path, unnamed, shapes={"x": (2, 4), "y": (2, 4)})
    assert both.graphs[0].outputs[0].nbytes == 32
    # A free input: the refusal says which tensor and dimension, and what to give, in the
    # client's terms.
    with pytest.raises(
        ModelError,
        match=r"input 'x' dimension 0 is free: .* shapes=\{'x': \[N, 4\]\}"
        r" \(npuctl run --shape x=N,4\); output shapes follow from the inputs'",
    ) as free:
        load(portal, tmp_path, unnamed, shapes={"y": (2, 4)})
    assert failure(free) is ModelFailure.MODEL_REJECTED


def test_an_output_that_does_not_follow_from_the_inputs_is_named(
    portal: PortalQnn, tensors: Tensors, tmp_path: Path
) -> None:
    """y = reshape(x, s): s's values, not its shape, make y's shape."""
    free = onnx_models.reshape(y_shape=(None, None))
    with pytest.raises(
        ModelError,
        match=r"output 'y' dimensions 0 and 1 do not follow from the input shapes given"
        r" .* shapes=\{'y': \[N, N\]\} \(npuctl run --shape y=N,N\); where the data decides",
    ) as refused:
        load(portal, tmp_path, free)
    assert failure(refused) is ModelFailure.MODEL_REJECTED
    # The DSP's own reason (last_error of the handle's load) replaces "its log says which".
    assert refused.value.detail.endswith(
        "; the DSP says: y dimensions 0, 1 are free (not from the inputs' shapes):"
        " give its shape, N,N"
    )
    assert portal.last_error(portal_qnn.NO_MODEL).startswith("y dimensions 0, 1 are free")
    given = load(portal, tmp_path, free, shapes={"y": (3, 2)})
    x = np.arange(6, dtype=np.float32)
    y = tensors.slot(24)
    portal.run(given.slot, {"x": tensors.put(x), "s": tensors.put(np.array([3, 2]))}, {"y": y})
    np.testing.assert_array_equal(tensors.get(y, "float32", (3, 2)), x.reshape(3, 2))


def test_question_mark_dimensions_are_each_free_on_their_own(
    portal: PortalQnn, tensors: Tensors, tmp_path: Path
) -> None:
    """An OCR classifier [?, 3, 48, ?] loads at 48 x 192; y's '?' follows from x's."""
    model = load(portal, tmp_path, onnx_models.ocr_classifier(), shapes={"x": (1, 3, 48, 192)})
    assert model.graphs[0].outputs[0].shape == (1, 3)
    x = np.ones((1, 3, 48, 192), np.float32) * np.array([1, 2, 3], np.float32)[:, None, None]
    y = tensors.slot(12)
    data = Slice(tensors.buffer, 32 * SLOT_BYTES, x.nbytes)
    tensors.buffer.view()[data.offset : data.offset + data.length] = x.tobytes()
    portal.run(model.slot, {"x": data}, {"y": y})
    np.testing.assert_array_equal(tensors.get(y, "float32", (1, 3)), [[1, 2, 3]])


def test_a_named_dimension_fixed_by_an_input_is_fixed_in_the_outputs(
    portal: PortalQnn, tmp_path: Path
) -> None:
    """Piper: input [1, 9] fixes batch_size in output too; only time is left, and both the
    daemon and the DSP say so with the shape to give keeping what is fixed."""
    with pytest.raises(ModelError) as refused:
        load(portal, tmp_path, onnx_models.duration_tts(), shapes={"input": (1, 9)})
    assert failure(refused) is ModelFailure.MODEL_REJECTED
    detail = refused.value.detail
    assert detail.startswith("output 'output' dimension 2 ('time') does not follow")
    assert "shapes={'output': [1, 1, N]}" in detail
    assert detail.endswith(
        "the DSP says: output dimension 2 ('time') is free (not from the inputs' shapes):"
        " give its shape, 1,1,N"
    )
    given = load(
        portal, tmp_path, onnx_models.duration_tts(), shapes={"input": (1, 9), "output": (1, 1, 64)}
    )
    assert [s.shape for s in given.graphs[0].inputs] == [(1, 9), (1,), (3,)]


@pytest.mark.parametrize(
    ("shapes", "why"),
    [
        ({"z": (2, 4)}, r"the model has no tensor 'z' \(its tensors: 'x', 'y'\)"),
        ({"x": (2, 4, 1)}, r"input 'x' has 2 dimensions \[\?, 4\]; the shape given has 3"),
        ({"x": (2, 5)}, r"input 'x' dimension 1 is 4; the shape given says 5"),
    ],
    ids=["unknown tensor", "rank", "fixed dimension"],
)
def test_shapes_that_do_not_fit_the_model(
    portal: PortalQnn, tmp_path: Path, shapes: dict[str, tuple[int, ...]], why: str
) -> None:
    with pytest.raises(ModelError, match=why) as caught:
        load(portal, tmp_path, onnx_models.add_one((None, 4)), shapes=shapes)
    assert failure(caught) is ModelFailure.TENSOR_MISMATCH
    assert portal.models() == {}


def test_bad_shape_arguments_are_refused_before_the_dsp(portal: PortalQnn, tmp_path: Path) -> None:
    for shapes in ({"x": (0, 4)}, {"x": (1,) * 9}, {"x": (True, 4)}, {"": (1,)}):
        with pytest.raises(ModelError) as caught:
            load(portal, tmp_path, onnx_models.add_one(), shapes=shapes)
        assert failure(caught) is ModelFailure.TENSOR_MISMATCH
    with pytest.raises(ModelError, match=r"URI .* at most 511"):
        load(portal, tmp_path, onnx_models.add_one(), shapes={"x" * 600: (1,)})
    assert model_uri_query({"a b/c": (1, 576)}) == "?shape.a%20b%2Fc=1,576"


# --- running: bad inputs --------------------------------------------------------------


def test_set_input_checks_dtype_shape_size_and_names(
    portal: PortalQnn, tensors: Tensors, tmp_path: Path
) -> None:
    model = load(portal, tmp_path, onnx_models.affine())
    a = tensors.put(np.zeros(3, np.float32))
    for kwargs, message in (
        ({"dtype": DataType.INT32}, "takes float32 \\[3\\] \\(12 bytes\\); got data type int32"),
        ({"shape": (1, 3)}, "got shape \\[1, 3\\]"),
    ):
        with pytest.raises(ModelError, match=message) as caught:
            portal.set_input(model.slot, "a", a, **kwargs)
        assert failure(caught) is ModelFailure.TENSOR_MISMATCH
    with pytest.raises(ModelError, match="got 8 bytes"):
        portal.set_input(model.slot, "a", Slice(tensors.buffer, 0, 8))
    with pytest.raises(ModelError, match="'c' is no input of graph 0 \\(it has 'a', 'b', 'k'\\)"):
        portal.set_input(model.slot, "c", a)
    with pytest.raises(ModelError) as index:
        portal.set_input(model.slot, 3, a)
    assert index.value.code is ErrorCode.INVALID_TENSOR_INDEX
    with pytest.raises(ModelError, match="graph 1 \\(the model has 1\\)"):
        portal.set_input(model.slot, "a", a, graph=1)
    with pytest.raises(TypeError, match="DMA-BUF Slice"):
        portal.set_input(model.slot, "a", b"\0" * 12)  # type: ignore[arg-type]
    with pytest.raises(ModelError, match=r"no model is loaded: model slot [0-9]"):
        portal.set_input(MAX_MODELS - 1, "a", a)


def test_missing_input_and_outputs_before_execute(
    portal: PortalQnn, tensors: Tensors, tmp_path: Path
) -> None:
    model = load(portal, tmp_path, onnx_models.affine())
    y = tensors.slot(12)
    with pytest.raises(ModelError, match="graph 0 has no outputs") as early:
        portal.get_output(model.slot, "y", y)
    assert failure(early) is ModelFailure.NOT_EXECUTED
    portal.set_input(model.slot, "a", tensors.put(np.zeros(3, np.float32)))
    with pytest.raises(ModelError, match="input 'b', 'k' of graph 0 was never set") as missing:
        portal.execute(model.slot)
    assert failure(missing) is ModelFailure.INPUT_NOT_SET
    with pytest.raises(ModelError, match="the buffer holds 8") as small:
        portal.get_output(model.slot, "y", tensors.slot(8))
    assert failure(small) is ModelFailure.TENSOR_MISMATCH


def test_a_graph_that_fails_at_run_time_is_a_qnn_error(
    portal: PortalQnn, tensors: Tensors, tmp_path: Path
) -> None:
    model = load(portal, tmp_path, onnx_models.reshape())
    x = tensors.put(np.arange(6, dtype=np.float32))
    y = tensors.slot(24)
    portal.run(model.slot, {"x": x, "s": tensors.put(np.array([3, 2], np.int64))}, {"y": y})
    with pytest.raises(ModelError, match="graph 0 failed with QNN error 1100") as caught:
        portal.run(model.slot, {"s": tensors.put(np.array([4, 2], np.int64))}, {"y": y})
    assert caught.value.code is ErrorCode.QNN
    # A failed execute leaves no outputs behind.
    with pytest.raises(ModelError) as after:
        portal.get_output(model.slot, "y", y)
    assert failure(after) is ModelFailure.NOT_EXECUTED
    assert caught.value.detail.endswith("requested shape:{4,2}")  # the skel's last_error
    assert portal.last_error(model.slot).startswith("Reshape node: The input tensor")
    portal.run(model.slot, {"s": tensors.put(np.array([2, 3], np.int64))}, {"y": y})
    assert portal.last_error(model.slot) == ""


def test_a_skel_without_last_error_leaves_the_number_alone(
    portal: PortalQnn, tensors: Tensors, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A device skel older than method 9 answers it AEE_EUNSUPPORTED (as this one answers
    a method past its last): the error says the number, as before."""
    method = idl.load("portal_qnn").method("last_error")
    unknown = idl.Method.build(method.name, 31, method.params)  # a method no skel has
    monkeypatch.setattr(portal_qnn, "_LAST_ERROR", unknown)
    model = load(portal, tmp_path, onnx_models.reshape())
    x, s = tensors.put(np.arange(6, dtype=np.float32)), tensors.put(np.array([4, 2], np.int64))
    with pytest.raises(ModelError) as caught:
        portal.run(model.slot, {"x": x, "s": s}, {"y": tensors.slot(24)})
    assert caught.value.detail == "graph 0 failed with QNN error 1100"


# --- loading: bad files and full tables -----------------------------------------------


def test_the_slot_table_fills_and_frees(portal: PortalQnn, tmp_path: Path) -> None:
    loaded = [load(portal, tmp_path, onnx_models.add_one()) for _ in range(MAX_MODELS)]
    assert sorted(m.slot for m in loaded) == list(range(MAX_MODELS))
    with pytest.raises(ModelError, match="no free model slot: all 4 model slots") as full:
        load(portal, tmp_path, onnx_models.add_one())
    assert failure(full) is ModelFailure.SLOTS_FULL
    portal.unload(2)
    assert load(portal, tmp_path, onnx_models.add_one()).slot == 2


def test_unreadable_model_files(portal: PortalQnn, tmp_path: Path) -> None:
    empty = tmp_path / "empty.onnx"
    empty.write_bytes(b"")
    read_end, write_end = os.pipe()
    directory = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    empty_fd = os.open(empty, os.O_RDONLY)
    try:
        for fd, reason in (
            (read_end, "not a regular file \\(a pipe\\)"),
            (directory, "not a regular file \\(a directory\\)"),
            (empty_fd, "the model file is empty"),
            (999_999, "Bad file descriptor"),
        ):
            with pytest.raises(ModelError, match=reason) as caught:
                portal.load(fd)
            assert failure(caught) is ModelFailure.FILE_UNREADABLE
        with (
            opened(tmp_path, "w.onnx", onnx_models.add_one(), os.O_WRONLY) as write_only,
            pytest.raises(ModelError, match="write-only"),
        ):
            portal.load(write_only)
    finally:
        for fd in (read_end, write_end, directory, empty_fd):
            os.close(fd)


def test_files_of_the_wrong_kind_or_damaged(portal: PortalQnn, tmp_path: Path) -> None:
    good = onnx_models.add_one()
    for data, failure_kind, message in (
        (Path("/bin/sh").read_bytes(), ModelFailure.FILE_FORMAT, "an ELF .* takes ONNX models"),
        (b"hello, world\n", ModelFailure.FILE_FORMAT, "a text file; the emulator backend"),
        (b"GGUF" + bytes(60), ModelFailure.FILE_FORMAT, "a GGUF model"),
        (good[: len(good) // 2], ModelFailure.FILE_MALFORMED, "damaged ONNX model: field 7 runs"),
        # The top-level fields are ONNX's, the graph inside them is garbage: the daemon's
        # walk for external data finds it before the DSP does.
        (
            good[:2] + b"\x3a\x04\xff\xff\xff\xff",
            ModelFailure.FILE_MALFORMED,
            "damaged ONNX model: a field ends inside its header",
        ),
    ):
        with pytest.raises(ModelError, match=message) as caught:
            load(portal, tmp_path, data)
        assert failure(caught) is failure_kind
    assert portal.models() == {}


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (onnx_models.many_inputs(33), "outside portal_qnn's limits"),
        (onnx_models.identity("float64"), "outside portal_qnn's limits"),
        (onnx_models.identity("float32", (1,) * 9), "outside portal_qnn's limits"),
    ],
    ids=["33 inputs", "float64", "rank 9"],
)
def test_models_outside_the_limits(
    portal: PortalQnn, tmp_path: Path, data: bytes, message: str
) -> None:
    with pytest.raises(ModelError, match=message) as caught:
        load(portal, tmp_path, data)
    assert failure(caught) is ModelFailure.MODEL_REJECTED


def test_thirty_two_inputs_and_a_long_name_are_fine(portal: PortalQnn, tmp_path: Path) -> None:
    model = load(portal, tmp_path, onnx_models.many_inputs(32))
    assert len(model.graphs[0].inputs) == 32
    name = "n" * 127
    longest = load(portal, tmp_path, onnx_models.identity("float32", name=name))
    assert longest.graphs[0].inputs[0].name == name
    with pytest.raises(ModelError, match="names under 128 bytes"):
        load(portal, tmp_path, onnx_models.identity("float32", name=name + "n"))


def test_a_model_the_runtime_refuses_is_a_qnn_error(portal: PortalQnn, tmp_path: Path) -> None:
    with pytest.raises(ModelError, match="composing the model failed with QNN error") as caught:
        load(portal, tmp_path, onnx_models.unknown_op())
    assert caught.value.code is ErrorCode.QNN
    assert portal.models() == {}


def test_the_kernel_backend_takes_qnn_libraries(session: FastRpcSession, tmp_path: Path) -> None:
    with PortalQnn.open(session, backend="kernel") as portal:
        with pytest.raises(
            ModelError, match="the kernel backend takes QNN model libraries"
        ) as onnx:
            load(portal, tmp_path, onnx_models.add_one())
        assert failure(onnx) is ModelFailure.FILE_FORMAT
        with (
            pytest.raises(ModelError, match="fixed shapes"),
            opened(tmp_path, "lib.so", _hexagon_elf()) as fd,
        ):
            portal.load(fd, shapes={"x": (1,)})
    with pytest.raises(ValueError, match="backend"):
        PortalQnn.open(session, backend="gpu")  # type: ignore[arg-type]


def _hexagon_elf() -> bytes:
    ident = b"\x7fELF\x01\x01\x01" + bytes(9)
    return ident + (3).to_bytes(2, "little") + (164).to_bytes(2, "little") + bytes(44)


def test_close_unloads_everything(
    session: FastRpcSession, driver: EmulatedDriver, tmp_path: Path
) -> None:
    portal = PortalQnn.open(session, backend="emulator")
    model = load(portal, tmp_path, onnx_models.add_one())
    assert driver.statistics().remote_handles_open == 1
    portal.close()
    portal.close()
    assert driver.statistics().remote_handles_open == 0
    with pytest.raises(ModelError, match=r"no model is loaded: model slot [0-9]"):
        portal.execute(model.slot)
    with pytest.raises(RpcError) as closed:
        load(portal, tmp_path, onnx_models.add_one())
    assert closed.value.code is ErrorCode.UNKNOWN_HANDLE
    assert session.exposed_files == 0


def test_data_type_names() -> None:
    assert DataType.from_name("f32") is DataType.FLOAT32
    assert DataType.from_name("BOOL") is DataType.BOOL
    assert DataType.from_name("uint8") is DataType.UINT8  # not the fixed-point alias
    assert DataType.SFIXED16.numpy == "int16"
    assert DataType.FLOAT16.itemsize == 2
    with pytest.raises(ValueError, match="unknown data type"):
        DataType.from_name("complex64")


# --- one run in one invoke: tensor arenas -----------------------------------------------


def test_run_arena_is_one_invoke_on_packed_tensors(
    portal: PortalQnn, session: FastRpcSession, tmp_path: Path
) -> None:
    model = load(portal, tmp_path, onnx_models.affine())
    (graph,) = model.graphs
    # a, b (12 bytes each) and k (8) at multiples of 64; y (12) and n (8) likewise.
    assert arena_layout(graph.inputs) == ((0, 64, 128), 192)
    assert arena_layout(graph.outputs) == ((0, 64), 128)
    assert (graph.input_arena, graph.output_arena) == (192, 128)
    buffer = session.alloc(4096)
    a = np.array([1, 2, 3], np.float32)
    b = np.array([0.5, 0.25, 0.125], np.float32)
    with buffer.view() as view:
        view[0:12] = a.tobytes()
        view[64:76] = b.tobytes()
        view[128:136] = np.array(41, np.int64).tobytes()
        view[1024:2048] = b"\xee" * 1024  # the outputs arena and past it: overwritten
    invokes = session.statistics().invokes_done
    portal.run_arena(model.slot, Slice(buffer, 0, 192), Slice(buffer, 1024, 256))
    assert session.statistics().invokes_done == invokes + 1
    with buffer.view() as view:
        out, past = bytes(view[1024:1280]), bytes(view[1280:1290])
    np.testing.assert_array_equal(np.frombuffer(out[:12], np.float32), a * 2 + b)
    assert np.frombuffer(out[64:72], np.int64).tolist() == [42]
    assert out[12:64] == bytes(52)
    assert out[72:] == bytes(184)
    assert past == b"\xee" * 10  # past the slice: untouched
    # The model's state is as after set_input of each input and execute.
    assert portal.get_output(model.slot, "y", Slice(buffer, 3072, 12)) == 12
    with buffer.view() as view:
        assert bytes(view[3072:3084]) == out[:12]
    portal.execute(model.slot)
    session.free(buffer)


def test_run_arena_marshals_a_graphs_invoke_once_and_again_for_other_slices(
    portal: PortalQnn, session: FastRpcSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A decoder's steps run the same graph on the same arena slices: the IDL encodes
    that invoke once, not per step; other slices (another arena) are encoded anew and
    are the ones the run uses."""
    model = load(portal, tmp_path, onnx_models.affine())
    encoded: list[str] = []
    real = idl.Method.encode

    def counted(self: idl.Method, **arguments: object) -> object:
        encoded.append(self.name)
        return real(self, **arguments)

    monkeypatch.setattr(idl.Method, "encode", counted)
    first, second = session.alloc(4096), session.alloc(4096)
    for buffer, k in ((first, 1), (second, 100)):
        with buffer.view() as view:
            view[0:12] = np.array([1, 2, 3], np.float32).tobytes()
            view[64:76] = bytes(12)
            view[128:136] = np.array(k, np.int64).tobytes()
    for _ in range(3):
        portal.run_arena(model.slot, Slice(first, 0, 192), Slice(first, 1024, 128))
    assert encoded == ["run"]
    portal.run_arena(model.slot, Slice(second, 0, 192), Slice(second, 1024, 128))
    assert encoded == ["run", "run"]
    for buffer, n in ((first, 2), (second, 101)):
        with buffer.view() as view:
            assert np.frombuffer(bytes(view[1088:1096]), np.int64).tolist() == [n]
    session.free(first)
    session.free(second)


def test_run_arena_checks_and_failures(
    portal: PortalQnn, session: FastRpcSession, tmp_path: Path
) -> None:
    affine = load(portal, tmp_path, onnx_models.affine())
    buffer = session.alloc(4096)
    inputs, outputs = Slice(buffer, 0, 192), Slice(buffer, 1024, 128)
    with pytest.raises(ModelError, match="inputs arena of graph 0 is 192 bytes; got 191") as e:
        portal.run_arena(affine.slot, Slice(buffer, 0, 191), outputs)
    assert failure(e) is ModelFailure.TENSOR_MISMATCH
    assert e.value.code is ErrorCode.TENSOR_MISMATCH
    with pytest.raises(ModelError, match="outputs arena of graph 0 is 128 bytes; the slice"):
        portal.run_arena(affine.slot, inputs, Slice(buffer, 1024, 127))
    with pytest.raises(ModelError, match="graph 1"):
        portal.run_arena(affine.slot, inputs, outputs, graph=1)
    with pytest.raises(TypeError, match="DMA-BUF Slice"):
        portal.run_arena(affine.slot, b"", outputs)  # type: ignore[arg-type]
    with pytest.raises(ModelError, match=r"no model is loaded: model slot [0-9]") as gone:
        portal.run_arena(3, inputs, outputs)
    assert failure(gone) is ModelFailure.NOT_LOADED

    # A graph that fails at run time: a QNN error, and no outputs afterwards.
    reshape = load(portal, tmp_path, onnx_models.reshape())
    (graph,) = reshape.graphs
    offsets, size = arena_layout(graph.inputs)
    with buffer.view() as view:
        view[offsets[0] : offsets[0] + 24] = np.arange(6, dtype=np.float32).tobytes()
        view[offsets[1] : offsets[1] + 16] = np.array([4, 2], np.int64).tobytes()
    with pytest.raises(ModelError, match="graph 0 failed with QNN error 1100") as qnn:
        portal.run_arena(reshape.slot, Slice(buffer, 0, size), Slice(buffer, 2048, 64))
    assert qnn.value.code is ErrorCode.QNN
    with pytest.raises(ModelError) as after:
        portal.get_output(reshape.slot, "y", Slice(buffer, 3072, 24))
    assert failure(after) is ModelFailure.NOT_EXECUTED
    with buffer.view() as view:
        view[offsets[1] : offsets[1] + 16] = np.array([3, 2], np.int64).tobytes()
    portal.run_arena(reshape.slot, Slice(buffer, 0, size), Slice(buffer, 2048, 64))
    with buffer.view() as view:
        assert np.frombuffer(bytes(view[2048:2072]), np.float32).tolist() == list(range(6))
    session.free(buffer)


# --- graph packs: several graphs of one model -----------------------------------------


def test_a_graph_pack_is_one_model_of_named_graphs_sharing_weights(
    portal: PortalQnn, tensors: Tensors, tmp_path: Path
) -> None:
    """Two graphs that use one weight stored once in the file; each has its own tensors
    and its own arenas, and runs by its index."""
    pack = onnx_models.two_graphs()
    assert pack.count(np.array(onnx_models.SHARED_WEIGHT, np.float32).tobytes()) == 1
    model = load(portal, tmp_path, pack, shapes={"token": (1, 4)})
    assert model.file.description == "a graph pack of ONNX graphs ('prefill', 'decode')"
    assert [(g.index, g.name) for g in model.graphs] == [(0, "prefill"), (1, "decode")]
    prefill, decode = model.graphs
    assert [(s.name, s.shape) for s in prefill.inputs] == [("tokens", (4, 4))]
    assert [(s.name, s.shape) for s in decode.inputs] == [("token", (1, 4))]
    assert [(s.name, s.shape) for s in decode.outputs] == [("logits", (1, 4))]
    assert (prefill.input_arena, decode.input_arena) == (64, 64)

    weight = np.array(onnx_models.SHARED_WEIGHT, np.float32)
    tokens = np.arange(16, dtype=np.float32).reshape(4, 4)
    out = tensors.slot(64)
    portal.run_arena(model.slot, tensors.put(tokens), out)  # graph 0 by default
    np.testing.assert_array_equal(tensors.get(out, "float32", (4, 4)), tokens + weight)
    token = np.array([[1, 2, 3, 4]], np.float32)
    inputs = tensors.slot(64)
    tensors.buffer.view()[inputs.offset : inputs.offset + 16] = token.tobytes()
    portal.run_arena(model.slot, inputs, out, graph=1)
    np.testing.assert_array_equal(tensors.get(out, "float32", (1, 4)), token * weight)
    # run() and the per-tensor calls name the graph by index too.
    logits = tensors.slot(16)
    portal.run(model.slot, {"token": tensors.put(token + 1)}, {"logits": logits}, graph=1)
    np.testing.assert_array_equal(tensors.get(logits, "float32", (1, 4)), (token + 1) * weight)
    with pytest.raises(ModelError, match=r"'tokens' is no input of graph 1 \(it has 'token'\)"):
        portal.set_input(model.slot, "tokens", tensors.put(tokens), graph=1)
    with pytest.raises(ModelError, match=r"graph 2 \(the model has 2\)") as beyond:
        portal.execute(model.slot, graph=2)
    assert failure(beyond) is ModelFailure.BAD_TENSOR


def test_a_plain_onnx_models_graph_is_named_by_its_graphproto(
    portal: PortalQnn, tmp_path: Path
) -> None:
    model = load(portal, tmp_path, onnx_models.add_one())
    assert [g.name for g in model.graphs] == ["test"]  # onnx_models.model's graph name


def test_shapes_of_a_pack_apply_to_every_graph_that_has_the_tensor(
    portal: PortalQnn, tmp_path: Path
) -> None:
    with pytest.raises(
        ModelError, match=r"no graph of the model has a tensor 'x' \(its tensors: 'logits',"
    ) as unknown:
        load(portal, tmp_path, onnx_models.two_graphs(), shapes={"x": (1, 4)})
    assert failure(unknown) is ModelFailure.TENSOR_MISMATCH
    with pytest.raises(ModelError, match=r"input 'token' dimension 0 \('batch'\) is free") as free:
        load(portal, tmp_path, onnx_models.two_graphs())
    assert failure(free) is ModelFailure.MODEL_REJECTED
    # "logits" is in both graphs: a shape for it must fit both (prefill's is [4, 4]).
    with pytest.raises(ModelError, match=r"output 'logits' dimension 0 is 4") as both:
        load(portal, tmp_path, onnx_models.two_graphs(), shapes={"token": (2, 4), "logits": (2, 4)})
    assert failure(both) is ModelFailure.TENSOR_MISMATCH


def test_more_graphs_than_a_model_holds_are_refused_at_load(
    portal: PortalQnn, tmp_path: Path
) -> None:
    eight = load(portal, tmp_path, onnx_models.many_graphs(8))
    assert [g.name for g in eight.graphs] == [f"g{i}" for i in range(8)]
    with pytest.raises(ModelError, match="a graph pack that holds 9 graphs; a model has at most 8"):
        load(portal, tmp_path, onnx_models.many_graphs(9))
    assert portal.models() == {eight.slot: eight}


def _pack_sharing(shared: bytes) -> bytes:
    """A pack of one graph whose shared weights are ``shared``, as they are."""
    model = onnx_models.add_one()
    header = struct.pack("<8sIIQ", graph_pack.MAGIC, graph_pack.VERSION, 1, len(shared))
    return header + shared + struct.pack("<I", 1) + b"g" + struct.pack("<Q", len(model)) + model


@pytest.mark.parametrize(
    ("data", "why"),
    [
        (graph_pack.write_pack([]), "the graph pack holds no graph"),
        (onnx_models.two_graphs()[:-3], "the file ends inside graph 'decode'"),
        (onnx_models.two_graphs() + b"\0", "1 bytes follow the last graph"),
        (graph_pack.write_pack([("a", b"x"), ("a", b"y")]), "graph name 'a' .* given twice"),
        (graph_pack.write_pack([("", b"x")]), "a graph name of 0 bytes"),
        (_pack_sharing(b"\x08\x01"), "the shared weights hold field 1, not initializers"),
        (graph_pack.write_pack([("g", b"\xff\xff")]), "damaged ONNX model"),
    ],
    ids=["empty", "cut", "trailing", "twice", "unnamed", "shared non-tensor", "bad member"],
)
def test_damaged_graph_packs(portal: PortalQnn, tmp_path: Path, data: bytes, why: str) -> None:
    with pytest.raises(ModelError, match=why) as damaged:
        load(portal, tmp_path, data)
    assert failure(damaged) is ModelFailure.FILE_MALFORMED


def test_a_pack_whose_shared_weights_are_external_is_refused(
    portal: PortalQnn, tmp_path: Path
) -> None:
    external = onnx_models.external_tensor("w", "etc/shadow")
    data = graph_pack.write_pack([("g", onnx_models.add_one())], [external.SerializeToString()])
    with pytest.raises(ModelError, match="the model refers to external data") as refused:
        load(portal, tmp_path, data)
    assert failure(refused) is ModelFailure.MODEL_REJECTED


def test_a_skel_without_graph_name_leaves_graphs_unnamed(
    portal: PortalQnn, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A device skel older than method 10 answers it AEE_EUNSUPPORTED: the graphs load
    and run, without names."""
    method = idl.load("portal_qnn").method("graph_name")
    unknown = idl.Method.build(method.name, 31, method.params)  # a method no skel has
    monkeypatch.setattr(portal_qnn, "_GRAPH_NAME", unknown)
    model = load(portal, tmp_path, onnx_models.two_graphs(), shapes={"token": (1, 4)})
    assert [g.name for g in model.graphs] == ["", ""]


def test_outputs_with_rooms_report_their_shapes_in_the_runs_invoke(
    portal: PortalQnn, session: FastRpcSession, tmp_path: Path
) -> None:
    """A graph with a room runs with run_dims: its shapes come in the run's own invoke;
    one without runs with run, which reports none."""
    tts = load(
        portal, tmp_path, onnx_models.duration_tts(), shapes={"input": (1, 3), "output": (1, 1, 8)}
    )
    (graph,) = tts.graphs
    assert graph.rooms == frozenset({"output"})
    buffer = session.alloc(4096)
    with buffer.view() as view:
        view[0:24] = np.array([[2, 3, 1]], np.int64).tobytes()
        view[64:72] = np.array([3], np.int64).tobytes()
        view[128:140] = np.array([1, 1, 1], np.float32).tobytes()
    inputs, outputs = Slice(buffer, 0, graph.input_arena), Slice(buffer, 1024, graph.output_arena)
    invokes = session.statistics().invokes_done
    assert portal.run_arena(tts.slot, inputs, outputs) == ((1, 1, 6),)
    assert session.statistics().invokes_done == invokes + 1
    with buffer.view() as view:
        produced = np.frombuffer(bytes(view[1024:1056]), np.float32)
    np.testing.assert_array_equal(produced, [0, 1, 2, 3, 4, 5, 0, 0])  # then zeros
    with buffer.view() as view:
        view[0:24] = np.array([[5, 5, 5]], np.int64).tobytes()
    with pytest.raises(ModelError) as grown:
        portal.run_arena(tts.slot, inputs, outputs)
    assert failure(grown) is ModelFailure.OUTPUT_TOO_LARGE
    assert grown.value.detail.startswith(
        "graph 0: output 'output' needs float32 [1, 1, 15] (60 bytes); its room is float32"
        " [1, 1, 8] (32 bytes)"
    )
    affine = load(portal, tmp_path, onnx_models.affine())
    assert affine.graphs[0].rooms == frozenset()
    invokes = session.statistics().invokes_done
    assert portal.run_arena(affine.slot, Slice(buffer, 0, 192), Slice(buffer, 1024, 128)) is None
    assert session.statistics().invokes_done == invokes + 1
    session.free(buffer)


def test_an_output_the_model_bounds_gets_its_bound_as_its_room(
    portal: PortalQnn, session: FastRpcSession, tmp_path: Path
) -> None:
    """Durations the model clips to 8 samples: 3 phonemes make at most 24 samples of
    audio, the room the load gives it without a shape; each run reports its length. A
    shape given still decides the room."""
    tts = load(portal, tmp_path, onnx_models.clipped_tts(), shapes={"durations": (1, 3)})
    (graph,) = tts.graphs
    assert graph.output("audio").shape == (1, 1, 24)
    assert "audio" in graph.rooms
    buffer = session.alloc(4096)
    inputs, outputs = Slice(buffer, 0, graph.input_arena), Slice(buffer, 1024, graph.output_arena)
    for durations, length in (([2, 3, 1], 6), ([50, 50, 50], 24)):
        with buffer.view() as view:
            view[0:24] = np.array([durations], np.int64).tobytes()
        assert portal.run_arena(tts.slot, inputs, outputs) == ((1, 1, length),)
    with buffer.view() as view:
        produced = np.frombuffer(bytes(view[1024 : 1024 + 96]), np.float32)
    np.testing.assert_array_equal(produced, np.arange(24))
    session.free(buffer)
    given = load(
        portal,
        tmp_path,
        onnx_models.clipped_tts(),
        shapes={"durations": (1, 3), "audio": (1, 1, 10)},
    )
    assert given.graphs[0].output("audio").shape == (1, 1, 10)


def test_an_output_with_no_bound_and_no_room_is_refused_saying_how_to_give_one(
    portal: PortalQnn, tmp_path: Path
) -> None:
    with pytest.raises(ModelError) as refused:
        load(portal, tmp_path, onnx_models.clipped_tts(limit=None), shapes={"durations": (1, 3)})
    assert failure(refused) is ModelFailure.MODEL_REJECTED
    assert (
        "output 'audio' dimension 2 ('time') does not follow from the input shapes given"
        in refused.value.detail
    )
    assert "shapes={'audio': [1, 1, N]} (npuctl run --shape audio=1,1,N)" in refused.value.detail
    assert "give the largest: a room" in refused.value.detail


def test_a_skel_without_run_dims_runs_then_asks_output_dims(
    portal: PortalQnn, session: FastRpcSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A skel older than method 12 answers it AEE_EUNSUPPORTED, having run nothing: the
    run goes as run, then output_dims (two invokes), and later runs skip run_dims."""
    tts = load(
        portal, tmp_path, onnx_models.duration_tts(), shapes={"input": (1, 3), "output": (1, 1, 8)}
    )
    (graph,) = tts.graphs
    method = idl.load("portal_qnn").method("run_dims")
    monkeypatch.setattr(portal_qnn, "_RUN_DIMS", idl.Method.build(method.name, 31, method.params))
    buffer = session.alloc(4096)
    with buffer.view() as view:
        view[0:24] = np.array([[2, 3, 1]], np.int64).tobytes()
        view[64:72] = np.array([3], np.int64).tobytes()
        view[128:140] = np.array([1, 1, 1], np.float32).tobytes()
    inputs, outputs = Slice(buffer, 0, graph.input_arena), Slice(buffer, 1024, graph.output_arena)
    invokes = session.statistics().invokes_done
    assert portal.run_arena(tts.slot, inputs, outputs) == ((1, 1, 6),)
    assert session.statistics().invokes_done == invokes + 3  # run_dims refused, run, dims
    with buffer.view() as view:
        view[0:24] = np.array([[1, 1, 1]], np.int64).tobytes()
    assert portal.run_arena(tts.slot, inputs, outputs) == ((1, 1, 3),)
    assert session.statistics().invokes_done == invokes + 5
    with buffer.view() as view:
        produced = np.frombuffer(bytes(view[1024:1056]), np.float32)
    np.testing.assert_array_equal(produced, [0, 1, 2, 0, 0, 0, 0, 0])
    session.free(buffer)


def test_a_skel_without_output_dims_leaves_the_shapes_as_described(
    portal: PortalQnn, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tts = load(
        portal, tmp_path, onnx_models.duration_tts(), shapes={"input": (1, 3), "output": (1, 1, 8)}
    )
    real = portal._call

    def older(method: str | idl.Method, /, **arguments: object) -> tuple[int, idl.Values]:
        if method == "output_dims":
            return AEE.EUNSUPPORTED.dsp, idl.Values({})
        return real(method, **arguments)

    monkeypatch.setattr(portal, "_call", older)
    assert portal._output_dims(tts.slot, tts.graphs[0]) is None


def test_sizes_make_a_graph_each_and_are_checked(portal: PortalQnn, tmp_path: Path) -> None:
    decoder = onnx_models.growing_decoder()
    model = load(portal, tmp_path, decoder, sizes={"preds": [(1, 1), (1, 3)]})
    assert [(g.name, g.inputs[0].shape) for g in model.graphs] == [
        ("preds=1x1", (1, 1)),
        ("preds=1x3", (1, 3)),
    ]
    for sizes, why in (
        ({"preds": [(1, 1)] * 2}, "repeat a shape"),
        ({"preds": [(1, n) for n in range(1, 10)]}, "1..8 shapes per tensor"),
        ({"preds": [(1, 1)], "x": [(1,), (2,)]}, "as many for every tensor"),
        ({"preds": [(1, 1, 1)]}, "input 'preds' has 2 dimensions"),
    ):
        with pytest.raises(ModelError, match=why) as refused:
            load(portal, tmp_path, decoder, sizes=sizes)
        assert failure(refused) is ModelFailure.TENSOR_MISMATCH
    with pytest.raises(ModelError, match="both a shape and sizes"):
        load(portal, tmp_path, decoder, shapes={"preds": (1, 1)}, sizes={"preds": [(1, 2)]})
    with pytest.raises(ModelError, match="the DSP says: sizes apply to a plain ONNX model"):
        load(portal, tmp_path, onnx_models.two_graphs(), sizes={"token": [(1, 4), (2, 4)]})
    assert model_uri_query({}, sizes={"a b": [(1, 2), (1, 4)]}) == "?sizes.a%20b=1,2;1,4"
