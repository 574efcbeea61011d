"""protocol/PROTOCOL.md says exactly what the code does.

The example frames, the error table and the limits are regenerated from the
code and compared byte for byte; every field table is compared, key by key,
with the msgspec definition of its struct.
"""

from __future__ import annotations

import pathlib
import re
import typing

import msgspec
import pytest

import npu_protocol as p
from tests.protocol.protocol_doc import (
    BLOCKS,
    DOCUMENTED_STRUCTS,
    field_rows,
    fill_blocks,
    render_examples,
)

DOC = pathlib.Path(__file__).resolve().parents[2] / "protocol" / "PROTOCOL.md"


@pytest.fixture(scope="module")
def document() -> str:
    return DOC.read_text()


@pytest.mark.parametrize("block", sorted(BLOCKS))
def test_generated_blocks_match_the_code(document: str, block: str) -> None:
    begin, end = f"<!-- begin {block} -->\n", f"<!-- end {block} -->"
    start = document.index(begin) + len(begin)
    assert document[start : document.index(end, start)] == BLOCKS[block]() + "\n", (
        f"PROTOCOL.md's {block} block is stale: "
        "run python -m tests.protocol.protocol_doc protocol/PROTOCOL.md"
    )


def test_refreshing_the_document_changes_nothing(document: str) -> None:
    assert fill_blocks(document) == document


def _table_after(document: str, marker: str) -> list[tuple[str, str, str]]:
    """The (key, type, default) cells of the table that follows ``marker``."""
    lines = document[document.index(marker) :].splitlines()[1:]
    assert lines[0].startswith("| key | type | default |"), marker
    rows = []
    for line in lines[2:]:
        if not line.startswith("|"):
            break
        cells = [cell.strip() for cell in re.split(r"(?<!\\)\|", line)[1:-1]]
        assert len(cells) == 4, line
        assert cells[3] or cells[0] == "`type`", f"{marker}: {cells[0]} has no meaning"
        rows.append((cells[0], cells[1], cells[2]))
    return rows


@pytest.mark.parametrize("struct", DOCUMENTED_STRUCTS, ids=lambda cls: cls.__name__)
def test_field_tables_match_the_structs(document: str, struct: type[msgspec.Struct]) -> None:
    marker = f"<!-- fields: {struct.__name__} -->"
    assert document.count(marker) == 1, f"PROTOCOL.md needs one table for {struct.__name__}"
    assert _table_after(document, marker) == field_rows(struct)


def _wire_structs() -> set[type[msgspec.Struct]]:
    """Every struct reachable from the two unions."""
    found: set[type[msgspec.Struct]] = set()
    pending = [*typing.get_args(p.ClientMessage), *typing.get_args(p.ServerMessage)]
    while pending:
        cls = pending.pop()
        if cls in found:
            continue
        found.add(cls)
        for hint in typing.get_type_hints(cls, include_extras=True).values():
            pending += [
                t for t in _leaves(hint) if isinstance(t, type) and issubclass(t, msgspec.Struct)
            ]
    return found


def _leaves(hint: object) -> list[object]:
    args = typing.get_args(hint)
    return [leaf for arg in args for leaf in _leaves(arg)] if args else [hint]


def test_every_wire_struct_is_documented() -> None:
    assert _wire_structs() == set(DOCUMENTED_STRUCTS)


def test_examples_cover_every_message_type() -> None:
    examples = render_examples()
    for union in (p.ClientMessage, p.ServerMessage):
        for cls in typing.get_args(union):
            assert f'{{"type": "{p.tag_of(cls)}"' in examples, cls.__name__


def test_examples_show_the_fd_as_slot_zero() -> None:
    examples = render_examples()
    assert "header   4e 50 01 00" in examples
    assert '"fd": 0}' in examples


def test_the_readme_example_runs() -> None:
    readme = (DOC.parent / "README.md").read_text()
    code = readme.split("```python\n", 1)[1].split("```", 1)[0]
    exec(compile(code, "README.md", "exec"), {})  # noqa: S102 - our own documentation
