"""npud.idl against the C skels: its sc words, layouts and struct, byte for byte.

The C skels' own tests (test_echo_skel.py, test_portal_qnn_skel.py) pin the
scalars words and lay the buffers out by hand; here the stubs that idl.py
derives from idl/*.idl drive the same host-built libraries, and the struct
layout is compared with the C compiler's.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Final

import pytest

from npud import idl
from tests.emulator.sim_helpers import SC_BUSY, SC_CHECKSUM, SC_ECHO, SC_FILL
from tests.skel.conftest import SKEL_DIR
from tests.skel.portal_qnn_calls import TENSOR_SPEC
from tests.skel.remote_args import Out, SkelLibrary, Slot

ECHO: Final = idl.load("echo")
NPU_TEST: Final = idl.load("npu_test")
PORTAL: Final = idl.load("portal_qnn")

PINNED_WORDS: Final = {
    # What the C skel tests and the emulator tests pin, literally.
    ("echo", "open"): 0x00020001,
    ("echo", "close"): 0x01000010,
    ("echo", "echo"): SC_ECHO,
    ("npu_test", "open"): 0x00020001,
    ("npu_test", "close"): 0x01000010,
    ("npu_test", "fill"): SC_FILL,
    ("npu_test", "checksum"): SC_CHECKSUM,
    ("npu_test", "busy"): SC_BUSY,
    ("npu_test", "fault"): 0x05000000,
    ("portal_qnn", "open"): 0x00020001,
    ("portal_qnn", "close"): 0x01000010,
    ("portal_qnn", "model_load"): 0x02020100,
    ("portal_qnn", "set_input"): 0x03020000,
    ("portal_qnn", "execute"): 0x04010100,
    ("portal_qnn", "get_output"): 0x05010200,
    ("portal_qnn", "model_unload"): 0x06010000,
    ("portal_qnn", "graph_info"): 0x07010300,
    ("portal_qnn", "run"): 0x08020200,
    ("portal_qnn", "last_error"): 0x09010200,
    ("portal_qnn", "graph_name"): 0x0A010200,
    ("portal_qnn", "output_dims"): 0x0B010200,
    ("portal_qnn", "model_ref"): 0x0C010100,
    ("portal_qnn", "chain"): 0x0D030300,
    ("portal_qnn", "run_dims"): 0x0E020300,
}


@pytest.mark.parametrize(("interface", "method"), list(PINNED_WORDS), ids="{0[0]}.{0[1]}".format)
def test_scalars_words_are_the_pinned_ones(interface: str, method: str) -> None:
    assert idl.load(interface).method(method).sc == PINNED_WORDS[interface, method]


def test_every_method_is_pinned() -> None:
    declared = {(i.name, m.name) for i in (ECHO, NPU_TEST, PORTAL) for m in i.methods}
    assert declared == set(PINNED_WORDS)


def _c_layout(skel_out: Path) -> dict[str, int]:
    """sizeof and offsetof of portal_qnn_tensor_spec, as gcc lays out the skel's header."""
    members = ("data_type", "rank", "dims", "bytes", "name")
    program = "\n".join(
        [
            "#include <stddef.h>",
            "#include <stdio.h>",
            '#include "portal_qnn.h"',
            "int main(void) {",
            'printf("size %zu\\n", sizeof(portal_qnn_tensor_spec));',
            'printf("align %zu\\n", _Alignof(portal_qnn_tensor_spec));',
            *(f'printf("{m} %zu\\n", offsetof(portal_qnn_tensor_spec, {m}));' for m in members),
            "return 0; }",
        ]
    )
    source = skel_out / "layout.c"
    source.write_text(program)
    binary = skel_out / "layout"
    include = SKEL_DIR / "include"
    subprocess.run(
        [
            "gcc",
            "-std=c11",
            "-Wall",
            "-Werror",
            f"-I{include}",
            f"-I{include / 'sdk'}",
            f"-I{include / 'qaic'}",
            "-o",
            str(binary),
            str(source),
        ],
        check=True,
    )
    output = subprocess.run([str(binary)], capture_output=True, text=True, check=True).stdout
    return {key: int(value) for key, value in (line.split() for line in output.splitlines())}


def test_tensor_spec_layout_is_the_c_compilers(skel_out: Path) -> None:
    parsed = idl.parse((SKEL_DIR.parent / "idl" / "portal_qnn.idl").read_text())
    spec = parsed.structs["portal_qnn_tensor_spec"]
    c = _c_layout(skel_out)
    assert (spec.size, spec.align) == (c["size"], c["align"]) == (TENSOR_SPEC.size, 4)
    assert {m.name: m.offset for m in spec.members} == {
        name: c[name] for name in ("data_type", "rank", "dims", "bytes", "name")
    }


def _call(skel: SkelLibrary, handle: int, method: idl.Method, **arguments: object) -> idl.Values:
    """Encode with idl.py, run the C skel's invoke entry, decode with idl.py."""
    call = method.encode(**arguments)
    slots: list[Slot] = []
    for data in call.inputs:
        assert isinstance(data, bytes)
        slots.append(data)
    for size in call.outputs:
        assert isinstance(size, int)
        slots.append(Out(size))
    result = skel.invoke(handle, call.sc, slots)
    assert result.rc == 0, f"{method.name} answered {result.rc:#x}"
    return method.decode(result.buffers[len(call.inputs) :])


@pytest.fixture
def portal_handle(portal_skel: SkelLibrary) -> Iterator[int]:
    opened = portal_skel.open("file:///libportal_qnn_skel.so?portal_qnn_skel_handle_invoke")
    handle = opened.handles[2]
    assert opened.rc == 0
    assert handle
    yield handle
    assert portal_skel.close(handle) == 0


def test_stubs_drive_the_c_portal_qnn_skel(
    portal_skel: SkelLibrary, portal_handle: int, fake_models: dict[str, Path]
) -> None:
    def call(name: str, **arguments: object) -> idl.Values:
        return _call(portal_skel, portal_handle, PORTAL.method(name), **arguments)

    loaded = call("model_load", model_uri=str(fake_models["default"]))
    assert dict(loaded) == {"model_index": 0, "num_graphs": 2, "qnn_status": 0}
    info = call("graph_info", model_index=0, graph_index=1, inputs=32, outputs=32)
    assert (info.integer("num_inputs"), info.integer("num_outputs")) == (2, 2)
    inputs, outputs = info.records("inputs"), info.records("outputs")
    assert len(inputs) == len(outputs) == 32
    assert [r.text("name") for r in inputs[:3]] == ["a", "b", ""]
    total = outputs[1]
    assert (total.integer("data_type"), total.integer("rank"), total.integer("bytes")) == (
        0x0132,
        0,
        4,
    )
    assert total.integers("dims") == [0] * 8
    assert inputs[0].integers("dims") == [8, 0, 0, 0, 0, 0, 0, 0]

    call("set_input", model_index=0, graph_index=1, tensor_index=0, data=bytes(range(8)))
    call("set_input", model_index=0, graph_index=1, tensor_index=1, data=[10] * 8)
    assert call("execute", model_index=0, graph_index=1).integer("qnn_status") == 0
    summed = call("get_output", model_index=0, graph_index=1, tensor_index=0, data=8)
    assert summed.integer("data_len") == 8
    assert summed.data("data") == bytes(x + 10 for x in range(8))
    call("model_unload", model_index=0)


def test_stubs_drive_the_c_echo_skel(echo_skel: SkelLibrary) -> None:
    opened = echo_skel.open("file:///libecho_skel.so?echo_skel_handle_invoke")
    handle = opened.handles[2]
    assert handle
    try:
        echoed = _call(echo_skel, handle, ECHO.method("echo"), in_buf=b"hello", out_buf=8)
        assert echoed.data("out_buf") == b"hello\0\0\0"
    finally:
        assert echo_skel.close(handle) == 0
