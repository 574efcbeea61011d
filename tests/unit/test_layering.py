"""The architecture's arrows, checked rather than written down (DESIGN.md).

* ``npud.fastrpc`` is synchronous code the daemon runs on its own threads: it
  never imports trio, nor the client library.
* ``npud.sim`` describes the kernel's structs with its own layouts, so a drift
  between it and ``npud.fastrpc.abi`` is caught: it never imports ``npud.fastrpc``.
* ``npud.idl`` and ``npud.formats`` are pure and shared by both of the above.
* ``npu_protocol`` is pure (tests/protocol/test_purity.py).

Each rule is checked two ways: the source's import statements, and what a fresh
interpreter has loaded after importing every module of the package.
"""

from __future__ import annotations

import ast
import json
import pathlib
import subprocess
import sys

import pytest

import npud

NPUD = pathlib.Path(npud.__file__).parent

RULES = {
    "npud.fastrpc": ("trio", "npu_client", "npud.sim"),
    "npud.sim": ("trio", "npu_client", "npud.fastrpc"),
    # Shared by both of the above: the IDL stubs are pure, standard library only.
    "npud.idl": ("trio", "npu_client", "npud.fastrpc", "npud.sim", "npu_protocol"),
    # File formats read for clients: pure, standard library only, shared by both sides.
    "npud.formats": (
        "trio",
        "npu_client",
        "npud.fastrpc",
        "npud.sim",
        "npu_protocol",
        "numpy",
        "onnxruntime",
    ),
}


def _modules(package: str) -> list[str]:
    folder = NPUD.joinpath(*package.split(".")[1:])
    return sorted(
        f"{package}.{path.stem}" if path.stem != "__init__" else package
        for path in folder.glob("*.py")
    )


def _imports(path: pathlib.Path) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found.add(node.module)
    return found


def _forbidden(name: str, prefixes: tuple[str, ...]) -> bool:
    return any(name == prefix or name.startswith(prefix + ".") for prefix in prefixes)


@pytest.mark.parametrize("package", sorted(RULES))
def test_the_source_imports_nothing_forbidden(package: str) -> None:
    folder = NPUD.joinpath(*package.split(".")[1:])
    offenders = {
        f"{path.name}: {name}"
        for path in folder.glob("*.py")
        for name in _imports(path)
        if _forbidden(name, RULES[package])
    }
    assert offenders == set()


@pytest.mark.parametrize("package", sorted(RULES))
def test_importing_the_package_loads_nothing_forbidden(package: str) -> None:
    code = (
        "import importlib, json, sys\n"
        f"for name in {_modules(package)!r}:\n"
        "    importlib.import_module(name)\n"
        "print(json.dumps(sorted(sys.modules)))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    loaded = json.loads(result.stdout)
    assert [name for name in loaded if _forbidden(name, RULES[package])] == []


def test_the_rules_can_fail() -> None:
    # The checker itself: a module that imports trio is caught.
    assert _forbidden("trio.lowlevel", RULES["npud.fastrpc"])
    assert not _forbidden("trionic", RULES["npud.fastrpc"])
