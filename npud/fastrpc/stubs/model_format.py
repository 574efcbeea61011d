"""What a model file is, from its first bytes, and whether this backend can load it.

The kernel backend's DSP loads QNN model libraries (Hexagon ELF shared
objects, dlopen'ed by skel/portal_qnn_imp.c); the emulator's loads ONNX
models (npud/sim/portal_qnn.py). A file of the wrong kind is refused before
it reaches the DSP, with a message that says what the file is and what the
backend takes. Reads go through the descriptor (``pread``), never a path.

ONNX has no magic number; an ONNX file is a protobuf ``ModelProto``. The
sniffer walks its top-level fields (tags and lengths only: the graph itself
is skipped, not read) and accepts the file when every field is one
ModelProto has, with its wire type, the walk ends exactly at the end of the
file and both ``ir_version`` and ``graph`` are there.

A graph pack (npud.formats.graph_pack: several ONNX graphs of one model that
share weights stored once, for the emulator) starts with its magic
``NPUGRAPH``; its headers are walked, and every check below runs on each
member and on the shared weights. A pack of more graphs than a model may
hold (8) is refused (``refused``).

An ONNX model that keeps tensor data in external files is refused
(``refused``): onnxruntime would open the path the model names, relative to
the DSP process's working directory, and hand its bytes to the client; so is
one with a ``Loop`` node. The check (:func:`check_contents`) is one walk of
the whole model through the descriptor (npud.formats.onnx_proto.scan: fields
read as protobuf reads them, linear in the file, bounded in memory) and
resolves nothing. Every walk here takes an optional
:class:`~npud.formats.onnx_proto.Budget` (``refused`` when it runs out; the
daemon gives ``[daemon] model_check_s`` and walks on a thread or in a process
of the load's own, npud/requests/model_check.py). The emulated DSP checks the bytes it
parses again for external data, because the client may rewrite its file
between this check and the DSP's read.
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import os
import struct
from collections.abc import Iterator
from typing import Final, Literal

from npud.fastrpc.reverse.exposed_files import check_readable_file
from npud.formats import graph_pack, onnx_proto

HEAD_BYTES: Final = 64
MAX_TEXT_FIELD: Final = 256

ELF_MAGIC: Final = b"\x7fELF"
EM_QDSP6: Final = 164
ELF_MACHINES: Final = {3: "x86", 40: "ARM", 62: "x86-64", 183: "AArch64", EM_QDSP6: "Hexagon"}
ELF_TYPES: Final = {1: "relocatable object", 2: "executable", 3: "shared object", 4: "core dump"}
ET_DYN: Final = 3

# ModelProto field number -> (name, protobuf wire type): 0 varint, 2 length-delimited.
ONNX_FIELDS: Final = {
    1: ("ir_version", 0),
    2: ("producer_name", 2),
    3: ("producer_version", 2),
    4: ("domain", 2),
    5: ("model_version", 0),
    6: ("doc_string", 2),
    7: ("graph", 2),
    8: ("opset_import", 2),
    14: ("metadata_props", 2),
    20: ("training_info", 2),
    25: ("functions", 2),
    26: ("configuration", 2),
}
MAX_IR_VERSION: Final = 64


class ModelFormat(enum.Enum):
    """The model formats npud's backends load; the value is how a message names them."""

    QNN_LIBRARY = "QNN model libraries (Hexagon ELF shared objects)"
    ONNX = "ONNX models"


BACKEND_FORMATS: Final = {"kernel": ModelFormat.QNN_LIBRARY, "emulator": ModelFormat.ONNX}
"""What each backend's DSP loads."""

_HINTS: Final = {
    ModelFormat.QNN_LIBRARY: (
        ": build one from the ONNX model with the QAIRT tools (qnn-onnx-converter,"
        " qnn-model-lib-generator; see docker/README.md)"
    ),
    ModelFormat.ONNX: "",
}


@dataclasses.dataclass(frozen=True)
class Sniffed:
    """What the file is: a format npud knows (or None), and words for a message."""

    format: ModelFormat | None
    description: str
    size: int
    graphs: tuple[str, ...] = ()
    """A graph pack's graph names, in order (empty for any other file)."""


FileFailure = Literal["unreadable", "wrong-format", "damaged", "refused"]


class ModelFileError(ValueError):
    """A model file this backend cannot load. ``kind`` says which way it fails:

    * ``unreadable``: not a readable regular file, or empty;
    * ``wrong-format``: a file of another kind than the backend takes;
    * ``damaged``: the right kind, but cut short or corrupt;
    * ``refused``: the right kind and intact, but it asks for what npud never
      does on a client's behalf (an ONNX model's external data files).
    """

    def __init__(self, kind: FileFailure, message: str) -> None:
        super().__init__(message)
        self.kind = kind


def _walk_onnx(source: onnx_proto.Source, budget: onnx_proto.Budget | None) -> str:
    """Describe an ONNX ModelProto from its top-level fields (read as protobuf reads them,
    npud.formats.onnx_proto), or raise DamagedError / CheckTimeoutError."""
    found: dict[str, int] = {}
    producer, opset = "", None
    for field in onnx_proto.fields(source, 0, source.size, budget):
        number, wire = field.number, field.wire
        if number not in ONNX_FIELDS or ONNX_FIELDS[number][1] != wire:
            raise onnx_proto.DamagedError(
                f"field {number} (wire type {wire}) is not part of an ONNX model"
            )
        name = ONNX_FIELDS[number][0]
        found[name] = field.value
        if name == "producer_name" and field.value <= MAX_TEXT_FIELD:
            producer = source.read(field.start, field.value).decode("utf-8", errors="replace")
        if name == "opset_import" and opset is None and field.value <= MAX_TEXT_FIELD:
            opset = _opset_version(source.read(field.start, field.value))
    if "graph" not in found:
        raise onnx_proto.DamagedError("it has no graph")
    details = [f"IR version {found['ir_version']}"]
    if opset is not None:
        details.append(f"opset {opset}")
    if producer:
        details.append(f"made by {producer}")
    return f"an ONNX model ({', '.join(details)})"


def _opset_version(data: bytes) -> int | None:
    """OperatorSetIdProto.version (field 2, varint), best effort."""
    position = 0
    while position < len(data):
        key = data[position]
        position += 1
        if key == 0x10:  # field 2, varint
            value, shift = 0, 0
            while position < len(data):
                byte = data[position]
                position += 1
                value |= (byte & 0x7F) << shift
                shift += 7
                if not byte & 0x80:
                    return value
            return None
        if key & 7 != 2 or position >= len(data):
            return None
        position += 1 + data[position]  # a short length-delimited field (the domain)
    return None


def _looks_like_onnx(head: bytes) -> bool:
    """ONNX writers put ir_version (field 1, varint) first."""
    return len(head) >= 2 and head[0] == 0x08 and 1 <= head[1] <= MAX_IR_VERSION


def _describe_elf(head: bytes) -> tuple[ModelFormat | None, str]:
    if len(head) < 20:
        return None, "a truncated ELF file"
    bits = {1: "32-bit", 2: "64-bit"}.get(head[4], "odd-class")
    endian = "<" if head[5] == 1 else ">"
    e_type, machine = struct.unpack_from(endian + "HH", head, 16)
    kind = ELF_TYPES.get(e_type, f"type-{e_type} file")
    arch = ELF_MACHINES.get(machine, f"machine {machine}")
    description = f"an ELF {kind} for {arch} ({bits})"
    if machine == EM_QDSP6 and e_type == ET_DYN and head[4] == 1 and head[5] == 1:
        return ModelFormat.QNN_LIBRARY, description
    return None, description


def _describe_other(head: bytes) -> str:
    if head[4:8] == b"TFL3":
        return "a TensorFlow Lite model"
    if head.startswith(b"GGUF"):
        return "a GGUF model (llama.cpp)"
    if head.startswith(b"PK\x03\x04"):
        return "a ZIP archive (a PyTorch checkpoint?)"
    if len(head) >= 9 and head[8:9] == b"{":
        return "a safetensors file"
    try:
        text = head.decode("utf-8")
    except UnicodeDecodeError:
        return "data of an unknown format"
    return "a text file" if text.isprintable() or "\n" in text else "data of an unknown format"


def sniff(fd: int, budget: onnx_proto.Budget | None = None) -> Sniffed:
    """What the regular file open on ``fd`` is. ModelFileError("unreadable"/"damaged", or
    "refused" when ``budget`` runs out)."""
    try:
        size = check_readable_file(fd).st_size
        head = os.pread(fd, HEAD_BYTES, 0)
    except (ValueError, OSError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise ModelFileError("unreadable", f"cannot read the model file: {reason}") from None
    if size == 0:
        raise ModelFileError("unreadable", "the model file is empty")
    if head.startswith(ELF_MAGIC):
        model_format, description = _describe_elf(head)
        return Sniffed(model_format, description, size)
    if graph_pack.is_pack(head):
        try:
            pack = graph_pack.read_pack(onnx_proto.FdSource(fd, size), budget)
        except onnx_proto.CheckTimeoutError as exc:
            raise ModelFileError(
                "refused", f"the model file was not checked in time: {exc}"
            ) from None
        except graph_pack.PackError as exc:
            if exc.too_many:
                raise ModelFileError(
                    "refused", f"the model file is a graph pack that {exc}"
                ) from None
            raise ModelFileError(
                "damaged", f"the model file is a damaged graph pack: {exc}"
            ) from None
        except OSError as exc:
            raise ModelFileError("unreadable", f"cannot read the model file: {exc}") from None
        names = ", ".join(repr(name) for name in pack.names)
        description = f"a graph pack of ONNX graphs ({names})"
        return Sniffed(ModelFormat.ONNX, description, size, pack.names)
    if _looks_like_onnx(head):
        with _walk_errors():
            return Sniffed(
                ModelFormat.ONNX, _walk_onnx(onnx_proto.FdSource(fd, size), budget), size
            )
    return Sniffed(None, _describe_other(head), size)


def check_model_file(fd: int, backend: str, budget: onnx_proto.Budget | None = None) -> Sniffed:
    """Sniff ``fd`` and refuse what ``backend`` ("kernel" or "emulator") cannot load.
    ``budget`` bounds the time of every walk of the file together (``refused`` when it
    runs out)."""
    accepted = BACKEND_FORMATS[backend]
    sniffed = sniff(fd, budget)
    if sniffed.format is not accepted:
        raise ModelFileError(
            "wrong-format",
            f"the model file is {sniffed.description}; the {backend} backend takes"
            f" {accepted.value}{_HINTS[accepted]}",
        )
    if sniffed.format is ModelFormat.ONNX:
        check_contents(fd, sniffed.size, budget)
    return sniffed


@contextlib.contextmanager
def _walk_errors() -> Iterator[None]:
    """A walk's failures as ModelFileErrors."""
    try:
        yield
    except onnx_proto.DamagedError as exc:
        raise ModelFileError("damaged", f"the model file is a damaged ONNX model: {exc}") from None
    except onnx_proto.CheckTimeoutError as exc:
        raise ModelFileError(
            "refused",
            f"the model file was not checked in time: {exc} ([daemon] model_check_s); a model"
            " of this many protobuf fields is not loaded",
        ) from None
    except onnx_proto.LimitError as exc:
        raise ModelFileError("refused", f"the model is outside npud's limits: {exc}") from None
    except OSError as exc:
        raise ModelFileError("unreadable", f"cannot read the model file: {exc}") from None


def members(fd: int, size: int, budget: onnx_proto.Budget | None = None) -> list[onnx_proto.Source]:
    """The ONNX models in the file on ``fd`` (borrowed): each graph of a graph pack
    (without the shared weights), or the file itself."""
    source = onnx_proto.FdSource(fd, size)
    if not graph_pack.is_pack(os.pread(fd, len(graph_pack.MAGIC), 0)):
        return [source]
    try:
        pack = graph_pack.read_pack(source, budget)
    except graph_pack.PackError as exc:
        raise ModelFileError("damaged", f"the model file is a damaged graph pack: {exc}") from None
    return [onnx_proto.Window(source, g.offset, g.length) for g in pack.graphs]


def _shared_weights(
    fd: int, size: int, budget: onnx_proto.Budget | None
) -> onnx_proto.ExternalData | None:
    """External data among a graph pack's shared weights (None for any other file)."""
    source = onnx_proto.FdSource(fd, size)
    if not graph_pack.is_pack(os.pread(fd, len(graph_pack.MAGIC), 0)):
        return None
    try:
        pack = graph_pack.read_pack(source, budget)
    except graph_pack.PackError as exc:
        raise ModelFileError("damaged", f"the model file is a damaged graph pack: {exc}") from None
    end = pack.shared_offset + pack.shared_length
    return onnx_proto.scan(source, pack.shared_offset, end, "GraphProto", budget).external


def check_contents(fd: int, size: int, budget: onnx_proto.Budget | None = None) -> None:
    """Refuse an ONNX model (or a graph pack) on ``fd`` (borrowed) that refers to
    external data files, or has a node that may loop without end: one walk of each
    graph (npud.formats.onnx_proto.scan)."""
    external, looping = None, None
    with _walk_errors():
        external = _shared_weights(fd, size, budget)
        for member in members(fd, size, budget):
            found = onnx_proto.scan(member, budget=budget)
            external = external or found.external
            looping = looping or found.looping
    if external is not None:
        raise ModelFileError("refused", external_data_refusal(external))
    if looping is not None:
        raise ModelFileError(
            "refused",
            f"the model has {looping.describe()}: a loop whose trip count the model computes"
            " at run time has no bound, and the HTP runs no control flow; unroll it (export"
            " with fixed sequence lengths) or run the model on the CPU",
        )


def external_data_refusal(external: onnx_proto.ExternalData) -> str:
    """What a client is told when its model refers to external data."""
    return (
        f"the model refers to external data: {external.describe()}. npud loads only"
        " self-contained models and never opens a path a model names; save the model with"
        " every tensor inside it (onnx.save_model(model, path, save_as_external_data=False),"
        " up to 2 GiB)"
    )
