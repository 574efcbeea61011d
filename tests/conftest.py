"""Shared test configuration."""

from __future__ import annotations

import glob

import pytest

from tests import tools


def _have_device() -> bool:
    return bool(glob.glob("/dev/fastrpc-cdsp*"))


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--require-tools",
        action="store_true",
        default=tools.strict_from_environment(),
        help=(
            "fail, instead of skipping, a test whose tool (gcc, shellcheck, systemd-analyze...) "
            f"is missing; default from ${tools.REQUIRE_TOOLS_ENV} (.ci/run sets it)"
        ),
    )


def pytest_configure(config: pytest.Config) -> None:
    tools.set_strict(bool(config.getoption("require_tools")))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if _have_device():
        return
    skip = pytest.mark.skip(reason="needs a /dev/fastrpc-cdsp* device node (no NPU here)")
    for item in items:
        if "hardware" in item.keywords:
            item.add_marker(skip)
