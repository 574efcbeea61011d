"""llama.cpp's Hexagon backend on the emulated DSP: the htp_iface skel
(``libggml-htp-v73.so``) and its batch worker, driven as ggml-hexagon drives them
(npud/fastrpc/host/htp_host.py) over the dspqueue port (npud/fastrpc/host/dspqueue_cpu.py),
with results checked against plain references written from ggml's definitions
(tests/emulator/ggml_reference.py).
"""

from __future__ import annotations

import gc
import logging
import os
import select
import struct
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Final

import numpy as np
import numpy.typing as npt
import pytest

from npud.fastrpc.host.dspqueue_cpu import GUARD, CpuQueues
from npud.fastrpc.host.htp_host import (
    F16,
    F32,
    I32,
    I64,
    IQ4_NL,
    MXFP4,
    Q4_0,
    Q4_1,
    Q8_0,
    REPACK,
    SC_ETM,
    SC_MMAP,
    SC_PROFILER,
    STATUS_INVAL_PARAMS,
    STATUS_NO_SUPPORT,
    STATUS_OK,
    WEIGHT,
    Arena,
    HtpHost,
    OpSpec,
    T,
    f32_bits,
)
from npud.fastrpc.session import FastRpcSession
from npud.ops.backend import DEV_SHELL
from npud.sim import DSP_LIBRARY_DIR, EmulatedDriver, SimConfig
from tests.emulator import ggml_reference as ref

AEE_EBADPARM: Final = 0x8000040E
AEE_EBADSTATE: Final = 0x8000040D
AEE_EITEMBUSY: Final = 0x80000420
AEE_EFAILED: Final = 0x80000401
TILED: Final = WEIGHT | REPACK
rng = np.random.default_rng(2026)
F32A = npt.NDArray[np.float32]


@pytest.fixture(params=["process", "thread"])
def driver(request: pytest.FixtureRequest) -> Iterator[EmulatedDriver]:
    driver = EmulatedDriver(SimConfig(pd_isolation=request.param))
    yield driver
    driver.shutdown()
    assert driver.statistics().pd_children == 0


@pytest.fixture
def session(driver: EmulatedDriver) -> Iterator[FastRpcSession]:
    session = FastRpcSession.open(driver, library_path=(DSP_LIBRARY_DIR,))
    session.load_shell(DEV_SHELL.read_bytes())
    yield session
    session.end_process()
    session.close()


@pytest.fixture
def host(session: FastRpcSession) -> Iterator[HtpHost]:
    queues = CpuQueues(session)
    host = HtpHost(session, queues)
    assert host.start() == 0
    yield host
    if not queues.closed:
        if queues.error == 0:
            host.close()
            queues.close()
        else:
            queues.abandon()


@pytest.fixture
def arena(host: HtpHost) -> Arena:
    return Arena(host, 1 << 20)


def randn(*shape: int, scale: float = 1.0) -> F32A:
    return (rng.standard_normal(shape) * scale).astype(np.float32)


def close(actual: npt.ArrayLike, expected: npt.ArrayLike, tol: float = 1e-5) -> None:
    np.testing.assert_allclose(
        np.asarray(actual, np.float64), np.asarray(expected, np.float64), rtol=tol, atol=tol
    )


# -- the skel ------------------------------------------------------------------------------


def test_hwinfo_reports_a_v73_cdsp(session: FastRpcSession) -> None:
    host = HtpHost(session, CpuQueues(session))
    assert host.hwinfo() == (4, 4, 1, 8 * 1024 * 1024)
    host.close()
    host.queues.close()


def test_start_stop_and_what_needs_a_session(session: FastRpcSession) -> None:
    queues = CpuQueues(session)
    host = HtpHost(session, queues)
    assert host.stop() == AEE_EBADPARM  # not started
    assert host.munmap(5) == AEE_EBADPARM
    assert host.invoke(SC_PROFILER, struct.pack("<I8I", 1, *[0] * 8))[0] == AEE_EBADPARM
    assert host.start(host.queue.qid ^ 0x100) == AEE_EBADPARM  # no such queue
    assert host.start() == 0
    assert queues.is_imported(host.queue.qid) == 1
    assert host.start() == AEE_EITEMBUSY
    assert host.invoke(SC_ETM, struct.pack("<I", 1))[0] == 0
    assert host.invoke(SC_PROFILER, struct.pack("<I8I", 1, *[0] * 8))[0] == 0
    assert host.invoke(SC_MMAP, struct.pack("<I4xQ", host.opqueue.fd, 4096))[0] == 0
    stranger = session.alloc(4096)
    assert host.invoke(SC_MMAP, struct.pack("<I4xQ", stranger.fd, 4096))[0] == AEE_EFAILED
    assert host.munmap(host.opqueue.fd) == 0
    assert host.stop() == 0
    assert queues.is_imported(host.queue.qid) == 0  # the CPU may close the queue now
    assert host.start() == 0  # and start again
    host.close()
    queues.close()
    session.free(stranger)


def test_an_empty_batch_and_the_profile(host: HtpHost, arena: Arena) -> None:
    assert host.run([]) == STATUS_OK
    assert host.invoke(SC_PROFILER, struct.pack("<I8I", 1, *[0] * 8))[0] == 0
    x = arena.tensor(F32, (8, 2))
    x.set(randn(1, 1, 2, 8))
    seq = host.submit([OpSpec("SCALE", [x], [x], [f32_bits(2.0), 0])] * 3)
    response = host.collect()
    assert (response.seq, response.status, response.n_ops) == (seq, STATUS_OK, 3)
    assert response.buffer.flags == 0x90
    assert [opcode for opcode, _ in host.profile(response)] == [32, 32, 32]


# -- quantized weights -----------------------------------------------------------------------


@pytest.mark.parametrize("kind", [Q4_0, Q8_0, Q4_1, IQ4_NL, MXFP4])
def test_mul_mat_on_repacked_weights(host: HtpHost, arena: Arena, kind: int) -> None:
    """A weight of 40 rows (padded to 64 in the tiles) of 96 elements in 2 slices, tiled
    as the host's repack writes it, times activations: the DSP decodes the tiles to
    what ggml's own dequantisation of the blocks gives."""
    k, n, slices, m = 96, 40, 2, 3
    blocks = [ref.random_blocks(rng, kind, n, k // 32) for _ in range(slices)]
    if kind == Q4_0:
        blocks = [ref.quantize_q4_0(randn(n * k, scale=0.1)) for _ in range(slices)]
    elif kind == Q8_0:
        blocks = [ref.quantize_q8_0(randn(n * k, scale=0.1)) for _ in range(slices)]
    tiled = b"".join(ref.repack_tiled(b, kind, k, n) for b in blocks)
    row = k // 32 * ref.BLOCK[kind]  # the tiled row size of these types
    ne = (k, 64, slices, 1)
    nb = (ref.BLOCK[kind], row, row * 64, row * 64 * slices)
    weight = arena.raw(len(tiled), kind, ne, nb, TILED)
    arena.put(weight, tiled)
    x = arena.tensor(F32, (k, m, slices))
    dst = arena.tensor(F32, (n, m, slices))
    values = randn(1, slices, m, k)
    x.set(values)
    assert host.run([OpSpec("MUL_MAT", [weight, x], [dst])]) == STATUS_OK
    w = np.stack([ref.dequantize(b, kind).reshape(n, k) for b in blocks])
    expected = np.einsum("smk,snk->smn", values[0].astype(np.float64), w.astype(np.float64))
    close(dst.get()[0], expected, 1e-4)


@pytest.mark.parametrize("kind", [Q4_0, Q8_0])
def test_get_rows_of_repacked_weights(host: HtpHost, arena: Arena, kind: int) -> None:
    k, n = 64, 50
    quantize = ref.quantize_q4_0 if kind == Q4_0 else ref.quantize_q8_0
    blocks = quantize(randn(n * k))
    tiled = ref.repack_tiled(blocks, kind, k, n)
    row = k // 32 * ref.BLOCK[kind]
    table = arena.raw(len(tiled), kind, (k, 64), (ref.BLOCK[kind], row, row * 64, row * 64), TILED)
    arena.put(table, tiled)
    ids = arena.tensor(I32, (5,))
    ids.set([[[[49, 0, 33, 7, 33]]]])
    dst = arena.tensor(F32, (k, 5))
    assert host.run([OpSpec("GET_ROWS", [table, ids], [dst])]) == STATUS_OK
    rows = ref.dequantize(blocks, kind).reshape(n, k)
    close(dst.get()[0, 0], rows[[49, 0, 33, 7, 33]], 0)


def test_mul_mat_f16_and_f32_weights_broadcast(host: HtpHost, arena: Arena) -> None:
    k, n, m = 32, 8, 4
    for kind in (F16, F32):
        w = arena.tensor(kind, (k, n, 2))  # two weight slices for four activation slices
        x = arena.tensor(F32, (k, m, 4))
        dst = arena.tensor(F32, (n, m, 4))
        wv, xv = randn(1, 2, n, k), randn(1, 4, m, k)
        w.set(wv)
        x.set(xv)
        assert host.run([OpSpec("MUL_MAT", [w, x], [dst])]) == STATUS_OK
        wq = w.get()
        expected = np.stack([xv[0, i].astype(np.float64) @ wq[0, i // 2].T for i in range(4)])
        close(dst.get()[0], expected, 1e-4)


# -- ops against their references ------------------------------------------------------------


def run_ok(
    host: HtpHost, op: str, srcs: Sequence[T | None], dsts: Sequence[T], params: list[int]
) -> None:
    assert host.run([OpSpec(op, srcs, dsts, params)]) == STATUS_OK, op


@pytest.mark.parametrize("kind", [F32, F16])
def test_binary_ops_repeat_src1(host: HtpHost, arena: Arena, kind: int) -> None:
    a = arena.tensor(kind, (6, 4, 3))
    b = arena.tensor(kind, (3, 2, 1))  # repeated 2 x 2 x 3 times (ggml_can_repeat)
    a.set(randn(1, 3, 4, 6))
    b.set(randn(1, 1, 2, 3) + 3)
    av, bv = a.get().astype(np.float64), b.get().astype(np.float64)
    tiled = np.tile(bv, (1, 3, 2, 2))
    tol = 1e-6 if kind == F32 else 2e-3
    for name, function in (
        ("MUL", np.multiply),
        ("ADD", np.add),
        ("SUB", np.subtract),
        ("DIV", np.divide),
    ):
        dst = arena.tensor(kind, (6, 4, 3))
        run_ok(host, name, [a, b], [dst], [])
        close(dst.get(), function(av, tiled), tol)


def test_add_id(host: HtpHost, arena: Arena) -> None:
    a = arena.tensor(F32, (8, 3, 2))
    rows = arena.tensor(F32, (8, 5))
    ids = arena.tensor(I32, (3, 2))
    dst = arena.tensor(F32, (8, 3, 2))
    a.set(randn(1, 2, 3, 8))
    rows.set(randn(1, 1, 5, 8))
    ids.set([[[[4, 0, 2], [1, 1, 3]]]])
    run_ok(host, "ADD_ID", [a, rows, ids], [dst], [])
    expected = a.get()[0] + rows.get()[0, 0][ids.array()[0, 0]]
    close(dst.get()[0], expected)


UNARY: Final = [
    ("UNARY_SILU", [], lambda x: x / (1 + np.exp(-x)), 1e-6),
    (
        "UNARY_GELU",
        [8],
        lambda x: 0.5 * x * (1 + np.tanh(0.7978845608 * x * (1 + 0.044715 * x * x))),
        2e-3,
    ),
    ("UNARY_GELU", [9], lambda x: x / (1 + np.exp(-1.702 * x)), 2e-3),
    (
        "UNARY_GELU_ERF",
        [],
        lambda x: 0.5 * x * (1 + np.vectorize(__import__("math").erf)(x / np.sqrt(2))),
        1e-6,
    ),
    ("UNARY_SIGMOID", [], lambda x: 1 / (1 + np.exp(-x)), 1e-6),
    ("UNARY_EXP", [], np.exp, 1e-6),
    ("UNARY_NEG", [], np.negative, 0),
    ("UNARY_SOFTPLUS", [], lambda x: np.where(x > 20, x, np.log1p(np.exp(x))), 1e-6),
    ("UNARY_TANH", [], np.tanh, 1e-6),
    ("UNARY_ABS", [], np.abs, 0),
    ("UNARY_RELU", [], lambda x: np.maximum(x, 0), 0),
    ("UNARY_STEP", [], lambda x: (x > 0).astype(np.float64), 0),
    ("SQR", [], np.square, 1e-6),
    ("SCALE", [f32_bits(-1.5), f32_bits(0.25)], lambda x: x * -1.5 + 0.25, 1e-6),
    ("SCALE", [f32_bits(3.0), 0], lambda x: x * 3.0, 1e-6),
    ("CLAMP", [f32_bits(-0.5), f32_bits(0.75)], lambda x: np.clip(x, -0.5, 0.75), 0),
    ("LEAKY_RELU", [f32_bits(0.1)], lambda x: np.where(x > 0, x, 0.1 * x), 1e-6),
]


@pytest.mark.parametrize(("op", "params", "function", "tol"), UNARY)
def test_unary_ops_on_a_strided_view(
    host: HtpHost, arena: Arena, op: str, params: list[int], function: object, tol: float
) -> None:
    whole = arena.tensor(F32, (24, 5))
    whole.set(randn(1, 1, 5, 24, scale=3.0))
    src = whole.view(4, F32, (16, 5), (4, 96, 480, 480))  # rows of 16 out of rows of 24
    dst = arena.tensor(F32, (16, 5))
    run_ok(host, op, [src], [dst], params)
    assert callable(function)
    close(dst.get(), function(src.get().astype(np.float64)), tol)


def test_log_sqrt_and_tri(host: HtpHost, arena: Arena) -> None:
    src = arena.tensor(F32, (6, 6))
    src.set(np.abs(randn(1, 1, 6, 6)) + 0.1)
    x = src.get().astype(np.float64)
    for op, function in (("UNARY_LOG", np.log), ("SQRT", np.sqrt)):
        dst = arena.tensor(F32, (6, 6))
        run_ok(host, op, [src], [dst], [])
        close(dst.get(), function(x), 1e-6)
    cols, rows = np.meshgrid(np.arange(6), np.arange(6))
    for kind, keep in ((0, cols >= rows), (1, cols > rows), (2, cols <= rows), (3, cols < rows)):
        dst = arena.tensor(F32, (6, 6))
        run_ok(host, "TRI", [src], [dst], [kind])
        close(dst.get(), np.where(keep, x, 0), 0)


GLU: Final = [
    ("GLU_SWIGLU", 2, [], lambda x, g: x / (1 + np.exp(-x)) * g, 1e-6),
    (
        "GLU_GEGLU",
        1,
        [],
        lambda x, g: 0.5 * x * (1 + np.tanh(0.7978845608 * x * (1 + 0.044715 * x * x))) * g,
        3e-3,
    ),
    ("GLU_GEGLU_QUICK", 5, [], lambda x, g: x / (1 + np.exp(-1.702 * x)) * g, 3e-3),
    (
        "GLU_GEGLU_ERF",
        4,
        [],
        lambda x, g: 0.5 * x * (1 + np.vectorize(__import__("math").erf)(x / np.sqrt(2))) * g,
        1e-6,
    ),
    (
        "GLU_SWIGLU_OAI",
        3,
        [f32_bits(1.702), f32_bits(1.5)],
        lambda x, g: (
            np.minimum(x, 1.5)
            / (1 + np.exp(-1.702 * np.minimum(x, 1.5)))
            * (np.clip(g, -1.5, 1.5) + 1)
        ),
        1e-6,
    ),
    (
        "GLU_SWIGLU_CLAMP",
        6,
        [0, f32_bits(1.0)],
        lambda x, g: np.minimum(x, 1.0) / (1 + np.exp(-np.minimum(x, 1.0))) * np.clip(g, -1.0, 1.0),
        1e-6,
    ),
]


@pytest.mark.parametrize(("op", "code", "extra", "function", "tol"), GLU)
def test_glu_split_and_fused_halves(
    host: HtpHost, arena: Arena, op: str, code: int, extra: list[int], function: object, tol: float
) -> None:
    assert callable(function)
    x, g = arena.tensor(F32, (16, 3)), arena.tensor(F32, (16, 3))
    x.set(randn(1, 1, 3, 16, scale=2))
    g.set(randn(1, 1, 3, 16, scale=2))
    params = [code, 0, *extra[2:]] if len(extra) > 2 else [code, 0, *extra]
    dst = arena.tensor(F32, (16, 3))
    run_ok(host, op, [x, g], [dst], params)
    close(dst.get(), function(x.get().astype(np.float64), g.get().astype(np.float64)), tol)
    both = arena.tensor(F32, (32, 3))
    both.set(np.concatenate([g.get(), x.get()], axis=-1))  # swapped: the gate second
    dst2 = arena.tensor(F32, (16, 3))
    run_ok(host, op, [both, None], [dst2], [code, 1, *params[2:]])
    close(dst2.get(), dst.get(), 0)


def test_norms(host: HtpHost, arena: Arena) -> None:
    x = arena.tensor(F32, (64, 3, 2))
    w = arena.tensor(F32, (64,))
    x.set(randn(1, 2, 3, 64, scale=2))
    w.set(randn(1, 1, 1, 64))
    xv, wv = x.get().astype(np.float64), w.get().astype(np.float64)
    eps = f32_bits(1e-5)
    dst = arena.tensor(F32, (64, 3, 2))
    run_ok(host, "RMS_NORM", [x], [dst], [eps])
    close(dst.get(), ref.rms_norm(x.get(), 1e-5), 1e-5)
    run_ok(host, "RMS_NORM_MUL", [x, w], [dst], [eps])
    close(dst.get(), ref.rms_norm(x.get(), 1e-5) * wv, 1e-5)
    run_ok(host, "NORM", [x], [dst], [eps])
    centered = xv - xv.mean(axis=-1, keepdims=True)
    close(dst.get(), centered / np.sqrt((centered**2).mean(axis=-1, keepdims=True) + 1e-5), 1e-5)
    run_ok(host, "L2_NORM", [x], [dst], [f32_bits(1e-6)])
    close(dst.get(), xv / np.linalg.norm(xv, axis=-1, keepdims=True), 1e-6)


@pytest.mark.parametrize("mask_kind", [F16, F32])
def test_softmax_with_mask_alibi_and_sinks(host: HtpHost, arena: Arena, mask_kind: int) -> None:
    heads, rows, cols = 4, 3, 32
    x = arena.tensor(F32, (cols, rows, heads))
    mask = arena.tensor(mask_kind, (cols, 8))  # more rows than needed, shared by all heads
    sinks = arena.tensor(F32, (heads,))
    x.set(randn(1, heads, rows, cols))
    mask_values = np.where(rng.random((1, 1, 8, cols)) < 0.3, -np.inf, randn(1, 1, 8, cols))
    mask.set(mask_values)
    sinks.set(randn(1, 1, 1, heads))
    xv, mv, sv = x.get()[0].astype(np.float64), mask.get()[0, 0], sinks.get()[0, 0, 0]
    for max_bias, with_sinks in ((0.0, False), (8.0, False), (0.0, True)):
        dst = arena.tensor(F32, (cols, rows, heads))
        params = [f32_bits(0.5), f32_bits(max_bias)]
        run_ok(host, "SOFTMAX", [x, mask, sinks if with_sinks else None], [dst], params)
        expected = np.zeros((heads, rows, cols))
        for h in range(heads):
            slope = ref.alibi_slope(h, heads, max_bias)
            for r in range(rows):
                scores = xv[h, r] * 0.5 + slope * mv[r]
                if with_sinks:
                    expected[h, r] = ref.softmax_row(np.append(scores, sv[h]))[:cols]
                else:
                    expected[h, r] = ref.softmax_row(scores)
        close(dst.get()[0], expected, 1e-6)


def rope_params(n_dims: int, mode: int, n_offs: int = 0, **yarn: float) -> list[int]:
    params = [0] * 16
    params[1], params[2], params[4], params[15] = n_dims, mode, 4096, n_offs
    params[5] = f32_bits(yarn.get("base", 10000.0))
    params[6] = f32_bits(yarn.get("freq_scale", 1.0))
    params[7] = f32_bits(yarn.get("ext_factor", 0.0))
    params[8] = f32_bits(yarn.get("attn_factor", 1.0))
    params[9] = f32_bits(yarn.get("beta_fast", 32.0))
    params[10] = f32_bits(yarn.get("beta_slow", 1.0))
    return params


@pytest.mark.parametrize(
    ("mode", "n_offs", "factors"),
    [(0, 0, False), (2, 0, False), (2, 0, True), (0, 32, False), (2, 32, True)],
)
def test_rope(host: HtpHost, arena: Arena, mode: int, n_offs: int, factors: bool) -> None:
    head, heads, tokens, n_dims = 96, 3, 4, 32
    x = arena.tensor(F32, (head, heads, tokens))
    pos = arena.tensor(I32, (tokens,))
    ff = arena.tensor(F32, (n_dims // 2,))
    x.set(randn(1, tokens, heads, head))
    pos.set([[[[0, 7, 19, 200]]]])
    ff.set(rng.uniform(0.5, 4.0, (1, 1, 1, n_dims // 2)))
    dst = arena.tensor(F32, (head, heads, tokens))
    run_ok(
        host, "ROPE", [x, pos, ff if factors else None], [dst], rope_params(n_dims, mode, n_offs)
    )
    xv = x.get()[0]
    for t, p in enumerate((0, 7, 19, 200)):
        for h in range(heads):
            row = ref.rope_row(
                xv[t, h],
                p,
                n_dims,
                mode == 2,
                10000.0,
                ff.get()[0, 0, 0] if factors else None,
                n_offs,
            )
            close(dst.get()[0, t, h], row, 1e-4)


def test_rope_yarn(host: HtpHost, arena: Arena) -> None:
    head, tokens = 64, 3
    x = arena.tensor(F32, (head, 2, tokens))
    pos = arena.tensor(I32, (tokens,))
    x.set(randn(1, tokens, 2, head))
    pos.set([[[[3, 900, 4000]]]])
    yarn = {
        "base": 500000.0,
        "freq_scale": 0.25,
        "ext_factor": 1.0,
        "attn_factor": 1.0,
        "beta_fast": 32.0,
        "beta_slow": 1.0,
    }
    for mode in (0, 2):
        dst = arena.tensor(F32, (head, 2, tokens))
        run_ok(host, "ROPE", [x, pos], [dst], rope_params(head, mode, 0, **yarn))
        for t, p in enumerate((3, 900, 4000)):
            for h in range(2):
                expected = ref.rope_yarn_row(
                    x.get()[0, t, h], p, head, mode == 2, 500000.0, 0.25, 1.0, 1.0, 32.0, 1.0, 4096
                )
                # ggml multiplies the angles up in float32: at position 4000 that is
                # off by about 1e-4 of a radian; a wrong YaRN term is off by far more.
                close(dst.get()[0, t, h], expected, 2e-3)


@pytest.mark.parametrize(
    ("kv", "softcap", "max_bias", "with_sinks", "out"),
    [(F16, 0.0, 0.0, False, F32), (F16, 30.0, 0.0, True, F32), (Q8_0, 0.0, 8.0, False, F16)],
)
def test_flash_attn_ext(
    host: HtpHost,
    arena: Arena,
    kv: int,
    softcap: float,
    max_bias: float,
    with_sinks: bool,
    out: int,
) -> None:
    dk, heads, heads_kv, rows, n_kv = 32, 4, 2, 3, 64
    q = arena.tensor(F32, (dk, rows, heads))
    q.set(randn(1, heads, rows, dk))
    kv_values = [randn(heads_kv, n_kv, dk) for _ in range(2)]
    if kv == F16:
        k, v = arena.tensor(F16, (dk, n_kv, heads_kv)), arena.tensor(F16, (dk, n_kv, heads_kv))
        k.set(kv_values[0][None])
        v.set(kv_values[1][None])
        kf, vf = k.get()[0], v.get()[0]
    else:
        blocks = [ref.quantize_q8_0(values.reshape(-1)) for values in kv_values]
        k = arena.raw(
            len(blocks[0]), Q8_0, (dk, n_kv, heads_kv), (34, 34, 34 * n_kv, 34 * n_kv * heads_kv)
        )
        v = arena.raw(
            len(blocks[1]), Q8_0, (dk, n_kv, heads_kv), (34, 34, 34 * n_kv, 34 * n_kv * heads_kv)
        )
        arena.put(k, blocks[0])
        arena.put(v, blocks[1])
        kf = ref.dequantize(blocks[0], Q8_0).reshape(heads_kv, n_kv, dk)
        vf = ref.dequantize(blocks[1], Q8_0).reshape(heads_kv, n_kv, dk)
    mask = arena.tensor(F16, (n_kv, rows))
    mask.set(
        np.where(
            np.arange(n_kv)[None, None, None, :] > 40 + np.arange(rows)[None, None, :, None],
            -np.inf,
            0.0,
        )
    )
    sinks = arena.tensor(F32, (heads,))
    sinks.set(randn(1, 1, 1, heads))
    dst = arena.tensor(out, (dk, heads, rows))
    params = [f32_bits(0.2), f32_bits(max_bias), f32_bits(softcap), 10]
    run_ok(host, "FLASH_ATTN_EXT", [q, k, v, mask, sinks if with_sinks else None], [dst], params)
    expected = ref.attention(
        q.get()[0],
        kf,
        vf,
        mask.get()[0, 0],
        0.2,
        max_bias,
        softcap,
        sinks.get()[0, 0, 0] if with_sinks else None,
    )
    close(dst.get()[0], expected, 1e-5 if out == F32 else 2e-3)


def test_get_rows_and_set_rows(host: HtpHost, arena: Arena) -> None:
    table = arena.tensor(F16, (16, 10, 2))
    table.set(randn(1, 2, 10, 16))
    ids = arena.tensor(I32, (4, 2))
    ids.set([[[[9, 0, 3, 3], [1, 2, 8, 7]]]])
    for out in (F16, F32):
        dst = arena.tensor(out, (16, 4, 2))
        run_ok(host, "GET_ROWS", [table, ids], [dst], [])
        for s in range(2):
            close(dst.get()[0, s], table.get()[0, s][ids.array()[0, 0, s]], 0)
    ints = arena.tensor(I32, (3, 5))
    ints.set(rng.integers(-1000, 1000, (1, 1, 5, 3)))
    one = arena.tensor(I32, (1,))
    one.set([[[[4]]]])
    picked = arena.tensor(I32, (3, 1))
    run_ok(host, "GET_ROWS", [ints, one], [picked], [])
    assert (picked.array()[0, 0, 0] == ints.array()[0, 0, 4]).all()
    rows = arena.tensor(F32, (64, 3, 2))
    rows.set(randn(1, 2, 3, 64))
    where = arena.tensor(I64, (3,))
    where.set([[[[5, 0, 11]]]])
    for kind in (F32, F16, Q8_0):
        cache = arena.tensor(kind, (64, 12, 2))
        run_ok(host, "SET_ROWS", [rows, where, cache], [cache], [])
        if kind == Q8_0:
            data = bytes(cache.buffer.view()[cache.offset : cache.offset + 2 * 12 * 68])
            got = ref.dequantize(data, Q8_0).reshape(2, 12, 64)
            tol = 0.03
        else:
            got, tol = cache.get()[0], 1e-3 if kind == F16 else 0
        for s in range(2):
            close(got[s][[5, 0, 11]], rows.get()[0, s], tol)


def test_cpy_and_cont(host: HtpHost, arena: Arena) -> None:
    src = arena.tensor(F32, (8, 6))
    src.set(randn(1, 1, 6, 8, scale=40))
    cases = [(F16, 0.02), (F32, 0), (I32, 0)]
    for kind, tol in cases:
        dst = arena.tensor(kind, (8, 6))
        run_ok(host, "CPY", [src], [dst], [])
        expected = src.get().astype(np.float64)
        if kind == I32:
            expected = np.trunc(expected)
        close(dst.get(), expected, tol)
    transposed = src.view(0, F32, (6, 8), (32, 4, 192, 192))  # ggml_transpose of src
    cont = arena.tensor(F32, (6, 8))
    run_ok(host, "CPY", [transposed], [cont], [])
    close(cont.get()[0, 0], src.get()[0, 0].T, 0)
    ints = arena.tensor(I32, (4,))
    ints.set([[[[-3, 0, 7, 123456]]]])
    floats = arena.tensor(F32, (2, 2))  # another shape, same element count
    run_ok(host, "CPY", [ints], [floats], [])
    close(floats.get().reshape(-1), [-3, 0, 7, 123456], 0)


def test_repeat_concat_pad_roll_fill_diag(host: HtpHost, arena: Arena) -> None:
    a = arena.tensor(F32, (4, 3, 2))
    a.set(randn(1, 2, 3, 4))
    av = a.get()[0].astype(np.float64)
    rep = arena.tensor(F32, (8, 3, 4))
    run_ok(host, "REPEAT", [a], [rep], [])
    close(rep.get()[0], np.tile(av, (2, 1, 2)), 0)
    b = arena.tensor(F32, (4, 5, 2))
    b.set(randn(1, 2, 5, 4))
    cat = arena.tensor(F32, (4, 8, 2))
    run_ok(host, "CONCAT", [a, b], [cat], [1])
    close(cat.get()[0], np.concatenate([av, b.get()[0]], axis=1), 0)
    padded = arena.tensor(F32, (7, 4, 2))
    run_ok(host, "PAD", [a], [padded], [1, 2, 0, 1, 0, 0, 0, 0, 0])
    close(padded.get()[0], np.pad(av, ((0, 0), (0, 1), (1, 2))), 0)
    circular = arena.tensor(F32, (7, 3, 2))
    run_ok(host, "PAD", [a], [circular], [1, 2, 0, 0, 0, 0, 0, 0, 1])
    close(circular.get()[0], np.pad(av, ((0, 0), (0, 0), (1, 2)), mode="wrap"), 0)
    rolled = arena.tensor(F32, (4, 3, 2))
    run_ok(host, "ROLL", [a], [rolled], [1, -1, 0, 0])
    close(rolled.get()[0], np.roll(av, (-1, 1), axis=(1, 2)), 0)
    filled = arena.tensor(F32, (5, 2))
    run_ok(host, "FILL", [None], [filled], [f32_bits(2.5)])
    close(filled.get(), np.full((1, 1, 2, 5), 2.5), 0)
    vec = arena.tensor(F32, (5, 1, 2))
    vec.set(randn(1, 2, 1, 5))
    square = arena.tensor(F32, (5, 5, 2))
    run_ok(host, "DIAG", [vec], [square], [])
    close(square.get()[0], np.stack([np.diag(vec.get()[0, s, 0]) for s in range(2)]), 0)


def test_reductions_and_orders(host: HtpHost, arena: Arena) -> None:
    x = arena.tensor(F32, (16, 5))
    values = rng.permutation(80).reshape(1, 1, 5, 16).astype(np.float32) / 7  # no ties
    x.set(values)
    xv = values[0, 0].astype(np.float64)
    out = arena.tensor(F32, (16, 5))
    run_ok(host, "CUMSUM", [x], [out], [])
    close(out.get()[0, 0], np.cumsum(xv, axis=-1), 1e-6)
    rows = arena.tensor(F32, (1, 5))
    run_ok(host, "SUM_ROWS", [x], [rows], [])
    close(rows.get()[0, 0, :, 0], xv.sum(axis=-1), 1e-6)
    total = arena.tensor(F32, (1,))
    run_ok(host, "SUM", [x], [total], [])
    close(total.get().reshape(-1), [xv.sum()], 1e-6)
    best = arena.tensor(I32, (5,))
    run_ok(host, "ARGMAX", [x], [best], [])
    assert (best.array().reshape(-1) == xv.argmax(axis=-1)).all()
    for order in (0, 1):
        index = arena.tensor(I32, (16, 5))
        run_ok(host, "ARGSORT", [x], [index], [order])
        expected = np.argsort(xv if order == 0 else -xv, axis=-1)
        assert (index.array()[0, 0] == expected).all()
    top = arena.tensor(I32, (4, 5))
    run_ok(host, "TOP_K", [x], [top], [])
    got = top.array()[0, 0]
    for r in range(5):  # the 4 largest, in any order (ggml-cpu swaps the first two)
        assert sorted(got[r].tolist()) == sorted(np.argsort(-xv[r])[:4].tolist())


def _q4_0_weight(arena: Arena, k: int, n: int, slices: int = 1) -> tuple[T, F32A]:
    """A repacked q4_0 weight of ``slices`` x n rows of k, and its ggml dequantisation."""
    blocks = [ref.quantize_q4_0(randn(n * k, scale=0.1)) for _ in range(slices)]
    tiled = b"".join(ref.repack_tiled(b, Q4_0, k, n) for b in blocks)
    rows = -(-n // 32) * 32
    row = k // 32 * 18
    ne = (k, rows, slices, 1)
    weight = arena.raw(len(tiled), Q4_0, ne, (18, row, row * rows, row * rows * slices), TILED)
    arena.put(weight, tiled)
    values = np.stack([ref.dequantize(b, Q4_0).reshape(n, k) for b in blocks])
    return weight, values


def test_fused_matmuls(host: HtpHost, arena: Arena) -> None:
    k, n, m = 64, 48, 2
    x = arena.tensor(F32, (k, m))
    x.set(randn(1, 1, m, k))
    xv = x.get()[0, 0].astype(np.float64)
    weights = [_q4_0_weight(arena, k, n) for _ in range(3)]
    residual = arena.tensor(F32, (n, m))
    residual.set(randn(1, 1, m, n))
    dst = arena.tensor(F32, (n, m))
    run_ok(host, "MUL_MAT_ADD", [weights[0][0], x, residual], [dst], [])
    close(dst.get()[0, 0], xv @ weights[0][1][0].T + residual.get()[0, 0], 1e-5)
    bias = arena.tensor(F32, (n,))  # repeated over the rows, as ggml's ADD repeats
    bias.set(randn(1, 1, 1, n))
    run_ok(host, "MUL_MAT_ADD", [weights[1][0], x, bias], [dst], [])
    close(dst.get()[0, 0], xv @ weights[1][1][0].T + bias.get()[0, 0], 1e-5)
    outs = [arena.tensor(F32, (n, m)) for _ in range(3)]
    run_ok(host, "MUL_MAT_NX", [w for w, _ in weights] + [x], outs, [])
    for out, (_, values) in zip(outs, weights, strict=True):
        close(out.get()[0, 0], xv @ values[0].T, 1e-5)


def test_mul_mat_id_over_repacked_experts(host: HtpHost, arena: Arena) -> None:
    k, n, experts, used, tokens = 64, 40, 4, 2, 3
    gate, gate_values = _q4_0_weight(arena, k, n, experts)
    up, up_values = _q4_0_weight(arena, k, n, experts)
    x = arena.tensor(F32, (k, 1, tokens))  # one row per token, shared by its experts
    x.set(randn(1, tokens, 1, k))
    ids = arena.tensor(I32, (used, tokens))
    ids.set([[[[3, 0], [1, 3], [2, 2]]]])
    chosen = ids.array()[0, 0]
    dst = arena.tensor(F32, (n, used, tokens))
    run_ok(host, "MUL_MAT_ID", [gate, x, ids], [dst], [])
    xv = x.get()[0, :, 0].astype(np.float64)

    def expected(values: F32A) -> npt.NDArray[np.float64]:
        return np.stack(
            [[values[chosen[t, e]] @ xv[t] for e in range(used)] for t in range(tokens)]
        )

    close(dst.get()[0], expected(gate_values), 1e-5)
    outs = [arena.tensor(F32, (n, used, tokens)) for _ in range(2)]
    run_ok(host, "MUL_MAT_ID_NX", [gate, up, x, ids], outs, [])
    close(outs[0].get()[0], expected(gate_values), 1e-5)
    close(outs[1].get()[0], expected(up_values), 1e-5)


def test_fences(host: HtpHost, arena: Arena) -> None:
    slot = arena.tensor(I32, (2,))
    slot.set([[[[0, 0]]]])
    assert host.run([OpSpec("FENCE", [slot], [], [0x77, 1])]) == STATUS_OK
    assert slot.array().reshape(-1).tolist() == [0x77, STATUS_OK]
    assert host.run([OpSpec("FENCE", [slot], [], [0x70, 0])]) == STATUS_OK  # already passed
    src, dst = arena.tensor(F32, (4,)), arena.tensor(F16, (4,))
    src.set([[[[1, 2, 3, 4]]]])
    assert host.run([OpSpec("CPY_FENCE", [src, slot], [dst], [0x78])]) == STATUS_OK
    assert slot.array().reshape(-1).tolist() == [0x78, STATUS_OK]
    close(dst.get(), [[[[1, 2, 3, 4]]]], 0)
    group = arena.raw(128, 24, (128, 1, 1, 1), (1, 128, 128, 128))  # I8 fence slots, 1 device
    assert host.run([OpSpec("MDEV_GROUP", [group], [], [0])]) == STATUS_OK


# -- a decode step of a tiny llama, as llama-simple sends it -------------------------------------


class TinyLlama:
    """The 29-op batch of one decode step of the tiny llama (2 layers, embd 128, 4 heads
    of 32, ff 256, vocab 128, 256 cache cells), tensor for tensor as ggml-hexagon sent it
    (llama-prep traces/llama-simple-tiny-q4_0.level2.log, batch 2): the same three
    buffers (the f16 KV cache, the weights, the compute buffer), offsets, views and
    ops; q4_0 weights repacked; random weights and inputs."""

    EMBD, HEADS, HEAD, FF, CELLS = 128, 4, 32, 256, 256

    def __init__(self, host: HtpHost, pos: int) -> None:
        session = host.session
        self.pos = pos
        self.cache = host.queues.map(session.alloc(266240))
        self.weights = host.queues.map(session.alloc(200704))
        self.compute = host.queues.map(session.alloc(20480))
        self.dense: dict[int, npt.NDArray[np.float64]] = {}
        embd, ff = self.EMBD, self.FF

        def f32(buffer: object, offset: int, n: int, flags: int = 0) -> T:
            assert isinstance(buffer, type(self.cache))
            return T(buffer, offset, F32, (n, 1, 1, 1), (4, 4 * n, 4 * n, 4 * n), flags)

        def weight(offset: int, k: int, n: int) -> T:
            blocks = ref.quantize_q4_0(randn(n * k, scale=0.08))
            tiled = ref.repack_tiled(blocks, Q4_0, k, n)
            row = k // 32 * 18
            t = T(self.weights, offset, Q4_0, (k, n, 1, 1), (18, row, row * n, row * n), TILED)
            self.weights.view()[offset : offset + len(tiled)] = tiled
            self.dense[offset] = ref.dequantize(blocks, Q4_0).reshape(n, k).astype(np.float64)
            return t

        def norm_weight(offset: int) -> T:
            t = f32(self.weights, offset, embd, WEIGHT)
            t.set(1 + randn(1, 1, 1, embd, scale=0.1))
            return t

        def cache_rows(offset: int) -> T:
            return T(self.cache, offset, F16, (embd, 256, 1, 1), (2, 256, 65536, 65536))

        def cache_heads(offset: int) -> T:
            return T(self.cache, offset, F16, (32, 256, 4, 1), (2, 256, 64, 65536))

        c = self.compute
        t = [None] * 49  # type: list[T | None]
        t[0], t[1] = f32(c, 0, embd), f32(c, 3584, embd)
        t[2], t[3] = norm_weight(9728), weight(10240, embd, embd)
        t[4], t[5] = f32(c, 5120, embd), weight(28672, embd, embd)
        t[6], t[7], t[8] = f32(c, 6656, embd), weight(19456, embd, embd), f32(c, 8192, embd)
        heads = (32, 4, 1, 1), (4, 128, 512, 512)
        t[9] = T(c, 5120, F32, *heads)
        t[10] = T(c, 1536, I32, (1, 1, 1, 1), (4, 4, 4, 4))
        t[11], t[12] = T(c, 3584, F32, *heads), T(c, 8192, F32, *heads)
        t[13] = T(c, 1664, I64, (1, 1, 1, 1), (8, 8, 8, 8))
        t[14] = cache_rows(0)
        t[15] = T(c, 1792, I64, (1, 1, 1, 1), (8, 8, 8, 8))
        t[16] = cache_rows(65536)
        t[17] = T(c, 3584, F32, (32, 1, 4, 1), (4, 512, 128, 512))
        t[18], t[19] = cache_heads(0), cache_heads(65536)
        t[20] = T(c, 1920, F16, (256, 1, 1, 1), (2, 512, 512, 512))
        t[21], t[22] = weight(37888, embd, embd), norm_weight(47104)
        t[23], t[24] = weight(47616, embd, ff), f32(c, 5120, ff)
        t[25], t[26] = weight(84480, embd, ff), f32(c, 8192, ff)
        t[27] = f32(c, 11264, ff)
        t[28] = T(self.weights, 66048, Q4_0, (ff, embd, 1, 1), (18, 144, 18432, 18432), TILED)
        self._fill_weight(t[28], ff, embd)  # type: ignore[arg-type]
        t[29], t[30] = norm_weight(102912), weight(103424, embd, embd)
        t[31], t[32] = weight(121856, embd, embd), weight(112640, embd, embd)
        t[33], t[34] = cache_rows(131072), cache_rows(196608)
        t[35], t[36] = cache_heads(131072), cache_heads(196608)
        t[37] = weight(131072, embd, embd)
        t[38] = T(c, 3456, I32, (1, 1, 1, 1), (4, 4, 4, 4))
        t[39], t[40] = f32(c, 1536, embd), norm_weight(140288)
        t[41], t[42] = weight(140800, embd, ff), f32(c, 3072, ff)
        t[43], t[44] = weight(177664, embd, ff), f32(c, 6144, ff)
        t[45] = f32(c, 9216, ff)
        t[46] = T(self.weights, 159232, Q4_0, (ff, embd, 1, 1), (18, 144, 18432, 18432), TILED)
        self._fill_weight(t[46], ff, embd)  # type: ignore[arg-type]
        t[47], t[48] = norm_weight(0), weight(512, embd, embd)
        self.t = [x for x in t if x is not None]
        assert len(self.t) == 49
        eps, scale = f32_bits(1e-5), f32_bits(1 / np.sqrt(32))
        rope = [
            0,
            32,
            0,
            0,
            256,
            f32_bits(10000.0),
            f32_bits(1.0),
            0,
            f32_bits(1.0),
            f32_bits(32.0),
            f32_bits(1.0),
        ]
        x = self.t

        def op(
            name: str, srcs: list[int], dsts: list[int], params: list[int] | None = None
        ) -> OpSpec:
            return OpSpec(name, [x[i] for i in srcs], [x[i] for i in dsts], params or [])

        self.ops = [
            op("RMS_NORM_MUL", [0, 2], [1], [eps]),
            op("MUL_MAT_NX", [3, 5, 7, 1], [4, 6, 8]),
            op("ROPE", [9, 10], [11], rope),
            op("ROPE", [12, 10], [9], rope),
            op("SET_ROWS", [4, 13, 14], [14]),
            op("SET_ROWS", [6, 15, 16], [16]),
            op("FLASH_ATTN_EXT", [17, 18, 19, 20], [9], [scale, 0, 0, 10]),
            op("MUL_MAT_ADD", [21, 4, 0], [1]),
            op("RMS_NORM_MUL", [1, 22], [0], [eps]),
            op("MUL_MAT_NX", [23, 25, 0], [24, 26]),
            op("GLU_SWIGLU", [24, 26], [27], [2]),
            op("MUL_MAT_ADD", [28, 27, 1], [0]),
            op("RMS_NORM_MUL", [0, 29], [1], [eps]),
            op("MUL_MAT_NX", [30, 31, 32, 1], [4, 6, 8]),
            op("ROPE", [9, 10], [11], rope),
            op("ROPE", [12, 10], [9], rope),
            op("SET_ROWS", [4, 13, 33], [33]),
            op("SET_ROWS", [6, 15, 34], [34]),
            op("FLASH_ATTN_EXT", [17, 35, 36, 20], [9], [scale, 0, 0, 10]),
            op("MUL_MAT", [37, 4], [1]),
            op("GET_ROWS", [1, 38], [39]),
            op("GET_ROWS", [0, 38], [1]),
            op("ADD", [39, 1], [39]),
            op("RMS_NORM_MUL", [39, 40], [0], [eps]),
            op("MUL_MAT_NX", [41, 43, 0], [42, 44]),
            op("GLU_SWIGLU", [42, 44], [45], [2]),
            op("MUL_MAT_ADD", [46, 45, 39], [0]),
            op("RMS_NORM_MUL", [0, 47], [0], [eps]),
            op("MUL_MAT", [48, 0], [39]),
        ]
        # Inputs: the token's embedding, its position, earlier cells of the cache, the mask.
        x[0].set(randn(1, 1, 1, embd))
        x[10].set([[[[pos]]]])
        x[13].set([[[[pos]]]])
        x[15].set([[[[pos]]]])
        x[38].set([[[[0]]]])
        for offset in (0, 65536, 131072, 196608):
            cells = T(self.cache, offset, F16, (embd, 256, 1, 1), (2, 256, 65536, 65536))
            cells.set(randn(1, 1, 256, embd, scale=0.5))
        x[20].set(np.where(np.arange(256) <= pos, 0.0, -np.inf)[None, None, None, :])
        self.inputs = x[0].get()[0, 0, 0].astype(np.float64)
        self.caches = {o: self.cells(o) for o in (0, 65536, 131072, 196608)}

    def _fill_weight(self, t: T, k: int, n: int) -> None:
        blocks = ref.quantize_q4_0(randn(n * k, scale=0.08))
        tiled = ref.repack_tiled(blocks, Q4_0, k, n)
        self.weights.view()[t.offset : t.offset + len(tiled)] = tiled
        self.dense[t.offset] = ref.dequantize(blocks, Q4_0).reshape(n, k).astype(np.float64)

    def cells(self, offset: int) -> npt.NDArray[np.float64]:
        view = T(self.cache, offset, F16, (128, 256, 1, 1), (2, 256, 65536, 65536))
        return np.asarray(view.get()[0, 0], np.float64)

    def reference(self) -> tuple[npt.NDArray[np.float64], dict[int, npt.NDArray[np.float64]]]:
        """The step in plain numpy: the logits and the caches after it."""
        w = self.dense
        norms = {
            o: self.t[i].get()[0, 0, 0].astype(np.float64)
            for i, o in ((2, 2), (22, 22), (29, 29), (40, 40), (47, 47))
        }

        def rms(v: npt.NDArray[np.float64], i: int) -> npt.NDArray[np.float64]:
            return np.asarray(v / np.sqrt((v * v).mean() + 1e-5) * norms[i], np.float64)

        def rope(v: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
            return np.concatenate(
                [
                    ref.rope_row(h.astype(np.float32), self.pos, 32, False, 10000.0)
                    for h in v.reshape(4, 32)
                ]
            )

        caches = {o: c.copy() for o, c in self.caches.items()}

        def attention(
            h: npt.NDArray[np.float64], layer: int, wq: int, wv: int, wk: int
        ) -> npt.NDArray[np.float64]:
            q, v, k = rope(w[wq] @ h), w[wv] @ h, rope(w[wk] @ h)
            kc, vc = caches[131072 * layer], caches[131072 * layer + 65536]
            kc[self.pos] = k.astype(np.float16)
            vc[self.pos] = v.astype(np.float16)
            out = np.zeros(128)
            for head in range(4):
                part = slice(32 * head, 32 * head + 32)
                scores = kc[: self.pos + 1, part] @ q[part] / np.sqrt(32)
                out[part] = ref.softmax_row(scores) @ vc[: self.pos + 1, part]
            return np.asarray(out, np.float64)

        def ffn(
            h: npt.NDArray[np.float64], gate: int, up: int, down: int
        ) -> npt.NDArray[np.float64]:
            g, u = w[gate] @ h, w[up] @ h
            return np.asarray(w[down] @ (g / (1 + np.exp(-g)) * u), np.float64)

        x = self.inputs
        x = w[37888] @ attention(rms(x, 2), 0, 10240, 28672, 19456) + x
        x = ffn(rms(x, 22), 47616, 84480, 66048) + x
        x = w[131072] @ attention(rms(x, 29), 1, 103424, 121856, 112640) + x
        x = ffn(rms(x, 40), 140800, 177664, 159232) + x
        return w[512] @ rms(x, 47), caches


@pytest.mark.parametrize("pos", [0, 5, 255])
def test_a_decode_step_of_a_tiny_llama(host: HtpHost, pos: int) -> None:
    model = TinyLlama(host, pos)
    assert host.run(model.ops) == STATUS_OK
    logits, caches = model.reference()
    close(model.t[39].get()[0, 0, 0], logits, 1e-4)
    for offset, expected in caches.items():
        close(model.cells(offset), expected, 1e-3)


# -- batches in flight, what the DSP refuses -------------------------------------------------


def test_32_batches_in_flight(host: HtpHost, arena: Arena) -> None:
    cells = [arena.tensor(F32, (16,)) for _ in range(32)]
    for index, cell in enumerate(cells):
        cell.set(np.full((1, 1, 1, 16), index, np.float32))
    seqs = [
        host.submit([OpSpec("SCALE", [cell], [cell], [f32_bits(2.0), f32_bits(1.0)])])
        for cell in cells
    ]
    responses = [host.collect() for _ in cells]
    assert [r.seq for r in responses] == seqs  # in order, one each
    assert all(r.status == STATUS_OK for r in responses)
    offsets = {r.buffer.offset for r in responses}
    assert offsets == {slot * host.slot_size for slot in range(32)}  # every slot, back
    for index, cell in enumerate(cells):
        close(cell.get(), np.full((1, 1, 1, 16), 2 * index + 1), 0)


def test_an_op_the_dsp_does_not_implement_answers_no_support(
    host: HtpHost, arena: Arena, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="npud.sim.htp")
    x = arena.tensor(F32, (32, 4))
    x.set(np.ones((1, 1, 4, 32)))
    y = arena.tensor(F32, (32, 4))
    ops = [
        OpSpec("SSM_CONV", [x, x], [y]),
        OpSpec("SCALE", [x], [x], [f32_bits(3.0), 0]),  # later ops still run
    ]
    assert host.run(ops) == STATUS_NO_SUPPORT
    close(x.get(), np.full((1, 1, 4, 32), 3.0), 0)
    assert any("SSM_CONV" in r.getMessage() for r in caplog.records)
    unknown = OpSpec("SCALE", [x], [x], [f32_bits(1.0), 0])
    seq = host.submit([unknown])
    struct.pack_into("<I", host.opqueue.view(), (seq - 1) % 32 * host.slot_size + 24 + 56, 200)
    assert host.collect().status == STATUS_NO_SUPPORT  # an op code past the enum
    q4k = arena.raw(4096, 12, (256, 32, 1, 1), (144, 144, 4608, 4608), TILED)  # q4_K
    out = arena.tensor(F32, (32, 1))
    vec = arena.tensor(F32, (256, 1))
    assert host.run([OpSpec("MUL_MAT", [q4k, vec], [out])]) == STATUS_NO_SUPPORT
    assert any("MUL_MAT" in r.getMessage() for r in caplog.records)


def test_a_buffer_the_pd_never_mapped_answers_inval_params(
    host: HtpHost, arena: Arena, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="npud.sim.htp")
    x = arena.tensor(F32, (8,))
    x.set(np.ones((1, 1, 1, 8)))
    stranger = host.session.alloc(4096)  # allocated, never mapped into the DSP process
    host.submit([OpSpec("SCALE", [x], [x], [f32_bits(5.0), 0])], raw_fds=[stranger.fd])
    assert host.collect().status == STATUS_INVAL_PARAMS
    close(x.get(), np.ones((1, 1, 1, 8)), 0)  # nothing ran
    assert any("refused" in r.getMessage() for r in caplog.records)
    outside = x.view(4096 * 300, F32, (8,), (4, 32, 32, 32))  # past the buffer's end
    assert host.run([OpSpec("SCALE", [outside], [outside], [f32_bits(2.0), 0])]) == (
        STATUS_INVAL_PARAMS
    )
    assert host.run([OpSpec("SCALE", [x], [x], [f32_bits(2.0), 0])]) == STATUS_OK  # serving on
    close(x.get(), np.full((1, 1, 1, 8), 2.0), 0)
    host.session.free(stranger)


# -- the PD's end -----------------------------------------------------------------------------

DSP_THREADS: Final = ("dsp-htp-worker", "dsp-queue-echo")


def _dsp_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name in DSP_THREADS]


def _dmabuf_maps(pid: int | str = "self") -> int:
    text = Path(f"/proc/{pid}/maps").read_text()
    return sum("fastrpc-dmabuf" in line for line in text.splitlines())


def _gone(pid: int) -> bool:
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return True
    try:
        return bool(select.select([fd], [], [], GUARD)[0])
    finally:
        os.close(fd)


@pytest.mark.parametrize("ending", ["crash", "exit", "close"])
def test_the_end_of_the_pd_ends_everything(driver: EmulatedDriver, ending: str) -> None:
    """A PD killed (crash_process), exited (handle 4) or released (its fd closed) while
    its htp worker runs, a batch's mappings are held and, but for the close (which the
    kernel defers while an ioctl runs), a wait_signal waits: no thread, child or
    mapping of it is left."""
    maps_before = _dmabuf_maps()
    session = FastRpcSession.open(driver, library_path=(DSP_LIBRARY_DIR,))
    session.load_shell(DEV_SHELL.read_bytes())
    queues = CpuQueues(session, receive=ending != "close")
    host = HtpHost(session, queues)
    assert host.start() == 0
    arena = Arena(host, 1 << 16)
    x = arena.tensor(F32, (8,))
    x.set(np.ones((1, 1, 1, 8)))
    if ending != "close":
        assert host.run([OpSpec("SCALE", [x], [x], [f32_bits(2.0), 0])]) == STATUS_OK
    fd = session.fileno()
    child = driver.pd_pid(fd)
    if driver.config.pd_isolation == "thread":
        assert child is None
        assert _dsp_threads() == ["dsp-htp-worker"]
    else:
        assert child is not None
        assert _dmabuf_maps(child) >= 3  # the queue, the state block, the op queue...
    if ending == "crash":
        assert driver.crash_process(fd)
    elif ending == "exit":
        session.end_process()
    if ending != "close":
        queues.join_receiver()  # its wait_signal returned (AEE_EBADSTATE)
        assert queues.error == AEE_EBADSTATE
        queues.abandon()
        assert _dsp_threads() == []
    else:
        queues.let_go()  # the CPU process is going: its views go, no call on the way out
    session.close()
    if child is not None:
        assert _gone(child)
    assert _dsp_threads() == []
    stats = driver.statistics()
    assert (stats.dsp_processes, stats.mem_maps, stats.remote_handles_open) == (0, 0, 0)
    assert stats.pd_children == 0
    del x, arena, host, queues
    gc.collect()
    assert _dmabuf_maps() == maps_before


def test_a_subsystem_restart_ends_the_worker_and_the_wait(driver: EmulatedDriver) -> None:
    session = FastRpcSession.open(driver, library_path=(DSP_LIBRARY_DIR,))
    session.load_shell(DEV_SHELL.read_bytes())
    queues = CpuQueues(session)
    host = HtpHost(session, queues)
    assert host.start() == 0
    driver.faults.subsystem_restart()
    queues.join_receiver()  # wait_signal failed (EPIPE)
    assert queues.error != 0
    queues.abandon()
    assert _dsp_threads() == []
    session.close()
    driver.faults.boot()
    assert driver.statistics().pd_children == 0


@pytest.mark.parametrize(("mode", "head", "n_dims"), [(8, 64, 48), (40, 64, 48), (24, 64, 32)])
def test_rope_multi_section_modes(
    host: HtpHost, arena: Arena, mode: int, head: int, n_dims: int
) -> None:
    tokens, heads, sections = 3, 2, (4, 6, 6, 2)
    x = arena.tensor(F32, (head, heads, tokens))
    pos = arena.tensor(I32, (4 * tokens,))
    x.set(randn(1, tokens, heads, head))
    positions = rng.integers(0, 50, 4 * tokens)
    pos.set(positions[None, None, None, :])
    params = rope_params(n_dims, mode)
    params[11:15] = sections
    dst = arena.tensor(F32, (head, heads, tokens))
    run_ok(host, "ROPE", [x, pos], [dst], params)
    for t in range(tokens):
        at = tuple(int(positions[t + k * tokens]) for k in range(4))
        for h in range(heads):
            expected = ref.mrope_row(x.get()[0, t, h], at, n_dims, mode, sections, 10000.0)
            close(dst.get()[0, t, h], expected, 1e-4)


# -- bounds (issue 27, item 3) ----------------------------------------------------------------


def test_a_zero_stride_tensor_larger_than_its_buffer_is_refused(
    host: HtpHost, arena: Arena, caplog: pytest.LogCaptureFixture
) -> None:
    """The review's batch: a CPY of 2^29 f32 elements of stride 0 over 4 bytes made the
    DSP process allocate until the kernel killed it (here 2^24 of them, 64 MiB, against
    a buffer of about 1 MiB). Each tensor's elements, packed, must fit its buffer from
    its offset: INVAL_PARAMS before the op allocates; broadcast views that fit still run."""
    caplog.set_level(logging.WARNING, logger="npud.sim.htp")
    count = 1 << 24
    src = arena.raw(4, F32, (count,), (0, 0, 0, 0))
    src.set(np.full((1, 1, 1, 1), 7.0))
    dst = arena.raw(4, F32, (count,), (0, 0, 0, 0))
    assert host.run([OpSpec("CPY", [src], [dst])]) == STATUS_INVAL_PARAMS
    assert any("holds 67108864 bytes of elements" in r.getMessage() for r in caplog.records)
    wide = arena.raw(4, F32, (count // 4, 4), (0, 0, 0, 0))  # in ne1 and ne0 at once
    assert host.run([OpSpec("SCALE", [wide], [wide], [f32_bits(2.0), 0])]) == (STATUS_INVAL_PARAMS)
    quantized = arena.raw(18, Q4_0, (32, 1 << 20), (18, 0, 0, 0))  # 18 MiB of blocks over 18 B
    out = arena.tensor(F32, (32,))
    assert host.run([OpSpec("GET_ROWS", [quantized, arena.tensor(I32, (1,))], [out])]) == (
        STATUS_INVAL_PARAMS
    )
    small = arena.raw(4, F32, (16,), (0, 0, 0, 0))  # a broadcast view that fits
    small.set(np.full((1, 1, 1, 1), 7.0))
    copy = arena.tensor(F32, (16,))
    run_ok(host, "CPY", [small], [copy], [])
    close(copy.get(), np.full((1, 1, 1, 16), 7.0), 0)


@pytest.mark.parametrize("driver", ["thread"], indirect=True)  # the bound is patched here
def test_scratch_past_the_bound_is_refused_before_it_is_allocated(
    host: HtpHost, arena: Arena, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ops whose working arrays outgrow their tensors (a weight broadcast to every slice
    of src1, attention's scores, decoded tiles of gathered rows) are refused
    INVAL_PARAMS past MAX_SCRATCH_BYTES, and run within it."""
    from npud.sim.htp import tensors  # patched in this process: the PD runs on its threads

    w = arena.tensor(F32, (64, 64))
    w.set(randn(1, 1, 64, 64))
    x = arena.tensor(F32, (64, 1, 32))  # 32 slices share the weight
    x.set(randn(1, 32, 1, 64))
    dst = arena.tensor(F32, (64, 1, 32))
    dk, heads, rows, n_kv = 8, 8, 16, 64
    q = arena.tensor(F32, (dk, rows, heads))
    q.set(randn(1, heads, rows, dk))
    k, v = arena.tensor(F32, (dk, n_kv, 1)), arena.tensor(F32, (dk, n_kv, 1))
    k.set(randn(1, 1, n_kv, dk))
    v.set(randn(1, 1, n_kv, dk))
    attention = arena.tensor(F32, (dk, heads, rows))
    ops = [
        OpSpec("MUL_MAT", [w, x], [dst]),
        OpSpec("FLASH_ATTN_EXT", [q, k, v], [attention], [f32_bits(0.125), 0, 0]),
    ]
    for op in ops:
        assert host.run([op]) == STATUS_OK
    monkeypatch.setattr(tensors, "MAX_SCRATCH_BYTES", 64 * 1024)
    for op in ops:
        assert host.run([op]) == STATUS_INVAL_PARAMS, op.op


def test_a_pd_past_its_memory_limit_ends_alone() -> None:
    """A PD child is limited to ``pd_memory_limit`` bytes of private memory: an op whose
    working arrays need more (a weight broadcast to 2^14 slices: 512 MiB, within the
    scratch bound, past a 192 MiB limit) ends that PD as a crash does (its queue's wait
    fails AEE_EBADSTATE), while another PD of the same driver, and this process, go on."""
    driver = EmulatedDriver(SimConfig(pd_memory_limit=192 << 20))
    sessions = [FastRpcSession.open(driver, library_path=(DSP_LIBRARY_DIR,)) for _ in range(2)]
    try:
        for session in sessions:
            session.load_shell(DEV_SHELL.read_bytes())
        hosts = [HtpHost(session, CpuQueues(session)) for session in sessions]
        for host in hosts:
            assert host.start() == 0
        greedy, bystander = hosts
        child = driver.pd_pid(sessions[0].fileno())
        assert child is not None
        arena = Arena(greedy, 1 << 20)
        w = arena.tensor(F32, (1, 4096))
        x = arena.tensor(F32, (1, 1, 1 << 14))
        dst = arena.tensor(F32, (4096,))  # the product's rows; its slices do not fit
        greedy.submit([OpSpec("MUL_MAT", [w, x], [dst])])
        assert _gone(child)
        greedy.queues.join_receiver()
        assert greedy.queues.error == AEE_EBADSTATE
        greedy.queues.abandon()
        other = Arena(bystander, 1 << 16)
        y = other.tensor(F32, (8,))
        y.set(np.ones((1, 1, 1, 8)))
        assert bystander.run([OpSpec("SCALE", [y], [y], [f32_bits(2.0), 0])]) == STATUS_OK
        close(y.get(), np.full((1, 1, 1, 8), 2.0), 0)
        bystander.close()
        bystander.queues.close()
    finally:
        for session in sessions:
            session.close()
        driver.shutdown()
    assert driver.statistics().pd_children == 0
