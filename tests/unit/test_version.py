"""One version for npud, npu-client and npu-protocol, and pins that keep them together."""

from __future__ import annotations

import importlib.metadata
import re
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

import npu_client
import npu_protocol
import npud

REPO = Path(__file__).resolve().parents[2]
SOURCE_OF_TRUTH = REPO / "protocol" / "src" / "npu_protocol" / "_version.py"
PROJECTS = {
    "npud": (REPO, REPO / "npud"),
    "npu-client": (REPO / "client", REPO / "client" / "src" / "npu_client"),
    "npu-protocol": (REPO / "protocol", REPO / "protocol" / "src" / "npu_protocol"),
}
OURS = frozenset(PROJECTS)


def pyproject(name: str) -> dict[str, Any]:
    with open(PROJECTS[name][0] / "pyproject.toml", "rb") as file:
        project: dict[str, Any] = tomllib.load(file)["project"]
    return project


def written_version() -> str:
    match = re.search(r'^__version__ = "([^"]+)"$', SOURCE_OF_TRUTH.read_text(), re.MULTILINE)
    assert match, f"no __version__ line in {SOURCE_OF_TRUTH}"
    return match[1]


def test_the_version_is_written_once_and_linked_from_the_other_packages() -> None:
    for name, (_root, package) in PROJECTS.items():
        module = package / "_version.py"
        assert module.resolve() == SOURCE_OF_TRUTH, name
        if name != "npu-protocol":
            assert module.is_symlink(), f"{module} must be a link to {SOURCE_OF_TRUTH}"
    assert str(Version(written_version())) == written_version(), "not a normalised PEP 440 version"


@pytest.mark.parametrize("name", sorted(PROJECTS))
def test_each_distribution_reads_its_version_from_that_file(name: str) -> None:
    root, package = PROJECTS[name]
    project = pyproject(name)
    assert "version" not in project
    assert project["dynamic"] == ["version"]
    with open(root / "pyproject.toml", "rb") as file:
        dynamic = tomllib.load(file)["tool"]["setuptools"]["dynamic"]
    assert dynamic["version"] == {"attr": f"{package.name}._version.__version__"}


def test_the_packages_and_their_installed_metadata_agree() -> None:
    version = written_version()
    assert npud.__version__ == npu_client.__version__ == npu_protocol.__version__ == version
    for name in PROJECTS:
        # A stale editable install (made before the version changed) fails here: `make install`.
        assert importlib.metadata.version(name) == version, name


@pytest.mark.parametrize(("name", "needs"), [("npud", 2), ("npu-client", 1), ("npu-protocol", 0)])
def test_our_packages_pin_each_other_to_the_same_minor_release(name: str, needs: int) -> None:
    version = Version(written_version())
    pins = [Requirement(text) for text in pyproject(name)["dependencies"]]
    ours = [pin for pin in pins if pin.name in OURS]
    assert len(ours) == needs
    for pin in ours:
        [spec] = pin.specifier
        assert spec.operator == "~=", f"{name}: {pin} is not a compatible-release pin"
        assert version in pin.specifier, f"{name}: {pin} excludes {version}; update the pin"
        assert Version(spec.version).release[:2] == version.release[:2], (
            f"{name}: {pin} allows another minor release than {version}"
        )


@pytest.mark.parametrize("name", sorted(PROJECTS))
def test_metadata_is_complete_and_the_license_ships(name: str) -> None:
    root, _package = PROJECTS[name]
    project = pyproject(name)
    for key in ("description", "readme", "requires-python", "license", "classifiers", "authors"):
        assert project.get(key), f"{name}: no {key}"
    assert project["license"] == "BSD-3-Clause"
    assert project["license-files"] == ["LICENSE"]
    license_file = root / "LICENSE"
    assert license_file.resolve() == REPO / "LICENSE"
    assert "BSD 3-Clause License" in license_file.read_text()
    assert (root / project["readme"]).is_file()


def test_npuctl_and_npud_report_the_same_version() -> None:
    def run(*argv: str) -> str:
        result = subprocess.run(
            [sys.executable, *argv], capture_output=True, text=True, check=True, timeout=60
        )
        return result.stdout.strip()

    version = written_version()
    assert run("-m", "npud.daemon.main", "--version") == f"npud {version}"
    npuctl = run("-m", "npu_client.npuctl", "--version")
    assert npuctl.startswith(f"npuctl {version} (npu-protocol {version}, wire protocol ")
