"""Reading a trace file (docs/trace-format.md): its header checked, its records sorted
by kind and in their recorded order. A line that is not what the format says is a
:class:`TraceFormatError` naming the file and the line."""

from __future__ import annotations

import dataclasses
import os

import msgspec

from npud.fastrpc.kernel.trace_hooks import Record
from npud.fastrpc.recording.trace_format import TRACE_FORMAT, TRACE_VERSION


class TraceFormatError(Exception):
    """The file is not a trace this version can read; ``str()`` says why (and where)."""


@dataclasses.dataclass(frozen=True)
class Trace:
    header: Record
    calls: tuple[Record, ...]
    ops: tuple[Record, ...]
    files: tuple[Record, ...]
    complete: bool
    """The recorder closed it (an ``end`` record): nothing ran past its last call."""


def load_trace(path: str | os.PathLike[str]) -> Trace:
    """Read and check a trace file. TraceFormatError names the line of any problem."""
    decoder = msgspec.json.Decoder()
    kinds: dict[str, list[Record]] = {"call": [], "op": [], "file": [], "reverse": [], "end": []}
    header: Record | None = None
    with open(path, "rb") as file:
        for number, line in enumerate(file, start=1):
            if not line.strip():
                continue
            where = f"{path}:{number}"
            try:
                record = decoder.decode(line)
            except msgspec.DecodeError as exc:
                raise TraceFormatError(f"{where}: not a JSON line: {exc}") from None
            if not isinstance(record, dict) or "kind" not in record:
                raise TraceFormatError(f"{where}: a record must be an object with a kind")
            if header is None:
                header = _check_header(record, where)
            elif record["kind"] in kinds:
                kinds[record["kind"]].append(record)
            else:
                raise TraceFormatError(f"{where}: unknown record kind {record['kind']!r}")
    if header is None:
        raise TraceFormatError(f"{path}: empty")
    return Trace(
        header,
        tuple(sorted(kinds["call"], key=lambda r: int(r["n"]))),
        tuple(sorted(kinds["op"], key=lambda r: int(r["start"]))),
        tuple(kinds["file"]),
        bool(kinds["end"]),
    )


def _check_header(record: Record, where: str) -> Record:
    if record.get("kind") != "header" or record.get("format") != TRACE_FORMAT:
        raise TraceFormatError(f"{where}: not an {TRACE_FORMAT} file")
    if record.get("version") != TRACE_VERSION:
        raise TraceFormatError(
            f"{where}: version {record.get('version')!r}; this npud reads version {TRACE_VERSION}"
        )
    return record
