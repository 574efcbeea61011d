"""npu_protocol is pure: no sockets, no event loop, no daemon, no I/O.

Checked two ways: a fresh interpreter imports it and reports what got loaded,
and the package's source is read for every import and every I/O builtin.
"""

from __future__ import annotations

import ast
import json
import pathlib
import subprocess
import sys

import npu_protocol

PACKAGE_DIR = pathlib.Path(npu_protocol.__file__).parent

FORBIDDEN_MODULES = frozenset(
    {
        "asyncio",
        "concurrent",
        "ctypes",
        "fcntl",
        "mmap",
        "multiprocessing",
        "npu_client",
        "npud",
        "select",
        "selectors",
        "signal",
        "socket",
        "ssl",
        "subprocess",
        "threading",
        "trio",
    }
)

ALLOWED_IMPORTS = frozenset(
    {
        "__future__",
        "abc",
        "collections",
        "collections.abc",
        "dataclasses",
        "enum",
        "msgspec",
        "msgspec.structs",
        "string",
        "struct",
        "typing",
    }
)
"""Everything npu_protocol's own modules may import besides npu_protocol itself."""

IO_BUILTINS = frozenset({"open", "print", "input", "exec", "eval", "compile", "__import__"})

_PROBE = """
import json, sys
import msgspec
after_msgspec = set(sys.modules)
import npu_protocol
print(json.dumps({"all": sorted(sys.modules), "added": sorted(set(sys.modules) - after_msgspec)}))
"""


def _fresh_import() -> dict[str, list[str]]:
    result = subprocess.run(
        [sys.executable, "-c", _PROBE], capture_output=True, text=True, check=True, timeout=60
    )
    loaded: dict[str, list[str]] = json.loads(result.stdout)
    return loaded


def test_importing_the_package_loads_no_io_machinery() -> None:
    loaded = _fresh_import()
    top_level = {name.partition(".")[0] for name in loaded["all"]}
    assert top_level.isdisjoint(FORBIDDEN_MODULES), top_level & FORBIDDEN_MODULES


def test_the_package_adds_only_itself_and_pure_stdlib_to_msgspec() -> None:
    added = {name for name in _fresh_import()["added"] if not name.startswith("npu_protocol")}
    pure_stdlib = {"_string", "_struct", "_weakrefset", "copy", "dataclasses", "string", "struct"}
    pure_stdlib |= {"weakref", "enum", "abc", "typing", "collections", "collections.abc"}
    assert added <= pure_stdlib, added - pure_stdlib


def _sources() -> list[pathlib.Path]:
    sources = sorted(PACKAGE_DIR.rglob("*.py"))
    assert len(sources) > 5
    return sources


def test_the_source_imports_only_pure_modules() -> None:
    for path in _sources():
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                assert node.level == 0, f"{path.name}: relative import"
                names = [node.module or ""]
            for name in names:
                allowed = name in ALLOWED_IMPORTS or name.startswith("npu_protocol")
                assert allowed, f"{path.name} imports {name}"


def test_the_source_calls_no_io_builtins() -> None:
    for path in _sources():
        tree = ast.parse(path.read_text(), filename=str(path))
        calls = {
            node.func.id
            for node in ast.walk(tree)
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
        }
        assert calls.isdisjoint(IO_BUILTINS), f"{path.name} calls {calls & IO_BUILTINS}"
