"""What npu_client exports: names that mean one thing, and only public imports across packages."""

from __future__ import annotations

import ast
import pathlib

import pytest

import npu_client
import npu_protocol
from npu_client import trio_client

ROOT = pathlib.Path(__file__).parents[2]
PACKAGES = {
    "npu_protocol": ROOT / "protocol" / "src" / "npu_protocol",
    "npu_client": ROOT / "client" / "src" / "npu_client",
    "npud": ROOT / "npud",
    "bench": ROOT / "bench",
}


def test_no_name_of_npu_client_means_something_else_in_npu_protocol() -> None:
    for name in set(npu_client.__all__) & set(npu_protocol.__all__):
        # Re-exported on purpose (the same object), never a namesake.
        assert getattr(npu_client, name) is getattr(npu_protocol, name), name
    assert set(trio_client.__all__) & set(npu_protocol.__all__) == set()


def test_every_exported_name_exists() -> None:
    for module in (npu_client, npu_protocol, trio_client):
        for name in module.__all__:
            assert hasattr(module, name), f"{module.__name__}.{name}"


def _private_imports(package: str, directory: pathlib.Path) -> list[str]:
    """``file:line module`` for each import of another package's private module."""
    found = []
    for path in sorted(directory.rglob("*.py")):
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                modules = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            elif isinstance(node, ast.Import):
                modules = [alias.name for alias in node.names]
            else:
                continue
            for module in modules:
                parts = module.split(".")
                other = parts[0] in PACKAGES and parts[0] != package
                if other and any(part.startswith("_") for part in parts[1:]):
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno} {module}")
    return found


@pytest.mark.parametrize("package", sorted(PACKAGES))
def test_packages_import_only_what_the_others_export(package: str) -> None:
    assert _private_imports(package, PACKAGES[package]) == []


def test_the_private_import_check_sees_one() -> None:
    # The control: the check above would notice a private import.
    assert _private_imports("npud", PACKAGES["npu_client"]) != []


def test_the_daemons_timeout_is_a_timeout_error() -> None:
    error = npu_client.error_class(npu_protocol.ErrorCode.TIMEOUT)("the DSP took too long")
    assert error.code is npu_protocol.ErrorCode.TIMEOUT
    assert isinstance(error, npu_client.Timeout)
    assert isinstance(error, TimeoutError)
    assert isinstance(error, npu_client.NpuError)
    assert str(error) == error.message == "the DSP took too long"
    assert not isinstance(npu_client.ShuttingDownError("x"), TimeoutError)
