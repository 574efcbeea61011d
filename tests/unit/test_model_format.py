"""The model-format sniffer: what each kind of file is called, and what each backend refuses."""

from __future__ import annotations

import os
import struct
from collections.abc import Iterator
from pathlib import Path

import pytest

from npud.fastrpc.stubs.model_format import ModelFileError, ModelFormat, check_model_file, sniff
from npud.formats import graph_pack
from tests.emulator import onnx_models


def elf(*, elf_class: int = 1, data: int = 1, e_type: int = 3, machine: int = 164) -> bytes:
    ident = b"\x7fELF" + bytes([elf_class, data, 1]) + bytes(9)
    endian = "<" if data == 1 else ">"
    return ident + struct.pack(endian + "HH", e_type, machine) + bytes(44)


@pytest.fixture
def fds() -> Iterator[list[int]]:
    """Descriptors the test opened; closed at the end."""
    opened: list[int] = []
    yield opened
    for fd in opened:
        os.close(fd)


def _fd(tmp_path: Path, fds: list[int], data: bytes) -> int:
    path = tmp_path / f"file{len(fds)}"
    path.write_bytes(data)
    fds.append(os.open(path, os.O_RDONLY))
    return fds[-1]


@pytest.mark.parametrize(
    ("data", "model_format", "description"),
    [
        (elf(), ModelFormat.QNN_LIBRARY, "an ELF shared object for Hexagon (32-bit)"),
        (elf(e_type=2), None, "an ELF executable for Hexagon (32-bit)"),
        (elf(elf_class=2, machine=62), None, "an ELF shared object for x86-64 (64-bit)"),
        (elf(data=2, machine=183), None, "an ELF shared object for AArch64 (32-bit)"),
        (b"\x7fELF\x01", None, "a truncated ELF file"),
        (b"\0\0\0\0TFL3" + bytes(8), None, "a TensorFlow Lite model"),
        (b"GGUF\x03\0\0\0", None, "a GGUF model (llama.cpp)"),
        (b"PK\x03\x04" + bytes(30), None, "a ZIP archive (a PyTorch checkpoint?)"),
        (struct.pack("<Q", 20) + b'{"a": 1}', None, "a safetensors file"),
        (b"name,value\n1,2\n", None, "a text file"),
        (bytes([0x89, 0x50, 0xFF, 0x00]), None, "data of an unknown format"),
    ],
)
def test_what_a_file_is(
    tmp_path: Path,
    fds: list[int],
    data: bytes,
    model_format: ModelFormat | None,
    description: str,
) -> None:
    sniffed = sniff(_fd(tmp_path, fds, data))
    assert (sniffed.format, sniffed.description, sniffed.size) == (
        model_format,
        description,
        len(data),
    )


def test_onnx_models_are_walked_not_read(tmp_path: Path, fds: list[int]) -> None:
    model = onnx_models.add_one()
    sniffed = sniff(_fd(tmp_path, fds, model))
    assert sniffed.format is ModelFormat.ONNX
    assert sniffed.description == "an ONNX model (IR version 8, opset 17, made by npud-tests)"


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (onnx_models.add_one()[:-3], "field 8 runs 3 bytes past its message"),
        (b"\x08\x08", "it has no graph"),
        (b"\x08\x08\x48\x01", "field 9 \\(wire type 0\\) is not part of an ONNX model"),
        (b"\x08\x08\x3a", "a field ends inside its header"),
        # protobuf reads a length of at most 5 bytes, a value of at most 10
        (b"\x08\x08\x3a" + b"\xff" * 11, "a varint longer than 5 bytes"),
        (b"\x08\x08\x28" + b"\xff" * 11, "a varint longer than 10 bytes"),
    ],
)
def test_damaged_onnx(tmp_path: Path, fds: list[int], data: bytes, reason: str) -> None:
    with pytest.raises(ModelFileError, match=f"damaged ONNX model: {reason}") as caught:
        sniff(_fd(tmp_path, fds, data))
    assert caught.value.kind == "damaged"


def test_each_backend_refuses_the_other_format(tmp_path: Path, fds: list[int]) -> None:
    onnx_fd = _fd(tmp_path, fds, onnx_models.add_one())
    library_fd = _fd(tmp_path, fds, elf())
    assert check_model_file(onnx_fd, "emulator").format is ModelFormat.ONNX
    assert check_model_file(library_fd, "kernel").format is ModelFormat.QNN_LIBRARY
    with pytest.raises(ModelFileError, match="the kernel backend takes QNN model libraries") as k:
        check_model_file(onnx_fd, "kernel")
    assert k.value.kind == "wrong-format"
    assert "qnn-onnx-converter" in str(k.value)
    with pytest.raises(ModelFileError, match=r"Hexagon .*; the emulator backend takes ONNX models"):
        check_model_file(library_fd, "emulator")


def test_unreadable(tmp_path: Path, fds: list[int]) -> None:
    with pytest.raises(ModelFileError, match="the model file is empty") as empty:
        sniff(_fd(tmp_path, fds, b""))
    assert empty.value.kind == "unreadable"
    directory = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    fds.append(directory)
    with pytest.raises(ModelFileError, match="cannot read the model file: not a regular file"):
        sniff(directory)


def test_a_graph_pack_is_onnx_with_named_graphs(tmp_path: Path, fds: list[int]) -> None:
    fd = _fd(tmp_path, fds, onnx_models.two_graphs())
    sniffed = check_model_file(fd, "emulator")
    assert sniffed.format is ModelFormat.ONNX
    assert sniffed.graphs == ("prefill", "decode")
    assert sniffed.description == "a graph pack of ONNX graphs ('prefill', 'decode')"
    with pytest.raises(ModelFileError, match="the kernel backend takes QNN model") as kernel:
        check_model_file(fd, "kernel")
    assert kernel.value.kind == "wrong-format"
    assert sniff(_fd(tmp_path, fds, onnx_models.add_one())).graphs == ()


@pytest.mark.parametrize(
    ("data", "kind", "reason"),
    [
        (onnx_models.many_graphs(9), "refused", "holds 9 graphs; a model has at most 8"),
        (onnx_models.two_graphs()[:30], "damaged", "ends inside the shared weights"),
        (onnx_models.many_graphs(1)[:-1], "damaged", "ends inside graph 'g0'"),
        (graph_pack.write_pack([("g", onnx_models.endless_loop())]), "refused", "a loop whose"),
        (
            graph_pack.write_pack([("g", onnx_models.external_initializer("x.bin"))]),
            "refused",
            "refers to external data",
        ),
    ],
    ids=["nine graphs", "cut header", "cut graph", "looping member", "external member"],
)
def test_graph_packs_refused(
    tmp_path: Path, fds: list[int], data: bytes, kind: str, reason: str
) -> None:
    with pytest.raises(ModelFileError, match=reason) as refused:
        check_model_file(_fd(tmp_path, fds, data), "emulator")
    assert refused.value.kind == kind
