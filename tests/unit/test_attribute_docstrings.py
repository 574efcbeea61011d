"""Every attribute docstring stands under the attribute it describes.

A string statement right under an assignment documents that name (the convention
Sphinx and the editors read). One that stands under something else — most often
under another docstring, after a constant was inserted between a name and its
text — describes a name it is no longer beside, and the name it now follows
reads as if it had none. The check walks module and class bodies of npud,
npu_client and npu_protocol.
"""

from __future__ import annotations

import ast
import itertools
import pathlib

import pytest

import npu_client
import npu_protocol
import npud

ROOTS = {
    "npud": pathlib.Path(npud.__file__).parent,
    "npu_client": pathlib.Path(npu_client.__file__).parent,
    "npu_protocol": pathlib.Path(npu_protocol.__file__).parent,
}

# Each entry goes with its fix (the last test fails when an entry is no longer needed);
# all have gone.
KNOWN: frozenset[tuple[str, str]] = frozenset()
"""Misplaced docstrings known and not yet moved: (file, the docstring's first words)."""


def misplaced_docstrings(source: str) -> list[tuple[int, str]]:
    """(line, text) of each string statement in a module or class body that follows
    neither the start of the body nor an assignment: a docstring under no attribute."""
    tree = ast.parse(source)
    bodies = [tree.body] + [node.body for node in ast.walk(tree) if isinstance(node, ast.ClassDef)]
    found: list[tuple[int, str]] = []
    for body in bodies:
        for before, statement in itertools.pairwise(body):
            if (
                isinstance(statement, ast.Expr)
                and isinstance(statement.value, ast.Constant)
                and isinstance(statement.value.value, str)
                and not isinstance(before, ast.Assign | ast.AnnAssign)
            ):
                found.append((statement.lineno, statement.value.value))
    return found


def _tree_offenders() -> dict[tuple[str, str], int]:
    """(file, first words) -> line, for every misplaced docstring of the three packages."""
    offenders: dict[tuple[str, str], int] = {}
    for package, root in ROOTS.items():
        for path in sorted(root.rglob("*.py")):
            name = f"{package}/{path.relative_to(root).as_posix()}"
            for line, text in misplaced_docstrings(path.read_text()):
                known = next((k for k in KNOWN if k[0] == name and text.startswith(k[1])), None)
                offenders[known or (name, text.strip()[:60])] = line
    return offenders


def test_attribute_docstrings_stand_under_their_attribute() -> None:
    offenders = _tree_offenders()
    new = [
        f"{name}:{line}: {words}"
        for (name, words), line in offenders.items()
        if (name, words) not in KNOWN
    ]
    assert sorted(new) == []


def test_known_misplaced_docstrings_are_still_there() -> None:
    # An entry whose docstring was moved goes from KNOWN, so KNOWN only shrinks.
    assert KNOWN - set(_tree_offenders()) == set()


@pytest.mark.parametrize(
    ("source", "lines"),
    [
        # The docstring of A, pushed under B's by a constant inserted between them.
        ('A = 1\nB = 2\n"""A\'s."""\n"""B\'s."""\n', [4]),
        # Under a function or a class, not an attribute.
        ('def f() -> None:\n    pass\n"""f\'s?"""\n', [3]),
        ('class C:\n    """C."""\n    x = 1\n    """x."""\n    """y?"""\n', [5]),
        # Well placed: module and class docstrings, annotated and plain attributes.
        ('"""Module."""\nA: int = 1\n"""A."""\nB = 2\n"""B."""\n', []),
        ('class C:\n    """C."""\n\n    x: int = 1\n    """x."""\n', []),
    ],
)
def test_the_check_can_fail(source: str, lines: list[int]) -> None:
    assert [line for line, _ in misplaced_docstrings(source)] == lines
