"""The features table: one place says which protocol version brought what.

Both sides ask ``speaks(version, Feature.X)``; a version number compared by hand
anywhere in npud or the client library is a check the table does not know of.
"""

from __future__ import annotations

import ast
import pathlib
import re

import pytest

import npu_protocol as p

ROOT = pathlib.Path(__file__).resolve().parents[2]
SOURCES = ("npud", "client/src", "protocol/src")
ALLOWED_BOUNDS = {"PROTOCOL_VERSION", "MIN_PROTOCOL_VERSION", "highest"}
"""The negotiation's own bounds (npu_protocol._client, _server): not a feature check."""


def test_every_version_after_the_first_brings_a_feature() -> None:
    assert sorted(set(p.SINCE.values())) == list(range(2, p.PROTOCOL_VERSION + 1))
    assert set(p.SINCE) == set(p.Feature)


@pytest.mark.parametrize("feature", list(p.Feature))
def test_a_feature_is_spoken_from_its_version_on(feature: p.Feature) -> None:
    since = p.SINCE[feature]
    assert not p.speaks(since - 1, feature)
    assert p.speaks(since, feature)
    assert p.speaks(p.PROTOCOL_VERSION, feature)
    assert not p.speaks(p.MIN_PROTOCOL_VERSION, feature)


def test_protocol_md_tells_every_version() -> None:
    text = (ROOT / "protocol" / "PROTOCOL.md").read_text()
    told = {int(n) for n in re.findall(r"^\* \*\*Version (\d+)\*\*", text, re.M)}
    assert set(p.SINCE.values()) <= told


def _is_version(node: ast.expr) -> bool:
    name = node.attr if isinstance(node, ast.Attribute) else getattr(node, "id", "")
    return name in {"protocol_version", "version"}


def _hand_comparisons(tree: ast.AST) -> list[int]:
    """Lines comparing a protocol version with anything but the negotiation's bounds."""
    lines = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Compare) or not isinstance(
            node.ops[0], ast.Lt | ast.LtE | ast.Gt | ast.GtE
        ):
            continue
        operands = [node.left, *node.comparators]
        if not any(_is_version(operand) for operand in operands):
            continue
        others = [operand for operand in operands if not _is_version(operand)]
        bounds = {
            operand.attr if isinstance(operand, ast.Attribute) else getattr(operand, "id", None)
            for operand in others
        }
        if not bounds <= ALLOWED_BOUNDS:
            lines.append(node.lineno)
    return lines


def test_no_version_number_is_compared_by_hand() -> None:
    offenders = [
        f"{path.relative_to(ROOT)}:{line}"
        for source in SOURCES
        for path in sorted((ROOT / source).rglob("*.py"))
        if "/sim/" not in str(path)
        and "/fastrpc/" not in str(path)
        and path.name != "_features.py"  # the table itself
        for line in _hand_comparisons(ast.parse(path.read_text(), str(path)))
    ]
    assert offenders == []


def test_the_scan_finds_a_comparison_by_hand() -> None:
    tree = ast.parse("if client.protocol_version >= 3:\n    pass\nif version < GRAPHS:\n    pass\n")
    assert _hand_comparisons(tree) == [1, 3]
    negotiation = ast.parse(
        "ok = MIN_PROTOCOL_VERSION <= hello.protocol_version <= PROTOCOL_VERSION"
    )
    assert _hand_comparisons(negotiation) == []
