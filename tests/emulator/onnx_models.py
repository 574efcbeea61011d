"""Small ONNX models the tests build with onnx's helper API (nothing is downloaded)."""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Final

import onnx
from onnx import TensorProto, helper

from npud.formats import graph_pack

OPSET: Final = 17
IR_VERSION: Final = 8  # what onnxruntime releases from 1.14 on accept

Dim = int | str | None

ELEMENT_TYPES: Final = {
    "float32": TensorProto.FLOAT,
    "float16": TensorProto.FLOAT16,
    "int8": TensorProto.INT8,
    "uint8": TensorProto.UINT8,
    "int16": TensorProto.INT16,
    "uint16": TensorProto.UINT16,
    "int32": TensorProto.INT32,
    "uint32": TensorProto.UINT32,
    "int64": TensorProto.INT64,
    "uint64": TensorProto.UINT64,
    "bool": TensorProto.BOOL,
    "float64": TensorProto.DOUBLE,
}


def tensor(name: str, dtype: str, shape: Sequence[Dim]) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, ELEMENT_TYPES[dtype], list(shape))


def model(
    nodes: Sequence[onnx.NodeProto],
    inputs: Sequence[onnx.ValueInfoProto],
    outputs: Sequence[onnx.ValueInfoProto],
    initializers: Sequence[onnx.TensorProto] = (),
) -> bytes:
    graph = helper.make_graph(list(nodes), "test", list(inputs), list(outputs), list(initializers))
    proto = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="npud-tests"
    )
    proto.ir_version = IR_VERSION
    return bytes(proto.SerializeToString())


def add_one(shape: Sequence[Dim] = (2, 4), *, out_shape: Sequence[Dim] | None = None) -> bytes:
    """y = x + 1, float32."""
    one = helper.make_tensor("one", TensorProto.FLOAT, [], [1.0])
    return model(
        [helper.make_node("Add", ["x", "one"], ["y"])],
        [tensor("x", "float32", shape)],
        [tensor("y", "float32", shape if out_shape is None else out_shape)],
        [one],
    )


def affine() -> bytes:
    """Two inputs of different types and two outputs: y = a * 2 + b (f32), n = k + 1 (i64)."""
    two = helper.make_tensor("two", TensorProto.FLOAT, [], [2.0])
    one = helper.make_tensor("one", TensorProto.INT64, [], [1])
    return model(
        [
            helper.make_node("Mul", ["a", "two"], ["a2"]),
            helper.make_node("Add", ["a2", "b"], ["y"]),
            helper.make_node("Add", ["k", "one"], ["n"]),
        ],
        [tensor("a", "float32", [3]), tensor("b", "float32", [3]), tensor("k", "int64", [])],
        [tensor("y", "float32", [3]), tensor("n", "int64", [])],
        [two, one],
    )


def endless_loop() -> bytes:
    """y = x + 2**62 by a Loop of 2**62 iterations adding 1 (float32 [1]): it never ends."""
    trips = helper.make_tensor("trips", TensorProto.INT64, [], [2**62])
    keep_going = helper.make_tensor("keep_going", TensorProto.BOOL, [], [True])
    body = helper.make_graph(
        [
            helper.make_node("Identity", ["cond"], ["cond_out"]),
            helper.make_node("Add", ["v", "one_inner"], ["v_out"]),
        ],
        "body",
        [
            helper.make_tensor_value_info("i", TensorProto.INT64, []),
            helper.make_tensor_value_info("cond", TensorProto.BOOL, []),
            tensor("v", "float32", [1]),
        ],
        [
            helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
            tensor("v_out", "float32", [1]),
        ],
        [helper.make_tensor("one_inner", TensorProto.FLOAT, [], [1.0])],
    )
    return model(
        [helper.make_node("Loop", ["trips", "keep_going", "x"], ["y"], body=body)],
        [tensor("x", "float32", [1])],
        [tensor("y", "float32", [1])],
        [trips, keep_going],
    )


def large_add(elements: int = 65536) -> bytes:
    """y = x + w with a float32 initializer of ``elements``: a model file larger than one
    message between npud and a PD child (256 KiB by default)."""
    weights = helper.make_tensor("w", TensorProto.FLOAT, [elements], [0.5] * elements)
    return model(
        [helper.make_node("Add", ["x", "w"], ["y"])],
        [tensor("x", "float32", [elements])],
        [tensor("y", "float32", [elements])],
        [weights],
    )


def identity(dtype: str, shape: Sequence[Dim] = (5,), *, name: str = "x") -> bytes:
    return model(
        [helper.make_node("Identity", [name], ["y"])],
        [tensor(name, dtype, shape)],
        [tensor("y", dtype, shape)],
    )


def reshape(y_shape: Sequence[Dim] = (2, 3)) -> bytes:
    """y = reshape(x, s): fails at run time when s does not fit x's 6 elements. With
    y_shape free, y's shape does not follow from the inputs' shapes (s's values make it)."""
    return model(
        [helper.make_node("Reshape", ["x", "s"], ["y"])],
        [tensor("x", "float32", [6]), tensor("s", "int64", [2])],
        [tensor("y", "float32", y_shape)],
    )


def many_inputs(count: int) -> bytes:
    """``count`` inputs summed into one output."""
    names = [f"x{i}" for i in range(count)]
    return model(
        [helper.make_node("Sum", names, ["y"])],
        [tensor(name, "float32", [1]) for name in names],
        [tensor("y", "float32", [1])],
    )


def unknown_op() -> bytes:
    return model(
        [helper.make_node("NoSuchOperator", ["x"], ["y"])],
        [tensor("x", "float32", [1])],
        [tensor("y", "float32", [1])],
    )


SECRET_SHAPE: Final = (16,)


def external_tensor(name: str, location: str, *, length: int = 16) -> onnx.TensorProto:
    """A uint8 tensor whose bytes are ``length`` bytes of the file ``location`` names."""
    proto = TensorProto(name=name, data_type=TensorProto.UINT8, dims=[length])
    proto.data_location = TensorProto.EXTERNAL
    for key, value in (("location", location), ("offset", "0"), ("length", str(length))):
        entry = proto.external_data.add()
        entry.key, entry.value = key, value
    return proto


def external_initializer(location: str) -> bytes:
    """y = w, where the initializer w names the file ``location`` (relative to the
    working directory of whoever parses the model, for a model given as bytes)."""
    return model(
        [helper.make_node("Identity", ["w"], ["y"])],
        [],
        [tensor("y", "uint8", SECRET_SHAPE)],
        [external_tensor("w", location)],
    )


def external_data_everywhere(location: str) -> dict[str, bytes]:
    """A model per place a tensor can hide external data, by the place's name."""
    out = [tensor("y", "uint8", SECRET_SHAPE)]
    x = [tensor("x", "uint8", SECRET_SHAPE)]
    hidden = external_tensor("w", location)

    def constant() -> onnx.NodeProto:
        return helper.make_node("Constant", [], ["y"], value=hidden)

    def wrapped(graph_nodes: Sequence[onnx.NodeProto]) -> bytes:
        branch = helper.make_graph(list(graph_nodes), "branch", [], out)
        cond = helper.make_tensor("c", TensorProto.BOOL, [], [True])
        return model(
            [helper.make_node("If", ["c"], ["y"], then_branch=branch, else_branch=branch)],
            [],
            out,
            [cond],
        )

    sparse = helper.make_sparse_tensor(
        external_tensor("v", location, length=4),
        helper.make_tensor("i", TensorProto.INT64, [4], [0, 1, 2, 3]),
        [16],
    )
    function = helper.make_function(
        "local", "Leak", [], ["y"], [constant()], [helper.make_opsetid("", OPSET)]
    )
    with_function = onnx.load_from_string(
        model([helper.make_node("Leak", [], ["y"], domain="local")], [], out)
    )
    with_function.functions.append(function)
    with_function.opset_import.append(helper.make_opsetid("local", 1))
    training = onnx.load_from_string(model([helper.make_node("Identity", ["x"], ["y"])], x, out))
    info = training.training_info.add()
    info.initialization.CopyFrom(helper.make_graph([constant()], "init", [], out))
    sparse_model = onnx.load_from_string(
        model([helper.make_node("Identity", ["x"], ["y"])], x, out)
    )
    sparse_model.graph.sparse_initializer.append(sparse)
    return {
        "initializer": external_initializer(location),
        "constant": model([constant()], [], out),
        "subgraph": wrapped([constant()]),
        "nested subgraph": _nested(location),
        "sparse initializer": sparse_model.SerializeToString(),
        "function": with_function.SerializeToString(),
        "training info": training.SerializeToString(),
    }


def _nested(location: str) -> bytes:
    """The external tensor three If levels down."""
    inner: onnx.GraphProto = helper.make_graph(
        [helper.make_node("Constant", [], ["y0"], value=external_tensor("w", location))],
        "level0",
        [],
        [tensor("y0", "uint8", SECRET_SHAPE)],
    )
    for level in range(1, 4):
        name = "y" if level == 3 else f"y{level}"
        inner = helper.make_graph(
            [
                helper.make_node(
                    "Constant",
                    [],
                    [f"c{level}"],
                    value=helper.make_tensor(f"t{level}", TensorProto.BOOL, [], [True]),
                ),
                helper.make_node("If", [f"c{level}"], [name], then_branch=inner, else_branch=inner),
            ],
            f"level{level}",
            [],
            [tensor(name, "uint8", SECRET_SHAPE)],
        )
    return model(list(inner.node), [], [tensor("y", "uint8", SECRET_SHAPE)])


@contextmanager
def opened(directory: Path, name: str, data: bytes, flags: int = os.O_RDONLY) -> Iterator[int]:
    """Write ``data`` to ``directory/name`` and yield an fd for it (closed afterwards)."""
    path = directory / name
    path.write_bytes(data)
    fd = os.open(path, flags | os.O_CLOEXEC)
    try:
        yield fd
    finally:
        os.close(fd)


SHARED_WEIGHT: Final = [0.5, 1.0, 2.0, 4.0]
"""``w`` of :func:`two_graphs`, stored once in the pack and used by both graphs."""


def two_graphs() -> bytes:
    """A graph pack of "prefill" (logits = tokens + w, tokens float32 [4, 4]) and
    "decode" (logits = token * w, token float32 [1, 4]): both name the shared weight w
    (float32 [4]), which neither graph holds itself."""
    weight = helper.make_tensor("w", TensorProto.FLOAT, [4], SHARED_WEIGHT)
    prefill = model(
        [helper.make_node("Add", ["tokens", "w"], ["logits"])],
        [tensor("tokens", "float32", (4, 4))],
        [tensor("logits", "float32", (4, 4))],
    )
    decode = model(
        [helper.make_node("Mul", ["token", "w"], ["logits"])],
        [tensor("token", "float32", ("batch", 4))],
        [tensor("logits", "float32", ("batch", 4))],
    )
    return graph_pack.write_pack(
        [("prefill", prefill), ("decode", decode)], [weight.SerializeToString()]
    )


def many_graphs(count: int) -> bytes:
    """A graph pack of ``count`` copies of :func:`add_one`, named g0, g1, ..."""
    return graph_pack.write_pack([(f"g{i}", add_one()) for i in range(count)])


def ocr_classifier() -> bytes:
    """An OCR text-line classifier's tensors: x float32 [?, 3, 48, ?] (two dimensions an
    exporter could not name, each free on its own), y = the mean of each channel [?, 3]."""
    return model(
        [helper.make_node("ReduceMean", ["x"], ["y"], axes=[2, 3], keepdims=0)],
        [tensor("x", "float32", ["?", 3, 48, "?"])],
        [tensor("y", "float32", ["?", 3])],
    )


def duration_tts() -> bytes:
    """A Piper voice's tensors: ``input`` int64 [batch_size, phonemes] (each phoneme's
    duration in samples here), ``input_lengths`` int64 [batch_size], ``scales`` float32
    [3]; ``output`` float32 [batch_size, 1, time], time the sum of the durations: the
    data decides it. output[0, 0, t] = t * scales[0] (batch 1)."""
    zero = helper.make_tensor("zero", TensorProto.INT64, [], [0])
    one = helper.make_tensor("one", TensorProto.INT64, [], [1])
    first = helper.make_tensor("first", TensorProto.INT64, [1], [0])
    return model(
        [
            helper.make_node("ReduceSum", ["input"], ["total"], keepdims=0),
            helper.make_node("Range", ["zero", "total", "one"], ["steps"]),
            helper.make_node("Cast", ["steps"], ["ramp"], to=TensorProto.FLOAT),
            helper.make_node("Gather", ["scales", "first"], ["scale"]),
            helper.make_node("Mul", ["ramp", "scale"], ["scaled"]),
            helper.make_node("Shape", ["input_lengths"], ["batch"]),
            helper.make_node("Concat", ["batch", "one_d", "minus_one"], ["target"], axis=0),
            helper.make_node("Reshape", ["scaled", "target"], ["output"]),
        ],
        [
            tensor("input", "int64", ["batch_size", "phonemes"]),
            tensor("input_lengths", "int64", ["batch_size"]),
            tensor("scales", "float32", [3]),
        ],
        [tensor("output", "float32", ["batch_size", 1, "time"])],
        [
            zero,
            one,
            first,
            helper.make_tensor("one_d", TensorProto.INT64, [1], [1]),
            helper.make_tensor("minus_one", TensorProto.INT64, [1], [-1]),
        ],
    )


def rate_branch() -> bytes:
    """Silero VAD's pattern: y comes out of an If on the value of sr (int64 scalar).
    sr == 16000: y = x * 2, shaped as x float32 [n]; otherwise y = x reshaped through
    [-1, 3] (fails at run time unless n is a multiple of 3). The branches' shapes
    differ, so shape inference cannot size y ['?'] from x's shape alone."""
    rate = helper.make_tensor("rate", TensorProto.INT64, [], [16000])
    two = helper.make_tensor("two", TensorProto.FLOAT, [], [2.0])
    then_branch = helper.make_graph(
        [helper.make_node("Mul", ["x", "two"], ["doubled"])],
        "then",
        [],
        [tensor("doubled", "float32", ["n"])],
    )
    rows = helper.make_tensor("rows", TensorProto.INT64, [2], [-1, 3])
    flat = helper.make_tensor("flat", TensorProto.INT64, [1], [-1])
    else_branch = helper.make_graph(
        [
            helper.make_node("Constant", [], ["rows_shape"], value=rows),
            helper.make_node("Constant", [], ["flat_shape"], value=flat),
            helper.make_node("Reshape", ["x", "rows_shape"], ["in_rows"]),
            helper.make_node("Reshape", ["in_rows", "flat_shape"], ["flattened"]),
        ],
        "else",
        [],
        [tensor("flattened", "float32", [None])],
    )
    return model(
        [
            helper.make_node("Equal", ["sr", "rate"], ["is_16k"]),
            helper.make_node(
                "If", ["is_16k"], ["y"], then_branch=then_branch, else_branch=else_branch
            ),
        ],
        [tensor("x", "float32", ["n"]), tensor("sr", "int64", [])],
        [tensor("y", "float32", ["?"])],
        [rate, two],
    )


DECODER_VOCAB: Final = 5


def growing_decoder() -> bytes:
    """An autoregressive decoder's shape: preds int64 [1, n] (the tokens so far, n
    growing by one a step) -> logits float32 [1, n, 5]: each token's embedding (a 5x4
    table) times a 4x5 projection, both weights of the model."""
    embedding = helper.make_tensor(
        "embedding", TensorProto.FLOAT, [DECODER_VOCAB, 4], [float(i) for i in range(20)]
    )
    projection = helper.make_tensor(
        "projection",
        TensorProto.FLOAT,
        [4, DECODER_VOCAB],
        [1.0 if i % 6 == 0 else 0.0 for i in range(20)],
    )
    return model(
        [
            helper.make_node("Gather", ["embedding", "preds"], ["embedded"]),
            helper.make_node("MatMul", ["embedded", "projection"], ["logits"]),
        ],
        [tensor("preds", "int64", [1, "n"])],
        [tensor("logits", "float32", [1, "n", DECODER_VOCAB])],
        [embedding, projection],
    )


def _weights(name: str, shape: Sequence[int], seed: int) -> onnx.TensorProto:
    """Small deterministic weights (no numpy needed: a linear congruence in [-1, 1))."""
    count = 1
    for size in shape:
        count *= size
    values = [((seed * 7919 + i * 104729) % 2000) / 1000.0 - 1.0 for i in range(count)]
    return helper.make_tensor(name, TensorProto.FLOAT, list(shape), values)


def wake_word_models() -> dict[str, bytes]:
    """openWakeWord's three models per chunk, small: ``mel`` audio float32 [1, 1280] ->
    frames float32 [1, 5, 32] (an 80 ms chunk in 5 frames of 32 bands); ``embedding``
    input_1 float32 [1, 5, 32] -> features float32 [1, 96]; ``head`` x float32 [1, 96]
    -> score float32 [1, 1] in (0, 1). Each a product with weights and a
    non-linearity; their tensor names differ, so a chain must bind them."""
    mel = model(
        [
            helper.make_node("Reshape", ["audio", "frames_shape"], ["framed"]),
            helper.make_node("MatMul", ["framed", "bands"], ["power"]),
            helper.make_node("Abs", ["power"], ["frames"]),
        ],
        [tensor("audio", "float32", [1, 1280])],
        [tensor("frames", "float32", [1, 5, 32])],
        [
            helper.make_tensor("frames_shape", TensorProto.INT64, [3], [1, 5, 256]),
            _weights("bands", (256, 32), 1),
        ],
    )
    embedding = model(
        [
            helper.make_node("Reshape", ["input_1", "flat_shape"], ["flat"]),
            helper.make_node("MatMul", ["flat", "project"], ["projected"]),
            helper.make_node("Tanh", ["projected"], ["features"]),
        ],
        [tensor("input_1", "float32", [1, 5, 32])],
        [tensor("features", "float32", [1, 96])],
        [
            helper.make_tensor("flat_shape", TensorProto.INT64, [2], [1, 160]),
            _weights("project", (160, 96), 2),
        ],
    )
    head = model(
        [
            helper.make_node("MatMul", ["x", "weigh"], ["logit"]),
            helper.make_node("Sigmoid", ["logit"], ["score"]),
        ],
        [tensor("x", "float32", [1, 96])],
        [tensor("score", "float32", [1, 1])],
        [_weights("weigh", (96, 1), 3)],
    )
    return {"mel": mel, "embedding": embedding, "head": head}


def picky_reshape() -> bytes:
    """y = x reshaped to ``target`` (int64 [2], the caller's): x float32 [1, 96] -> y
    float32 [1, 96]; a target of another size fails the run inside onnxruntime."""
    return model(
        [helper.make_node("Reshape", ["x", "target"], ["y"])],
        [tensor("x", "float32", [1, 96]), tensor("target", "int64", [2])],
        [tensor("y", "float32", [1, 96])],
    )


CLIPPED_DURATION: Final = 8


def clipped_tts(*, limit: int | None = CLIPPED_DURATION, max_len: int | None = None) -> bytes:
    """A duration model whose durations the model clips (``durations`` int64 [1,
    phonemes] -> ``audio`` float32 [1, 1, time], time the sum of the clipped durations,
    audio[0, 0, t] = t): each phoneme lasts at most ``limit`` samples, and the audio at
    most ``max_len`` (a Min with a constant) when given, so the model bounds its own
    audio. Without either it is a duration model with no bound."""
    total = "total"
    nodes = []
    weights = [
        helper.make_tensor("zero", TensorProto.INT64, [], [0]),
        helper.make_tensor("one", TensorProto.INT64, [], [1]),
        helper.make_tensor("shape", TensorProto.INT64, [3], [1, 1, -1]),
    ]
    source = "durations"
    if limit is not None:
        nodes.append(helper.make_node("Clip", ["durations", "zero", "limit"], ["clipped"]))
        weights.append(helper.make_tensor("limit", TensorProto.INT64, [], [limit]))
        source = "clipped"
    nodes.append(helper.make_node("ReduceSum", [source], ["sum"], keepdims=0))
    if max_len is not None:
        nodes.append(helper.make_node("Constant", [], ["max_len"], value_int=max_len))
        nodes.append(helper.make_node("Min", ["sum", "max_len"], [total]))
    else:
        nodes.append(helper.make_node("Identity", ["sum"], [total]))
    nodes += [
        helper.make_node("Range", ["zero", total, "one"], ["steps"]),
        helper.make_node("Cast", ["steps"], ["ramp"], to=TensorProto.FLOAT),
        helper.make_node("Reshape", ["ramp", "shape"], ["audio"]),
    ]
    return model(
        nodes,
        [tensor("durations", "int64", [1, "phonemes"])],
        [tensor("audio", "float32", [1, 1, "time"])],
        weights,
    )


def nonzero() -> bytes:
    """``x`` float32 [4, 5] -> ``where`` int64 [2, n]: the indices of its non-zero
    elements, at most all 20 of them."""
    return model(
        [helper.make_node("NonZero", ["x"], ["where"])],
        [tensor("x", "float32", [4, 5])],
        [tensor("where", "int64", [2, "n"])],
    )
