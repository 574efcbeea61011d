"""The architecture's arrows, checked rather than written down (docs/architecture.md).

* ``npud.fastrpc`` is synchronous code the daemon runs on its own threads: it
  never imports trio, nor the client library.
* ``npud.sim`` describes the kernel's structs with its own layouts, so a drift
  between it and ``npud.fastrpc.kernel.abi`` is caught: it never imports ``npud.fastrpc``.
* ``npud.idl`` and ``npud.formats`` are pure and shared by both of the above.
* ``npud.domain`` (sessions, their registries, memory) sits below the daemon's
  clients, requests and connections, and never imports them.
* The daemon's folders run one way: ``npud.daemon`` (main, server, connections,
  broker) over ``npud.datapath`` (workers, links) over ``npud.requests`` (handlers,
  clients, what they hold, models) over ``npud.domain``, over ``npud.ops``
  (configuration, backend, logs, the tools) and ``npud.runtime`` (scheduler, lanes,
  timers, closer), which import none of the others.
* Inside ``npud.fastrpc`` the folders stand in floors (``FASTRPC_FLOORS``): a folder
  imports its own modules and those of folders on lower floors, never one beside or
  above it (the trace hooks live in ``kernel`` for this; remotectl in ``session``).
* No import cycle among npud's modules (imports outside functions, those only for
  type checking included; a function that imports lazily, as the emulator's skel
  table does, is not a cycle at load).
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
    # The daemon's folders run one way: daemon -> datapath -> requests -> domain -> ops,
    # runtime (docs/architecture.md, "Where things live").
    "npud.runtime": (
        "npud.daemon",
        "npud.datapath",
        "npud.requests",
        "npud.domain",
        "npud.ops",
    ),
    "npud.ops": ("npud.daemon", "npud.datapath", "npud.requests", "npud.domain", "npud.runtime"),
    "npud.requests": ("npud.datapath", "npud.daemon"),
    "npud.datapath": ("npud.daemon",),
    "npud.fastrpc": ("trio", "npu_client", "npud.sim"),
    "npud.sim": ("trio", "npu_client", "npud.fastrpc"),
    # Shared by both of the above: the IDL stubs are pure, standard library only.
    "npud.idl": ("trio", "npu_client", "npud.fastrpc", "npud.sim", "npu_protocol"),
    # Domains sit below the daemon's clients and requests: they know sessions, not clients.
    "npud.domain": ("npud.daemon", "npud.datapath", "npud.requests", "npud.sim"),
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


def _sources(package: str) -> list[pathlib.Path]:
    """Every source file of ``package``, its subpackages' included."""
    folder = NPUD.joinpath(*package.split(".")[1:])
    return sorted(path for path in folder.rglob("*.py") if "__pycache__" not in path.parts)


def _modules(package: str) -> list[str]:
    return sorted(_module_name(path) for path in _sources(package))


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
    offenders = {
        f"{path.name}: {name}"
        for path in _sources(package)
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


FASTRPC_FLOORS: tuple[tuple[str, ...], ...] = (
    ("kernel",),
    ("reverse", "trust"),
    ("session",),
    ("stubs", "recording"),
    ("host",),
)
"""``npud.fastrpc``'s folders from the ground up: the uapi and the Driver seam; what a
session serves the DSP and what it verifies before a load; the session; what drives a
session (stubs, a replay); the CPU side of the DSP's host libraries."""


def _fastrpc_floor(module: str) -> int | None:
    """The floor of ``module``'s fastrpc folder; None outside one (``npud.fastrpc`` itself)."""
    parts = module.split(".")
    if parts[:2] != ["npud", "fastrpc"] or len(parts) < 3:
        return None
    for floor, folders in enumerate(FASTRPC_FLOORS):
        if parts[2] in folders:
            return floor
    raise AssertionError(f"{module}: a fastrpc folder with no floor in FASTRPC_FLOORS")


def _fastrpc_runs_back_up(importer: str, imported: str) -> bool:
    """Whether ``importer`` (a fastrpc module) imports ``imported`` from a folder on its
    own floor or above: only the same folder, or a lower floor, may be imported."""
    here, there = _fastrpc_floor(importer), _fastrpc_floor(imported)
    if here is None or there is None:
        return False
    return importer.split(".")[2] != imported.split(".")[2] and there >= here


def test_every_fastrpc_folder_has_a_floor() -> None:
    folders = {
        path.name for path in (NPUD / "fastrpc").iterdir() if (path / "__init__.py").exists()
    }
    assert folders == {folder for floor in FASTRPC_FLOORS for folder in floor}


def test_fastrpc_folders_import_only_lower_floors() -> None:
    # Every import counts, lazy and type-checking ones included: a type is an arrow too.
    offenders = sorted(
        f"{_module_name(path)} -> {name}"
        for path in _sources("npud.fastrpc")
        for name in _imports(path)
        if _fastrpc_runs_back_up(_module_name(path), name)
    )
    assert offenders == []


def test_the_floor_rule_can_fail() -> None:
    assert _fastrpc_runs_back_up("npud.fastrpc.kernel.dma", "npud.fastrpc.recording.trace")
    assert _fastrpc_runs_back_up("npud.fastrpc.session._state", "npud.fastrpc.stubs")
    assert _fastrpc_runs_back_up("npud.fastrpc.stubs.model_format", "npud.fastrpc.recording")
    assert not _fastrpc_runs_back_up("npud.fastrpc.session._state", "npud.fastrpc.session._device")
    assert not _fastrpc_runs_back_up("npud.fastrpc.recording.replay", "npud.fastrpc.session")
    assert not _fastrpc_runs_back_up("npud.fastrpc.host.htp_host", "numpy")


def test_subpackages_are_checked() -> None:
    assert "npud.fastrpc.session._session" in _modules("npud.fastrpc")
    assert "npud.fastrpc.session" in _modules("npud.fastrpc")


def test_the_rules_can_fail() -> None:
    # The checker itself: a module that imports trio is caught.
    assert _forbidden("trio.lowlevel", RULES["npud.fastrpc"])
    assert not _forbidden("trionic", RULES["npud.fastrpc"])


def _module_name(path: pathlib.Path) -> str:
    parts = path.relative_to(NPUD.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _top_level_imports(path: pathlib.Path, known: set[str]) -> set[str]:
    """The npud modules ``path`` imports outside functions, TYPE_CHECKING ones included
    (an import only for types is still an arrow back up)."""
    found: set[str] = set()
    tree = ast.parse(path.read_text(), str(path))
    for node in tree.body:
        for inner in ast.walk(node) if not isinstance(node, ast.FunctionDef) else ():
            if isinstance(inner, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            names: list[str] = []
            if isinstance(inner, ast.Import):
                names = [alias.name for alias in inner.names]
            elif isinstance(inner, ast.ImportFrom) and inner.module and not inner.level:
                # ``from pkg import mod`` imports the module; ``from mod import name`` the
                # module the name is in.
                names = [
                    f"{inner.module}.{a.name}"
                    if f"{inner.module}.{a.name}" in known
                    else inner.module
                    for a in inner.names
                ]
            found.update(name for name in names if name in known)
    return found


def _import_graph() -> dict[str, set[str]]:
    paths = [path for path in NPUD.rglob("*.py") if "__pycache__" not in path.parts]
    known = {_module_name(path) for path in paths}
    return {
        _module_name(path): _top_level_imports(path, known) - {_module_name(path)} for path in paths
    }


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = [0]

    def visit(node: str) -> None:
        index[node] = low[node] = counter[0]
        counter[0] += 1
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph.get(node, ())):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_no_import_cycles() -> None:
    assert _cycles(_import_graph()) == []


def test_the_cycle_finder_can_fail() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
