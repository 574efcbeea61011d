"""The emulator's portal_qnn skel at the wire: the AEE codes skel/portal_qnn_imp.c gives for the same calls.

Calls are marshalled by npud.idl and sent with FastRpcSession.invoke
(inline buffers), below the typed API, so the host-side checks of
npud.fastrpc.stubs.portal_qnn do not hide the skel's own.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Final

import numpy as np
import pytest

from npu_protocol import AEE
from npud import idl
from npud.fastrpc.kernel.invoke_args import Capacity, Inline
from npud.fastrpc.session import FastRpcSession
from npud.fastrpc.stubs.portal_qnn import PORTAL_QNN_URI
from npud.formats.onnx_values import Constant
from npud.ops.backend import DEV_SHELL
from npud.sim import DSP_LIBRARY_DIR, EmulatedDriver
from npud.sim.portal_qnn import (
    MAX_ERROR_BYTES,
    QNN_COMMON_ERROR_GENERAL,
    ModelQuery,
    compose_sizes,
    failure_text,
    parse_model_uri,
)
from tests.emulator import onnx_models

PORTAL: Final = idl.load("portal_qnn")
UNTOUCHED: Final = 0  # plain outputs the skel did not write come back as zeros


class Raw:
    """One portal_qnn handle driven with idl-encoded inline calls."""

    def __init__(self, session: FastRpcSession) -> None:
        self.session = session
        self.handle = session.remote_open(PORTAL_QNN_URI)

    def call(self, name: str, /, **arguments: object) -> tuple[int, idl.Values]:
        method = PORTAL.method(name)
        encoded = method.encode(**arguments)
        inputs = [Inline(x) for x in encoded.inputs if isinstance(x, bytes)]
        outputs = [Capacity(x) for x in encoded.outputs if isinstance(x, int)]
        result = self.session.invoke(self.handle, encoded.sc, inputs, outputs)
        values = method.decode(result.outputs) if result.rc == 0 else idl.Values({})
        return result.rc, values

    def load(self, name: str) -> tuple[int, idl.Values]:
        return self.call("model_load", model_uri=name)


@pytest.fixture
def session() -> Iterator[FastRpcSession]:
    session = FastRpcSession.open(EmulatedDriver(), library_path=[DSP_LIBRARY_DIR])
    session.load_shell(DEV_SHELL.read_bytes())
    yield session
    session.close()


@pytest.fixture
def raw(session: FastRpcSession) -> Raw:
    return Raw(session)


@pytest.fixture
def affine(session: FastRpcSession, tmp_path: Path) -> Iterator[str]:
    """An exposed ONNX model: the name model_load takes."""
    with (
        onnx_models.opened(tmp_path, "affine.onnx", onnx_models.affine()) as fd,
        session.expose_file(fd, suffix=".onnx") as exposed,
    ):
        yield exposed.name


def test_the_skel_opens_through_remotectl(session: FastRpcSession) -> None:
    handle = session.remote_open(PORTAL_QNN_URI)  # AEE_ENOSUCHMOD before this skel existed
    session.remote_close(handle)


def test_load_and_every_index_check(raw: Raw, affine: str) -> None:
    rc, loaded = raw.load(affine)
    assert (rc, dict(loaded)) == (0, {"model_index": 0, "num_graphs": 1, "qnn_status": 0})
    for index in (4, 0xFFFFFFFF):
        assert raw.call("execute", model_index=index, graph_index=0)[0] == AEE.EBADPARM.dsp
        assert raw.call("model_unload", model_index=index)[0] == AEE.EBADPARM.dsp
    assert raw.call("execute", model_index=1, graph_index=0)[0] == AEE.EBADSTATE.dsp
    assert raw.call("execute", model_index=0, graph_index=1)[0] == AEE.EBADPARM.dsp
    set_input = {"model_index": 0, "graph_index": 0}
    assert raw.call("set_input", **set_input, tensor_index=3, data=bytes(12))[0] == AEE.EBADPARM.dsp
    assert raw.call("set_input", **set_input, tensor_index=0, data=bytes(8))[0] == AEE.EBADSIZE.dsp
    assert raw.call("execute", **set_input)[0] == AEE.ENOTINITIALIZED.dsp
    output = {"model_index": 0, "graph_index": 0, "tensor_index": 0}
    assert raw.call("get_output", **output, data=12)[0] == AEE.ENOTINITIALIZED.dsp
    for tensor, data in ((0, bytes(12)), (1, bytes(12)), (2, struct.pack("<q", 1))):
        assert raw.call("set_input", **set_input, tensor_index=tensor, data=data)[0] == 0
    rc, executed = raw.call("execute", **set_input)
    assert (rc, executed.integer("qnn_status")) == (0, 0)
    assert raw.call("get_output", **output, data=11)[0] == AEE.EBUFFERTOOSMALL.dsp
    get_n = {**output, "tensor_index": 1}
    rc, n = raw.call("get_output", **get_n, data=8)
    assert (rc, n.integer("data_len"), n.data("data")) == (0, 8, struct.pack("<q", 2))
    assert raw.call("get_output", **{**output, "tensor_index": 2}, data=8)[0] == AEE.EBADPARM.dsp
    info = {"model_index": 0, "graph_index": 0}
    assert raw.call("graph_info", **info, inputs=2, outputs=2)[0] == AEE.EBUFFERTOOSMALL.dsp
    rc, described = raw.call("graph_info", **info, inputs=3, outputs=2)
    assert rc == 0
    assert [r.text("name") for r in described.records("inputs")] == ["a", "b", "k"]
    assert raw.call("model_unload", model_index=0)[0] == 0
    assert raw.call("model_unload", model_index=0)[0] == AEE.EBADSTATE.dsp


@pytest.fixture
def reshape(session: FastRpcSession, tmp_path: Path) -> Iterator[str]:
    with (
        onnx_models.opened(tmp_path, "reshape.onnx", onnx_models.reshape()) as fd,
        session.expose_file(fd, suffix=".onnx") as exposed,
    ):
        yield exposed.name


def test_last_error_is_onnxruntimes_reason_for_that_model_alone(raw: Raw, reshape: str) -> None:
    assert raw.load(reshape)[0] == 0
    assert raw.load(reshape)[0] == 0
    first, second = {"model_index": 0, "graph_index": 0}, {"model_index": 1, "graph_index": 0}
    assert raw.call("last_error", model_index=0, text=256)[1].integer("text_len") == 0
    x = struct.pack("<6f", *range(6))
    for arguments in (first, second):
        assert raw.call("set_input", **arguments, tensor_index=0, data=x)[0] == 0
    assert raw.call("set_input", **first, tensor_index=1, data=struct.pack("<2q", 4, 2))[0] == 0
    rc, executed = raw.call("execute", **first)
    assert (rc, executed.integer("qnn_status")) == (0, 1100)  # onnxruntime FAIL: GENERAL
    rc, error = raw.call("last_error", model_index=0, text=256)
    text = error.data("text")[: error.integer("text_len")].decode()
    assert rc == 0
    # onnxruntime's prefix, its chain and the failed check's source line are gone:
    assert text.startswith("Reshape node: The input tensor cannot be reshaped to the requested")
    assert error.data("text")[len(text) :] == bytes(256 - len(text))
    rc, cut = raw.call("last_error", model_index=0, text=10)
    assert (rc, cut.integer("text_len"), cut.data("text")) == (0, 10, text.encode()[:10])
    assert raw.call("last_error", model_index=1, text=256)[1].integer("text_len") == 0
    assert raw.call("set_input", **first, tensor_index=1, data=struct.pack("<2q", 3, 2))[0] == 0
    assert raw.call("execute", **first)[1].integer("qnn_status") == 0
    assert raw.call("last_error", model_index=0, text=256)[1].integer("text_len") == 0
    assert raw.call("last_error", model_index=2, text=256)[0] == AEE.EBADSTATE.dsp
    assert raw.call("last_error", model_index=4, text=256)[0] == AEE.EBADPARM.dsp


def test_last_error_of_no_model_is_why_the_handles_last_load_failed(
    raw: Raw, reshape: str, session: FastRpcSession, tmp_path: Path
) -> None:
    def load_error() -> bytes:
        rc, error = raw.call("last_error", model_index=0xFFFFFFFF, text=256)
        assert rc == 0
        return error.data("text")[: error.integer("text_len")]

    assert load_error() == b""
    with (
        onnx_models.opened(tmp_path, "free.onnx", onnx_models.reshape((None, 3))) as fd,
        session.expose_file(fd, suffix=".onnx") as exposed,
    ):
        assert raw.load(exposed.name)[0] == AEE.EINVALIDFORMAT.dsp
    assert load_error() == (
        b"y dimension 0 is free (not from the inputs' shapes): give its shape, N,3"
    )
    assert raw.load(reshape)[0] == 0
    assert load_error() == b""  # a load that succeeds forgets it
    with (
        onnx_models.opened(tmp_path, "unknown.onnx", onnx_models.unknown_op()) as fd,
        session.expose_file(fd, suffix=".onnx") as exposed,
    ):
        rc, loaded = raw.load(exposed.name)
    assert (rc, loaded.integer("qnn_status")) == (0, 6000)
    said = load_error()
    assert said.startswith(b"onnxruntime refused the model: ")
    assert b"[ONNXRuntimeError]" not in said
    assert b"NoSuchOp" in said or b"not a registered function/op" in said.lower()


@pytest.mark.parametrize(
    ("message", "expected"),
    [
        (
            "[ONNXRuntimeError] : 2 : INVALID_ARGUMENT : Non-zero status code returned while"
            " running If node. Name:'If_0' Status Message: Non-zero status code returned while"
            " running LSTM node. Name:'dec/LSTM' Status Message: Input X must have 3\ndimensions",
            "LSTM node 'dec/LSTM': Input X must have 3 dimensions",
        ),
        ("[ONNXRuntimeError] : 1 : FAIL : plain", "plain"),
        (
            "/ort/reshape_helper.h:91 ns::Helper(const ns::Shape&, bool) a == b was false. Why",
            "Why",
        ),
        ("é" * 200, "é" * 127),  # 255 bytes cut inside a character: 254 kept
        ("x" * 1000, "x" * 255),
    ],
    ids=["chain", "plain", "check", "utf-8", "long"],
)
def test_failure_text_is_the_innermost_reason_and_bounded(message: str, expected: str) -> None:
    assert failure_text(RuntimeError(message)).decode() == expected
    assert len(failure_text(RuntimeError(message))) <= MAX_ERROR_BYTES - 1


def test_load_failures(raw: Raw, affine: str, session: FastRpcSession) -> None:
    assert raw.load("x" * 512)[0] == AEE.EBADPARM.dsp  # 513 bytes with the NUL
    assert raw.load("x" * 511)[0] == AEE.EUNABLETOLOAD.dsp  # the longest, as on the C skel
    assert raw.load("builtin:vad")[0] == AEE.ERESOURCENOTFOUND.dsp
    assert raw.load("nothere.onnx")[0] == AEE.EUNABLETOLOAD.dsp
    assert raw.load("npud-fd-" + "0" * 32 + ".onnx")[0] == AEE.EUNABLETOLOAD.dsp  # not lent
    assert raw.load(f"{affine}?size=1")[0] == AEE.EBADPARM.dsp
    assert raw.load(f"{affine}?shape.zz=1")[0] == AEE.EBADPARM.dsp
    assert raw.load(f"{affine}?shape.a=4")[0] == AEE.EBADPARM.dsp  # the model says 3
    assert all(raw.load(affine)[0] == 0 for _ in range(4))
    assert raw.load(affine)[0] == AEE.EOUTOFHANDLES.dsp
    assert session.statistics().remote_handles == 1


@pytest.mark.parametrize(
    ("uri", "expected"),
    [
        ("m.onnx", ("m.onnx", {})),
        ("m.onnx?shape.x=1,576&shape.a%26b=2", ("m.onnx", {"x": (1, 576), "a&b": (2,)})),
        ("m.onnx?shape.s=", ("m.onnx", {"s": ()})),
    ],
)
def test_model_uri_shapes(uri: str, expected: tuple[str, dict[str, tuple[int, ...]]]) -> None:
    name, asked = parse_model_uri(uri)
    assert (name, asked.shapes) == expected


def test_model_uri_values_and_sizes() -> None:
    name, asked = parse_model_uri("m.onnx?value.sr=int64::16000&sizes.ids=1,1;1,2;1,4")
    assert name == "m.onnx"
    assert asked.constants == {"sr": Constant("int64", (), (16000,))}
    assert asked.sizes == {"ids": ((1, 1), (1, 2), (1, 4))}


@pytest.mark.parametrize(
    "uri",
    [
        "?shape.x=1",
        "m?shape.x=0",
        "m?shape.x=a",
        "m?x=1",
        "m?shape.=1",
        "m?shape.x=1&shape.x=2",
        "m?value.sr=int64:16000",
        "m?value.sr=complex64::1",
        "m?value.sr=int64:2:1",
        "m?sizes.x=1;2&sizes.y=1",
        "m?sizes.x=1&shape.x=1",
        "m?sizes.x=" + ";".join(str(n) for n in range(1, 10)),
    ],
)
def test_malformed_model_uris(uri: str) -> None:
    with pytest.raises(ValueError):  # noqa: PT011 - each case has its own wording
        parse_model_uri(uri)


def test_badly_marshalled_and_unknown_methods(raw: Raw) -> None:
    execute = PORTAL.method("execute")
    wrong_counts = raw.session.invoke(raw.handle, execute.sc & ~0xFF00, [Inline(bytes(8))], [])
    assert wrong_counts.rc == AEE.EBADPARM.dsp
    short = raw.session.invoke(raw.handle, execute.sc, [Inline(bytes(4))], [Capacity(4)])
    assert short.rc == AEE.EBADPARM.dsp
    unknown = idl.make_scalars(31, 1, 0, 0, 0)  # a method no skel has
    assert raw.session.invoke(raw.handle, unknown, [Inline(bytes(4))], []).rc == (
        AEE.EUNSUPPORTED.dsp
    )


def test_a_graph_pack_loads_every_graph_with_its_name(
    raw: Raw, session: FastRpcSession, tmp_path: Path
) -> None:
    with (
        onnx_models.opened(tmp_path, "pack.onnx", onnx_models.two_graphs()) as fd,
        session.expose_file(fd, suffix=".onnx") as exposed,
    ):
        rc, loaded = raw.load(exposed.name + "?shape.token=1,4")
    assert (rc, loaded.integer("num_graphs")) == (0, 2)
    index = loaded.integer("model_index")
    for graph, name in enumerate((b"prefill", b"decode")):
        rc, named = raw.call("graph_name", model_index=index, graph_index=graph, name=128)
        assert (rc, named.data("name")[: named.integer("name_len")]) == (0, name)
    rc, cut = raw.call("graph_name", model_index=index, graph_index=0, name=3)
    assert (rc, cut.integer("name_len"), cut.data("name")) == (0, 3, b"pre")
    named_beyond = raw.call("graph_name", model_index=index, graph_index=2, name=128)
    assert named_beyond[0] == AEE.EBADPARM.dsp
    assert raw.call("graph_name", model_index=4, graph_index=0, name=128)[0] == AEE.EBADPARM.dsp
    assert raw.call("graph_name", model_index=1, graph_index=0, name=128)[0] == AEE.EBADSTATE.dsp
    rc, described = raw.call("graph_info", model_index=index, graph_index=1, inputs=1, outputs=1)
    assert [r.text("name") for r in described.records("inputs")] == ["token"]
    # The model's last_error is its last run's, whichever graph ran.
    assert raw.call("execute", model_index=index, graph_index=1)[0] == AEE.ENOTINITIALIZED.dsp
    token = {"model_index": index, "graph_index": 1, "tensor_index": 0}
    assert raw.call("set_input", **token, data=bytes(16))[0] == 0
    assert raw.call("execute", model_index=index, graph_index=1) == (
        0,
        idl.Values({"qnn_status": 0}),
    )


def test_a_pack_of_more_graphs_than_a_model_holds_is_refused(
    raw: Raw, session: FastRpcSession, tmp_path: Path
) -> None:
    with (
        onnx_models.opened(tmp_path, "nine.onnx", onnx_models.many_graphs(9)) as fd,
        session.expose_file(fd, suffix=".onnx") as exposed,
    ):
        assert raw.load(exposed.name)[0] == AEE.EINVALIDFORMAT.dsp
    rc, why = raw.call("last_error", model_index=0xFFFFFFFF, text=256)
    assert rc == 0
    assert why.data("text")[: why.integer("text_len")] == (
        b"a graph pack that holds 9 graphs; a model has at most 8"
    )


def test_run_dims_runs_and_reports_the_shapes_in_one_call(
    raw: Raw, session: FastRpcSession, tmp_path: Path
) -> None:
    """run_dims is run with output_dims' answer: checks before the graph runs, the
    produced shape of an output with a room, none after a QNN failure."""
    with (
        onnx_models.opened(tmp_path, "tts.onnx", onnx_models.duration_tts()) as fd,
        session.expose_file(fd, suffix=".onnx") as exposed,
    ):
        uri = exposed.name + "?shape.input=1,3&shape.output=1,1,8"
        assert raw.load(uri)[0] == 0
    graph = {"model_index": 0, "graph_index": 0}
    arena = bytearray(192)  # input [1, 3] i64 @0, input_lengths [1] i64 @64, scales @128
    arena[0:24] = struct.pack("<3q", 2, 3, 1)
    arena[64:72] = struct.pack("<q", 3)
    arena[128:140] = struct.pack("<3f", 0.5, 1, 1)
    run = {**graph, "inputs": bytes(arena), "outputs": 64}
    assert raw.call("run_dims", **run, dims=8)[0] == AEE.EBUFFERTOOSMALL.dsp
    assert raw.call("output_dims", **graph, dims=9)[0] == AEE.ENOTINITIALIZED.dsp  # nothing ran
    assert raw.call("run_dims", **{**run, "outputs": 16}, dims=9)[0] == AEE.EBUFFERTOOSMALL.dsp
    assert raw.call("run_dims", **{**run, "inputs": bytes(8)}, dims=9)[0] == AEE.EBADSIZE.dsp
    rc, values = raw.call("run_dims", **run, dims=18)
    assert (rc, values.integer("qnn_status"), values.integer("num_outputs")) == (0, 0, 1)
    assert values.integers("dims") == [3, 1, 1, 6, *[0] * 5, *[0] * 9]
    produced = struct.unpack("<8f", values.data("outputs")[:32])
    assert produced == (0, 0.5, 1, 1.5, 2, 2.5, 0, 0)
    assert raw.call("output_dims", **graph, dims=9)[1].integers("dims")[:4] == [3, 1, 1, 6]
    arena[0:24] = struct.pack("<3q", 5, 5, 5)  # 15 samples: past the room of 8
    assert raw.call("run_dims", **{**run, "inputs": bytes(arena)}, dims=9)[0] == (
        AEE.EINVALIDFORMAT.dsp
    )
    assert raw.call("run_dims", model_index=1, graph_index=0, inputs=b"", outputs=64, dims=9)[
        0
    ] == (AEE.EBADSTATE.dsp)
    with (
        onnx_models.opened(tmp_path, "reshape.onnx", onnx_models.reshape()) as fd,
        session.expose_file(fd, suffix=".onnx") as exposed,
    ):
        assert raw.load(exposed.name)[0] == 0  # slot 1: y = reshape(x [6], s)
    bad_shape = bytes(64) + struct.pack("<2q", 4, 4) + bytes(48)  # 16 elements of 6: fails
    rc, values = raw.call(
        "run_dims", model_index=1, graph_index=0, inputs=bad_shape, outputs=64, dims=9
    )
    assert rc == 0
    assert values.integer("qnn_status") == QNN_COMMON_ERROR_GENERAL
    assert (values.integer("num_outputs"), values.integers("dims")) == (0, [0] * 9)


def test_output_dims_are_what_the_last_run_produced(raw: Raw, affine: str) -> None:
    assert raw.load(affine)[0] == 0
    graph = {"model_index": 0, "graph_index": 0}
    assert raw.call("output_dims", **graph, dims=18)[0] == AEE.ENOTINITIALIZED.dsp
    for tensor, data in ((0, bytes(12)), (1, bytes(12)), (2, struct.pack("<q", 1))):
        assert raw.call("set_input", **graph, tensor_index=tensor, data=data)[0] == 0
    assert raw.call("execute", **graph)[1].integer("qnn_status") == 0
    assert raw.call("output_dims", **graph, dims=17)[0] == AEE.EBUFFERTOOSMALL.dsp
    rc, dims = raw.call("output_dims", **graph, dims=18)
    assert (rc, dims.integer("num_outputs")) == (0, 2)
    # y float32 [3], then n int64 as onnxruntime made it ([1]): rank, then 8 dimensions.
    assert dims.integers("dims") == [1, 3, *[0] * 7, 1, 1, *[0] * 7]
    assert raw.call("output_dims", model_index=1, graph_index=0, dims=18)[0] == AEE.EBADSTATE.dsp
    assert raw.call("output_dims", model_index=0, graph_index=1, dims=18)[0] == AEE.EBADPARM.dsp


def test_sizes_share_one_session_when_no_size_needs_its_own() -> None:
    """A decoder's sizes run on one session of the model (its weights held once, as a QNN
    context's graphs share theirs); a model whose outputs each size infers keeps a
    session per size, each on its own input shapes. Each graph still runs at its size."""
    sizes: dict[str, tuple[tuple[int, ...], ...]] = {"preds": ((1, 1), (1, 3))}
    decoder = compose_sizes(onnx_models.growing_decoder(), ModelQuery(sizes=sizes), 1)
    first, second = decoder.graphs
    assert first._session is second._session
    for graph, n in ((first, 1), (second, 3)):
        inputs = bytearray(graph.input_arena)
        inputs[: 8 * n] = np.arange(n, dtype=np.int64).tobytes()
        outputs = bytearray(graph.output_arena)
        assert graph.run(memoryview(inputs), memoryview(outputs)) == (0, 0)
        assert graph.output_dims() == [(1, n, onnx_models.DECODER_VOCAB)]
    inferred = onnx_models.add_one((None, 4), out_shape=(None, None))
    each = compose_sizes(inferred, ModelQuery(sizes={"x": ((1, 4), (2, 4))}), 1)
    assert each.graphs[0]._session is not each.graphs[1]._session
    assert [g.outputs[0].shape for g in each.graphs] == [(1, 4), (2, 4)]
