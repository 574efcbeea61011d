"""The host-built libportal_qnn_skel.so: slot table, model libraries, every index and length check.

The models are the fake model libraries of fake_model.c, loaded by the skel
itself through dlopen (or registered as builtins); every RPC goes through
portal_qnn_skel_handle_invoke with real remote_args.
"""

from __future__ import annotations

import ctypes
import shutil
import struct
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from npu_protocol.aee import AEE
from tests.skel.portal_qnn_calls import (
    EXECUTE,
    GET_OUTPUT,
    GRAPH_INFO,
    GRAPH_NAME,
    LAST_ERROR,
    MODEL_LOAD,
    MODEL_UNLOAD,
    NO_MODEL,
    OUTPUT_DIMS,
    RUN,
    RUN_DIMS,
    SET_INPUT,
    UNTOUCHED_U32,
    Executed,
    Loaded,
    PortalQnn,
    TensorSpec,
    arena,
)
from tests.skel.remote_args import NullBuffer, Out, SkelLibrary, Slot, sc, u32s

QNN_GRAPH_ERROR_INVALID_TENSOR = 6004
QNN_GRAPH_ERROR_FINALIZE_FAILED = 6022
QNN_GRAPH_ERROR_ABORTED = 6031
QNN_DATATYPE_UINT_8 = 0x0108
QNN_DATATYPE_UINT_32 = 0x0132
SPEC_BYTES = 172

NEVER_OPENED = 1 << 63
"""Handles are serial numbers from 1, so this one is never live."""

ADD_INPUT = bytes(range(16))
ADD_ONE = bytes(b + 1 for b in ADD_INPUT)


def live_sets(model: Path) -> int:
    """Compose results of this model library not yet freed (the skel shares the dlopen'ed copy)."""
    counter: Any = ctypes.CDLL(str(model)).fake_model_live_sets
    counter.restype = ctypes.c_int
    return int(counter())


def load(portal: PortalQnn, model: Path) -> int:
    loaded = portal.model_load(str(model))
    assert (loaded.rc, loaded.qnn_status) == (0, 0)
    return loaded.model_index


def test_sc_words_match_the_idl() -> None:
    assert sc(MODEL_LOAD, 2, 1) == 0x02020100
    assert sc(SET_INPUT, 2, 0) == 0x03020000
    assert sc(EXECUTE, 1, 1) == 0x04010100
    assert sc(GET_OUTPUT, 1, 2) == 0x05010200
    assert sc(MODEL_UNLOAD, 1, 0) == 0x06010000
    assert sc(GRAPH_INFO, 1, 3) == 0x07010300
    assert sc(RUN, 2, 2) == 0x08020200
    assert sc(LAST_ERROR, 1, 2) == 0x09010200
    assert sc(GRAPH_NAME, 1, 2) == 0x0A010200
    assert sc(OUTPUT_DIMS, 1, 2) == 0x0B010200
    assert sc(RUN_DIMS, 2, 3) == 0x0E020300
    assert sc(0, 2, 0, 0, 1) == 0x00020001
    assert sc(1, 0, 0, 1, 0) == 0x01000010


def test_load_set_execute_get_unload(portal: PortalQnn, fake_models: dict[str, Path]) -> None:
    model = fake_models["default"]
    before = live_sets(model)
    loaded = portal.model_load(str(model))
    assert loaded == Loaded(rc=0, model_index=0, num_graphs=2, qnn_status=0)
    assert live_sets(model) == before + 1

    assert portal.set_input(0, 0, 0, ADD_INPUT) == 0
    assert portal.execute(0, 0) == Executed(rc=0, qnn_status=0)
    output = portal.get_output(0, 0, 0, 16)
    assert (output.rc, output.data_len, output.data) == (0, 16, ADD_ONE)

    # Graph 1: two inputs, a byte output and a u32 scalar output.
    a, b = bytes(range(8)), bytes([10] * 8)
    assert portal.set_input(0, 1, 0, a) == 0
    assert portal.set_input(0, 1, 1, b) == 0
    assert portal.execute(0, 1).rc == 0
    summed = portal.get_output(0, 1, 0, 8)
    assert summed.data == bytes(x + 10 for x in range(8))
    total = portal.get_output(0, 1, 1, 4)
    assert (total.rc, total.data_len) == (0, 4)
    assert struct.unpack("<I", total.data) == (sum(summed.data),)

    assert portal.model_unload(0) == 0
    assert live_sets(model) == before


def test_inputs_persist_and_larger_capacity_is_zero_filled(
    portal: PortalQnn, fake_models: dict[str, Path]
) -> None:
    index = load(portal, fake_models["default"])
    assert portal.set_input(index, 0, 0, ADD_INPUT) == 0
    assert portal.execute(index, 0).rc == 0
    assert portal.execute(index, 0).rc == 0  # the same input again, no new set_input
    output = portal.get_output(index, 0, 0, 40)
    assert (output.rc, output.data_len) == (0, 16)
    assert output.data == ADD_ONE + bytes(24)


def test_model_index_checks(portal: PortalQnn, fake_models: dict[str, Path]) -> None:
    for index in (4, 5, 0xFFFFFFFF):
        assert portal.set_input(index, 0, 0, ADD_INPUT) == AEE.EBADPARM
        assert portal.execute(index, 0).rc == AEE.EBADPARM
        assert portal.get_output(index, 0, 0, 16).rc == AEE.EBADPARM
        assert portal.model_unload(index) == AEE.EBADPARM
    # In range but never loaded.
    for index in range(4):
        assert portal.set_input(index, 0, 0, ADD_INPUT) == AEE.EBADSTATE
        assert portal.execute(index, 0).rc == AEE.EBADSTATE
        assert portal.get_output(index, 0, 0, 16).rc == AEE.EBADSTATE
        assert portal.model_unload(index) == AEE.EBADSTATE
    index = load(portal, fake_models["default"])
    assert portal.model_unload(index) == 0
    assert portal.model_unload(index) == AEE.EBADSTATE  # double unload
    assert portal.execute(index, 0).rc == AEE.EBADSTATE


def test_graph_name_is_the_librarys_graphname(
    portal: PortalQnn, fake_models: dict[str, Path]
) -> None:
    two = load(portal, fake_models["default"])
    assert portal.graph_name(two, 0) == (0, b"add")
    assert portal.graph_name(two, 1) == (0, b"add_pair")
    assert portal.graph_name(two, 1, capacity=3) == (0, b"add")  # cut to the capacity
    assert portal.graph_name(two, 2)[0] == AEE.EBADPARM
    assert portal.graph_name(4, 0)[0] == AEE.EBADPARM
    assert portal.model_unload(two) == 0
    assert portal.graph_name(two, 0)[0] == AEE.EBADSTATE
    # A badly marshalled call: the capacity says more than the buffer holds.
    result = portal.invoke(sc(GRAPH_NAME, 1, 2), [u32s(two, 0, 16), Out(4), Out(8)])
    assert result.rc == AEE.EBADPARM


def test_graph_index_checks(portal: PortalQnn, fake_models: dict[str, Path]) -> None:
    two = load(portal, fake_models["default"])
    eight = load(portal, fake_models["eight_graphs"])
    for graph in (2, 7, 8, 0xFFFFFFFF):  # the two-graph model
        assert portal.set_input(two, graph, 0, ADD_INPUT) == AEE.EBADPARM
        assert portal.execute(two, graph).rc == AEE.EBADPARM
        assert portal.get_output(two, graph, 0, 16).rc == AEE.EBADPARM
    # The eight-graph model: index 7 is the last graph (it adds 8), 8 is out of range.
    assert portal.set_input(eight, 7, 0, ADD_INPUT) == 0
    assert portal.execute(eight, 7).rc == 0
    assert portal.get_output(eight, 7, 0, 16).data == bytes(b + 8 for b in ADD_INPUT)
    assert portal.set_input(eight, 8, 0, ADD_INPUT) == AEE.EBADPARM
    assert portal.execute(eight, 8).rc == AEE.EBADPARM


def test_tensor_index_and_length_checks(portal: PortalQnn, fake_models: dict[str, Path]) -> None:
    index = load(portal, fake_models["default"])
    assert portal.set_input(index, 0, 1, ADD_INPUT) == AEE.EBADPARM  # graph 0 has one input
    assert portal.set_input(index, 1, 2, bytes(8)) == AEE.EBADPARM  # graph 1 has two
    assert portal.set_input(index, 0, 0xFFFFFFFF, ADD_INPUT) == AEE.EBADPARM
    assert portal.set_input(index, 0, 0, ADD_INPUT[:15]) == AEE.EBADSIZE
    assert portal.set_input(index, 0, 0, ADD_INPUT + b"x") == AEE.EBADSIZE
    assert portal.set_input(index, 0, 0, b"") == AEE.EBADSIZE

    assert portal.execute(index, 0).rc == AEE.ENOTINITIALIZED  # no input set yet
    assert portal.get_output(index, 0, 0, 16).rc == AEE.ENOTINITIALIZED  # nothing executed
    assert portal.set_input(index, 1, 0, bytes(8)) == 0
    assert portal.execute(index, 1).rc == AEE.ENOTINITIALIZED  # input 1 of graph 1 missing

    assert portal.set_input(index, 0, 0, ADD_INPUT) == 0
    assert portal.execute(index, 0).rc == 0
    assert portal.get_output(index, 0, 1, 16).rc == AEE.EBADPARM  # one output only
    too_small = portal.get_output(index, 0, 0, 15)
    assert too_small.rc == AEE.EBUFFERTOOSMALL
    assert too_small.data_len == UNTOUCHED_U32  # rout values are written only on success


def test_run_is_set_inputs_execute_get_outputs_in_one_call(
    portal: PortalQnn, fake_models: dict[str, Path]
) -> None:
    index = load(portal, fake_models["default"])
    # Graph 0: one 16-byte input and output, each padded to 64 in its arena.
    ran = portal.run(index, 0, arena(ADD_INPUT), 64)
    assert (ran.rc, ran.qnn_status, ran.outputs) == (0, 0, arena(ADD_ONE))
    # Graph 1: inputs at 0 and 64; outputs "sum" (8 bytes) at 0 and "total" (u32) at 64.
    a, b = bytes(range(8)), bytes([10] * 8)
    ran = portal.run(index, 1, arena(a, b), 200)
    summed = bytes(x + 10 for x in range(8))
    total = struct.pack("<I", sum(summed))
    assert (ran.rc, ran.qnn_status) == (0, 0)
    assert ran.outputs == arena(summed, total) + bytes(72)  # the capacity past the arena: zeros
    # The model's state is as after set_input + execute: the seed-level calls agree.
    assert portal.get_output(index, 1, 0, 8).data == summed
    assert portal.execute(index, 0).rc == 0
    assert portal.get_output(index, 0, 0, 16).data == ADD_ONE
    assert portal.model_unload(index) == 0


def test_output_dims_and_run_dims_report_the_shapes_graph_execute_left(
    portal: PortalQnn, fake_models: dict[str, Path]
) -> None:
    """Methods 11 and 12: each output's rank and dimensions as graphExecute left them in
    its record (a dynamic output's produced ones); a record past its buffer is refused."""
    index = load(portal, fake_models["dynamic"])
    assert portal.output_dims(index, 0)[0] == AEE.ENOTINITIALIZED  # no run yet
    whole = [2, 4, 4, *[0] * 6]
    assert portal.set_input(index, 0, 0, ADD_INPUT) == 0
    assert portal.execute(index, 0).rc == 0
    assert portal.output_dims(index, 0) == (0, 1, whole + [0] * 9)  # the rest zero-filled
    assert portal.output_dims(index, 0, capacity=8)[0] == AEE.EBUFFERTOOSMALL
    assert portal.output_dims(index, 2)[0] == AEE.EBADPARM
    assert portal.output_dims(1, 0)[0] == AEE.EBADSTATE
    shrunk = bytes([0xEE]) + ADD_INPUT[1:]
    ran, count, dims = portal.run_dims(index, 0, arena(shrunk), 64)
    assert (ran.rc, ran.qnn_status, count) == (0, 0, 1)
    assert dims == [2, 2, 4, *[0] * 6] + [0] * 9
    assert ran.outputs == arena(bytes(x + 1 for x in shrunk[:8]))  # 8 bytes produced
    assert portal.output_dims(index, 0)[2][:3] == [2, 2, 4]
    ran, count, dims = portal.run_dims(index, 0, arena(ADD_INPUT), 64, dims=9)
    assert (ran.rc, count, dims) == (0, 1, whole)  # restored to the composed record
    # Checks before the graph runs: the shapes of the last run stay.
    refused, _, _ = portal.run_dims(index, 0, arena(shrunk), 64, dims=8)
    assert refused.rc == AEE.EBUFFERTOOSMALL
    assert portal.run_dims(index, 0, bytes(16), 64)[0].rc == AEE.EBADSIZE
    assert portal.output_dims(index, 0)[2][:3] == [2, 4, 4]
    for past in (0xED, 0xEC):  # [8, 4] of 16 bytes; rank 9
        grown, _, _ = portal.run_dims(index, 0, arena(bytes([past]) + ADD_INPUT[1:]), 64)
        assert grown.rc == AEE.EINVALIDFORMAT
        assert portal.output_dims(index, 0)[0] == AEE.ENOTINITIALIZED
    aborted, count, dims = portal.run_dims(index, 0, arena(bytes([0xFF] * 16)), 64)
    assert (aborted.rc, aborted.qnn_status) == (0, QNN_GRAPH_ERROR_ABORTED)
    assert (count, dims) == (0, [0] * 18)
    assert portal.run_dims(index, 2, arena(ADD_INPUT), 64)[0].rc == AEE.EBADPARM
    # Badly marshalled: dims' capacity (u32s) says more than its buffer holds, wrong counts.
    short = portal.invoke(sc(OUTPUT_DIMS, 1, 2), [u32s(index, 0, 9), Out(4), Out(32)])
    assert short.rc == AEE.EBADPARM
    slots: list[bytes | Out] = [u32s(index, 0, 64, 64, 9), arena(ADD_INPUT), Out(8), Out(64)]
    assert portal.invoke(sc(RUN_DIMS, 2, 2), slots).rc == AEE.EBADPARM
    slots = [u32s(index, 0, 64, 64, 9), arena(ADD_INPUT), Out(4), Out(64), Out(36)]
    assert portal.invoke(sc(RUN_DIMS, 2, 3), slots).rc == AEE.EBADPARM  # primROut of 1
    assert portal.model_unload(index) == 0


def test_a_fixed_graphs_output_dims_are_graph_infos(
    portal: PortalQnn, fake_models: dict[str, Path]
) -> None:
    index = load(portal, fake_models["default"])
    a, b = bytes(range(8)), bytes([10] * 8)
    ran, count, dims = portal.run_dims(index, 1, arena(a, b), 128)
    assert (ran.rc, ran.qnn_status, count) == (0, 0, 2)
    infos = portal.graph_info(index, 1)
    expected = []
    for spec in infos.outputs[:2]:
        expected += [len(spec.dims), *spec.dims, *[0] * (8 - len(spec.dims))]
    assert dims == expected


def test_run_checks_its_arenas(portal: PortalQnn, fake_models: dict[str, Path]) -> None:
    index = load(portal, fake_models["default"])
    for length in (0, 16, 63, 65, 128):
        assert portal.run(index, 0, bytes(length), 64).rc == AEE.EBADSIZE
    too_small = portal.run(index, 0, arena(ADD_INPUT), 63)
    assert (too_small.rc, too_small.qnn_status) == (AEE.EBUFFERTOOSMALL, UNTOUCHED_U32)
    assert portal.run(index, 2, arena(ADD_INPUT), 64).rc == AEE.EBADPARM  # two graphs
    assert portal.run(4, 0, arena(ADD_INPUT), 64).rc == AEE.EBADPARM
    assert portal.run(1, 0, arena(ADD_INPUT), 64).rc == AEE.EBADSTATE  # an empty slot
    # Nothing above ran the graph: there are no outputs yet.
    assert portal.get_output(index, 0, 0, 16).rc == AEE.ENOTINITIALIZED


def test_run_failing_in_qnn_writes_no_outputs(
    portal: PortalQnn, fake_models: dict[str, Path]
) -> None:
    index = load(portal, fake_models["default"])
    assert portal.run(index, 0, arena(ADD_INPUT), 64).rc == 0
    failed = portal.run(index, 0, arena(b"\xff" + ADD_INPUT[1:]), 64)
    assert (failed.rc, failed.qnn_status) == (0, QNN_GRAPH_ERROR_ABORTED)
    assert failed.outputs == bytes([0xA5]) * 64  # untouched (remote_args fills outputs)
    assert portal.get_output(index, 0, 0, 16).rc == AEE.ENOTINITIALIZED


def test_qnn_execute_failure_reports_qnn_status_and_invalidates_outputs(
    portal: PortalQnn, fake_models: dict[str, Path]
) -> None:
    index = load(portal, fake_models["default"])
    assert portal.set_input(index, 0, 0, ADD_INPUT) == 0
    assert portal.execute(index, 0).rc == 0
    assert portal.set_input(index, 0, 0, b"\xff" + ADD_INPUT[1:]) == 0
    failed = portal.execute(index, 0)
    assert (failed.rc, failed.qnn_status) == (0, QNN_GRAPH_ERROR_ABORTED)
    assert portal.get_output(index, 0, 0, 16).rc == AEE.ENOTINITIALIZED


def test_last_error_says_why_the_models_last_execute_failed(
    portal: PortalQnn, fake_models: dict[str, Path]
) -> None:
    index = load(portal, fake_models["default"])
    other = load(portal, fake_models["default"])
    assert portal.last_error(index) == (0, b"")  # nothing failed yet
    assert portal.run(index, 0, arena(b"\xff" + ADD_INPUT[1:]), 64).qnn_status != 0
    reason = f"graphExecute of graph 0 failed: QNN error {QNN_GRAPH_ERROR_ABORTED}".encode()
    assert portal.last_error(index) == (0, reason)
    assert portal.last_error(index, capacity=8) == (0, reason[:8])  # cut to the capacity
    assert portal.last_error(other) == (0, b"")  # a model's reason is its own
    assert portal.run(index, 0, arena(ADD_INPUT), 64).qnn_status == 0
    assert portal.last_error(index) == (0, b"")  # a success clears it
    assert portal.set_input(index, 0, 0, b"\xff" + ADD_INPUT[1:]) == 0
    assert portal.execute(index, 0).qnn_status == QNN_GRAPH_ERROR_ABORTED
    assert portal.last_error(index) == (0, reason)
    assert portal.last_error(4)[0] == AEE.EBADPARM
    assert portal.model_unload(index) == 0
    assert portal.last_error(index)[0] == AEE.EBADSTATE  # an unloaded slot keeps nothing


def test_slot_table_full_and_reuse(portal: PortalQnn, fake_models: dict[str, Path]) -> None:
    model = fake_models["default"]
    before = live_sets(model)
    assert [load(portal, model) for _ in range(4)] == [0, 1, 2, 3]
    full = portal.model_load(str(model))
    assert (full.rc, full.model_index) == (AEE.EOUTOFHANDLES, UNTOUCHED_U32)
    assert live_sets(model) == before + 4  # the fifth load ran no model code
    assert portal.model_unload(2) == 0
    assert load(portal, model) == 2
    for index in range(4):
        assert portal.model_unload(index) == 0
    assert live_sets(model) == before


def test_close_unloads_every_model(portal_skel: SkelLibrary, fake_models: dict[str, Path]) -> None:
    model = fake_models["default"]
    before = live_sets(model)
    opened = portal_skel.open("portal_qnn")
    handle = opened.handles[2]
    assert opened.rc == 0
    assert handle
    session = PortalQnn(portal_skel, handle)
    load(session, model)
    load(session, model)
    assert live_sets(model) == before + 2
    assert portal_skel.close(handle) == 0
    assert live_sets(model) == before
    assert session.execute(0, 0).rc == AEE.EINVHANDLE
    assert session.model_load(str(model)).rc == AEE.EINVHANDLE


def test_slots_belong_to_their_handle(
    portal: PortalQnn, portal_skel: SkelLibrary, fake_models: dict[str, Path]
) -> None:
    load(portal, fake_models["default"])
    opened = portal_skel.open("portal_qnn")
    other_handle = opened.handles[2]
    assert other_handle
    other = PortalQnn(portal_skel, other_handle)
    assert other.execute(0, 0).rc == AEE.EBADSTATE
    assert portal_skel.close(other_handle) == 0


@pytest.mark.parametrize(
    ("variant", "code"),
    [
        ("nine_graphs", AEE.EINVALIDFORMAT),
        ("unknown_type", AEE.EINVALIDFORMAT),
        ("no_free", AEE.ENOSUCHSYMBOL),
    ],
)
def test_unusable_model_libraries_are_refused(
    portal: PortalQnn, fake_models: dict[str, Path], variant: str, code: int
) -> None:
    model = fake_models[variant]
    loaded = portal.model_load(str(model))
    assert loaded.rc == code
    assert loaded.model_index == UNTOUCHED_U32
    if variant != "no_free":
        assert live_sets(model) == 0  # what compose returned was given back
    assert portal.model_unload(0) == AEE.EBADSTATE  # no slot was taken


@pytest.mark.parametrize(
    ("variant", "qnn_status"),
    [
        ("compose_fails", QNN_GRAPH_ERROR_INVALID_TENSOR),
        ("finalize_fails", QNN_GRAPH_ERROR_FINALIZE_FAILED),
    ],
)
def test_qnn_errors_while_loading(
    portal: PortalQnn, fake_models: dict[str, Path], variant: str, qnn_status: int
) -> None:
    model = fake_models[variant]
    loaded = portal.model_load(str(model))
    assert (loaded.rc, loaded.model_index, loaded.num_graphs, loaded.qnn_status) == (
        0,
        NO_MODEL,
        0,
        qnn_status,
    )
    assert live_sets(model) == 0
    assert portal.model_unload(0) == AEE.EBADSTATE
    reason = f"composing or finalizing the model failed: QNN error {qnn_status}".encode()
    assert portal.last_error(NO_MODEL) == (0, reason)


def test_missing_library(portal: PortalQnn, tmp_path: Path, fake_models: dict[str, Path]) -> None:
    assert portal.last_error(NO_MODEL) == (0, b"")  # no load has failed on this handle
    assert portal.model_load(str(tmp_path / "libnothere.so")).rc == AEE.EUNABLETOLOAD
    reason = f"model_load refused: AEE error {AEE.EUNABLETOLOAD & 0xFFFFFFFF:#010x}".encode()
    assert portal.last_error(NO_MODEL) == (0, reason)
    load(portal, fake_models["default"])
    assert portal.last_error(NO_MODEL) == (0, b"")  # a load that succeeds forgets it
    not_elf = tmp_path / "libnot_elf.so"
    not_elf.write_bytes(b"not an ELF file")
    assert portal.model_load(str(not_elf)).rc == AEE.EUNABLETOLOAD


def test_model_uri_checks(portal: PortalQnn) -> None:
    assert portal.model_load("").rc == AEE.EBADPARM
    assert portal.model_load("x" * 511).rc == AEE.EUNABLETOLOAD  # longest accepted, no such file
    assert portal.model_load("x" * 512).rc == AEE.EBADPARM
    inner_nul = portal.model_load(b"lib\0evil.so")
    assert inner_nul.rc == AEE.EBADPARM


def _register(skel: SkelLibrary, model: Path, name: bytes) -> int:
    library = ctypes.CDLL(str(model))
    register = skel.function(
        "portal_qnn_register_builtin",
        ctypes.c_int,
        ctypes.c_char_p,
        ctypes.c_void_p,
        ctypes.c_void_p,
    )
    compose = ctypes.cast(library.QnnModel_composeGraphs, ctypes.c_void_p)
    free = ctypes.cast(library.QnnModel_freeGraphsInfo, ctypes.c_void_p)
    return int(register(name, compose, free))


def test_builtin_models(
    portal: PortalQnn, portal_skel: SkelLibrary, fake_models: dict[str, Path]
) -> None:
    model = fake_models["default"]
    before = live_sets(model)
    assert _register(portal_skel, model, b"fake-add.v1") == 0
    assert _register(portal_skel, model, b"fake-add.v1") == AEE.EALREADYLOADED
    loaded = portal.model_load("builtin:fake-add.v1")
    assert (loaded.rc, loaded.num_graphs, loaded.qnn_status) == (0, 2, 0)
    assert portal.set_input(loaded.model_index, 0, 0, ADD_INPUT) == 0
    assert portal.execute(loaded.model_index, 0).rc == 0
    assert portal.get_output(loaded.model_index, 0, 0, 16).data == ADD_ONE
    assert portal.model_unload(loaded.model_index) == 0
    assert live_sets(model) == before
    assert portal.model_load("builtin:not-registered").rc == AEE.ERESOURCENOTFOUND
    assert portal.model_load("builtin:").rc == AEE.ERESOURCENOTFOUND


@pytest.mark.parametrize("name", [b"", b"has space", b"slash/name", b"x" * 64])
def test_builtin_names_are_checked(
    portal_skel: SkelLibrary, fake_models: dict[str, Path], name: bytes
) -> None:
    assert _register(portal_skel, fake_models["default"], name) == AEE.EBADPARM


def test_builtin_registry_is_bounded(
    skel_out: Path, fake_models: dict[str, Path], tmp_path: Path
) -> None:
    # A copy under another path is a separate instance with an empty registry.
    copy = tmp_path / "libportal_qnn_skel_copy.so"
    shutil.copyfile(skel_out / "libportal_qnn_skel.so", copy)
    fresh = SkelLibrary(copy, "portal_qnn")
    model = fake_models["default"]
    assert [_register(fresh, model, f"m{i}".encode()) for i in range(8)] == [0] * 8
    assert _register(fresh, model, b"m8") == AEE.EOUTOFHANDLES


def test_load_from_function_pointers(
    portal: PortalQnn, portal_skel: SkelLibrary, fake_models: dict[str, Path]
) -> None:
    model = fake_models["eight_graphs"]
    library = ctypes.CDLL(str(model))
    uint_p = ctypes.POINTER(ctypes.c_uint)
    load_functions = portal_skel.function(
        "portal_qnn_model_load_functions",
        ctypes.c_int,
        ctypes.c_uint64,
        ctypes.c_void_p,
        ctypes.c_void_p,
        uint_p,
        uint_p,
        uint_p,
    )
    compose = ctypes.cast(library.QnnModel_composeGraphs, ctypes.c_void_p)
    free = ctypes.cast(library.QnnModel_freeGraphsInfo, ctypes.c_void_p)
    index, graphs, status = ctypes.c_uint(), ctypes.c_uint(), ctypes.c_uint()
    refs = (ctypes.byref(index), ctypes.byref(graphs), ctypes.byref(status))
    assert load_functions(portal.handle, compose, free, *refs) == 0
    assert (index.value, graphs.value, status.value) == (0, 8, 0)
    assert portal.set_input(0, 3, 0, ADD_INPUT) == 0
    assert portal.execute(0, 3).rc == 0
    assert portal.get_output(0, 3, 0, 16).data == bytes(b + 4 for b in ADD_INPUT)
    assert load_functions(portal.handle, None, free, *refs) == AEE.EBADPARM
    assert load_functions(NEVER_OPENED, compose, free, *refs) == AEE.EINVHANDLE
    assert portal.model_unload(0) == 0


def test_graph_info_describes_every_tensor(portal: PortalQnn, fake_models: dict[str, Path]) -> None:
    index = load(portal, fake_models["default"])
    add = portal.graph_info(index, 0)
    assert (add.rc, add.num_inputs, add.num_outputs) == (0, 1, 1)
    assert add.inputs[0] == TensorSpec(QNN_DATATYPE_UINT_8, (4, 4), 16, b"in")
    assert add.outputs[0] == TensorSpec(QNN_DATATYPE_UINT_8, (4, 4), 16, b"out")
    # Records past the tensor count are zeroed, not left as they were.
    assert add.raw[0][SPEC_BYTES:] == bytes(31 * SPEC_BYTES)
    assert add.raw[1][SPEC_BYTES:] == bytes(31 * SPEC_BYTES)
    pair = portal.graph_info(index, 1, inputs=2, outputs=2)
    assert (pair.rc, pair.num_inputs, pair.num_outputs) == (0, 2, 2)
    assert pair.inputs == (
        TensorSpec(QNN_DATATYPE_UINT_8, (8,), 8, b"a"),
        TensorSpec(QNN_DATATYPE_UINT_8, (8,), 8, b"b"),
    )
    assert pair.outputs == (
        TensorSpec(QNN_DATATYPE_UINT_8, (8,), 8, b"sum"),
        TensorSpec(QNN_DATATYPE_UINT_32, (), 4, b"total"),  # rank 0: a scalar
    )
    # The dims past the rank are zero: the raw record of the scalar output.
    assert pair.raw[1][SPEC_BYTES + 4 : SPEC_BYTES + 40] == bytes(36)


def test_graph_info_checks(portal: PortalQnn, fake_models: dict[str, Path]) -> None:
    assert portal.graph_info(0, 0).rc == AEE.EBADSTATE
    index = load(portal, fake_models["default"])
    assert portal.graph_info(4, 0).rc == AEE.EBADPARM
    assert portal.graph_info(index, 2).rc == AEE.EBADPARM
    short = portal.graph_info(index, 1, inputs=1, outputs=2)
    assert (short.rc, short.num_inputs) == (AEE.EBUFFERTOOSMALL, UNTOUCHED_U32)
    assert portal.graph_info(index, 1, inputs=2, outputs=1).rc == AEE.EBUFFERTOOSMALL
    assert portal.graph_info(index, 0, inputs=0, outputs=0).rc == AEE.EBUFFERTOOSMALL
    assert portal.model_unload(index) == 0
    assert portal.graph_info(index, 0).rc == AEE.EBADSTATE


def test_tensor_names_up_to_127_bytes(portal: PortalQnn, fake_models: dict[str, Path]) -> None:
    longest = load(portal, fake_models["longest_name"])
    assert portal.graph_info(longest, 0).inputs[0].name == b"n" * 127
    unnamed = load(portal, fake_models["unnamed"])
    assert portal.graph_info(unnamed, 0).inputs[0].name == b""
    too_long = portal.model_load(str(fake_models["long_name"]))
    assert (too_long.rc, too_long.model_index) == (AEE.EINVALIDFORMAT, UNTOUCHED_U32)
    assert live_sets(fake_models["long_name"]) == 0  # what compose returned was given back


def test_graph_names_up_to_127_bytes(portal: PortalQnn, fake_models: dict[str, Path]) -> None:
    longest = load(portal, fake_models["longest_graph_name"])
    assert portal.graph_name(longest, 0) == (0, b"g" * 127)
    unnamed = load(portal, fake_models["unnamed_graph"])
    assert portal.graph_name(unnamed, 0) == (0, b"")
    too_long = portal.model_load(str(fake_models["long_graph_name"]))
    assert (too_long.rc, too_long.model_index) == (AEE.EINVALIDFORMAT, UNTOUCHED_U32)
    assert live_sets(fake_models["long_graph_name"]) == 0  # what compose returned was given back


BAD_PORTAL_CALLS: list[tuple[str, int, list[Slot]]] = [
    ("load: no primROut", sc(MODEL_LOAD, 2, 0), [u32s(2), b"x\0"]),
    ("load: primROut too small", sc(MODEL_LOAD, 2, 1), [u32s(2), b"x\0", Out(8)]),
    ("load: primIn too long", sc(MODEL_LOAD, 2, 1), [u32s(2, 0), b"x\0", Out(12)]),
    ("load: uri length lies", sc(MODEL_LOAD, 2, 1), [u32s(5), b"x\0", Out(12)]),
    ("load: uri NULL", sc(MODEL_LOAD, 2, 1), [u32s(2), NullBuffer(2), Out(12)]),
    ("set: no data buffer", sc(SET_INPUT, 1, 0), [u32s(0, 0, 0, 16)]),
    ("set: primIn short", sc(SET_INPUT, 2, 0), [u32s(0, 0, 16), bytes(16)]),
    ("set: data length lies", sc(SET_INPUT, 2, 0), [u32s(0, 0, 0, 16), bytes(15)]),
    ("set: data NULL", sc(SET_INPUT, 2, 0), [u32s(0, 0, 0, 16), NullBuffer(16)]),
    ("execute: no primROut", sc(EXECUTE, 1, 0), [u32s(0, 0)]),
    ("execute: primROut too big", sc(EXECUTE, 1, 1), [u32s(0, 0), Out(8)]),
    ("execute: primIn short", sc(EXECUTE, 1, 1), [u32s(0), Out(4)]),
    ("get: one output", sc(GET_OUTPUT, 1, 1), [u32s(0, 0, 0, 16), Out(16)]),
    ("get: capacity lies", sc(GET_OUTPUT, 1, 2), [u32s(0, 0, 0, 16), Out(4), Out(8)]),
    ("get: primROut missing room", sc(GET_OUTPUT, 1, 2), [u32s(0, 0, 0, 16), Out(0), Out(16)]),
    ("get: data NULL", sc(GET_OUTPUT, 1, 2), [u32s(0, 0, 0, 16), Out(4), NullBuffer(16)]),
    ("run: no outputs buffer", sc(RUN, 2, 1), [u32s(0, 0, 64, 64), bytes(64), Out(4)]),
    ("run: inputs length lies", sc(RUN, 2, 2), [u32s(0, 0, 64, 64), bytes(63), Out(4), Out(64)]),
    ("run: capacity lies", sc(RUN, 2, 2), [u32s(0, 0, 64, 64), bytes(64), Out(4), Out(32)]),
    ("run: primROut missing", sc(RUN, 2, 2), [u32s(0, 0, 64, 64), bytes(64), Out(0), Out(64)]),
    ("run: inputs NULL", sc(RUN, 2, 2), [u32s(0, 0, 64, 64), NullBuffer(64), Out(4), Out(64)]),
    ("run: primIn short", sc(RUN, 2, 2), [u32s(0, 0, 64), bytes(64), Out(4), Out(64)]),
    ("unload: extra buffer", sc(MODEL_UNLOAD, 2, 0), [u32s(0), b"x"]),
    ("unload: primIn long", sc(MODEL_UNLOAD, 1, 0), [u32s(0, 0)]),
    ("unload: in handle", sc(MODEL_UNLOAD, 1, 0, 1, 0), [u32s(0)]),
    ("info: no spec buffers", sc(GRAPH_INFO, 1, 1), [u32s(0, 0, 1, 1), Out(8)]),
    (
        "info: capacity lies",
        sc(GRAPH_INFO, 1, 3),
        [u32s(0, 0, 2, 1), Out(8), Out(SPEC_BYTES), Out(SPEC_BYTES)],
    ),
    (
        "info: records cut short",
        sc(GRAPH_INFO, 1, 3),
        [u32s(0, 0, 1, 1), Out(8), Out(SPEC_BYTES - 4), Out(SPEC_BYTES)],
    ),
    (
        "info: primROut short",
        sc(GRAPH_INFO, 1, 3),
        [u32s(0, 0, 1, 1), Out(4), Out(SPEC_BYTES), Out(SPEC_BYTES)],
    ),
    (
        "info: count overflows",
        sc(GRAPH_INFO, 1, 3),
        [u32s(0, 0, 0x80000000, 1), Out(8), NullBuffer(0), Out(SPEC_BYTES)],
    ),
    (
        "info: specs NULL",
        sc(GRAPH_INFO, 1, 3),
        [u32s(0, 0, 1, 1), Out(8), NullBuffer(SPEC_BYTES), Out(SPEC_BYTES)],
    ),
]


@pytest.mark.parametrize(
    ("scalars", "slots"),
    [(s, c) for _, s, c in BAD_PORTAL_CALLS],
    ids=[n for n, *_ in BAD_PORTAL_CALLS],
)
def test_badly_marshalled_calls_have_no_effect(
    portal: PortalQnn, fake_models: dict[str, Path], scalars: int, slots: list[Slot]
) -> None:
    index = load(portal, fake_models["default"])
    assert index == 0
    assert portal.set_input(0, 0, 0, ADD_INPUT) == 0
    assert portal.execute(0, 0).rc == 0

    assert portal.skel.invoke(portal.handle, scalars, slots).rc == AEE.EBADPARM

    # Model 0 is still loaded with its input and output: nothing ran.
    output = portal.get_output(0, 0, 0, 16)
    assert (output.rc, output.data) == (0, ADD_ONE)
    assert portal.model_unload(0) == 0


@pytest.mark.parametrize("method", [13, 30, 31])
def test_unknown_method(portal: PortalQnn, method: int) -> None:
    assert portal.skel.invoke(portal.handle, sc(method, 1, 0), [u32s(0)]).rc == AEE.EUNSUPPORTED


def test_calls_on_a_handle_that_is_not_open(
    portal_skel: SkelLibrary, fake_models: dict[str, Path]
) -> None:
    stale = PortalQnn(portal_skel, NEVER_OPENED)
    assert stale.model_load(str(fake_models["default"])).rc == AEE.EINVHANDLE
    assert stale.set_input(0, 0, 0, ADD_INPUT) == AEE.EINVHANDLE
    assert stale.execute(0, 0).rc == AEE.EINVHANDLE
    assert stale.get_output(0, 0, 0, 16).rc == AEE.EINVHANDLE
    assert stale.model_unload(0) == AEE.EINVHANDLE
    assert stale.run(0, 0, arena(ADD_INPUT), 64).rc == AEE.EINVHANDLE
    assert portal_skel.close(NEVER_OPENED) == AEE.EINVHANDLE


def _open(skel: SkelLibrary) -> PortalQnn:
    opened = skel.open("portal_qnn")
    assert opened.rc == 0
    handle = opened.handles[2]
    assert handle
    return PortalQnn(skel, handle)


def test_close_waits_for_a_running_call_while_other_handles_carry_on(
    portal_skel: SkelLibrary, fake_models: dict[str, Path]
) -> None:
    gated = fake_models["gated"]
    gate: Any = ctypes.CDLL(str(gated))
    gate.fake_model_waiting.restype = ctypes.c_int
    busy, other = _open(portal_skel), _open(portal_skel)
    load(busy, gated)
    load(other, fake_models["default"])
    assert busy.set_input(0, 0, 0, ADD_INPUT) == 0
    assert other.set_input(0, 0, 0, ADD_INPUT) == 0

    results: dict[str, object] = {}

    def call(name: str, fn: Callable[[], object]) -> threading.Thread:
        thread = threading.Thread(target=lambda: results.update({name: fn()}))
        thread.start()
        return thread

    threads = [call("execute", lambda: busy.execute(0, 0))]
    try:
        while gate.fake_model_waiting() == 0:  # the call is inside graphExecute
            time.sleep(0.001)
        # A second call on the busy handle queues behind the first...
        threads.append(call("queued", lambda: busy.set_input(0, 0, 0, ADD_INPUT)))
        time.sleep(0.05)
        # ...and neither of them holds up a call on another handle.
        elsewhere = call("elsewhere", lambda: other.execute(0, 0))
        threads.append(elsewhere)
        elsewhere.join(5)
        assert results.get("elsewhere") == Executed(rc=0, qnn_status=0)
        threads.append(call("close", lambda: portal_skel.close(busy.handle)))
        threads[-1].join(0.2)
        assert "close" not in results  # close waits while a call still uses the handle
    finally:
        gate.fake_model_open_gate()
        for thread in threads:
            thread.join()
    assert results["execute"] == Executed(rc=0, qnn_status=0)
    # The queued call ran before close took the handle, or found it closed: both are right.
    assert results["queued"] in (0, AEE.EINVHANDLE)
    assert results["close"] == 0
    assert busy.execute(0, 0).rc == AEE.EINVHANDLE
    assert portal_skel.close(other.handle) == 0
