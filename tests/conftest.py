"""Shared test configuration."""

from __future__ import annotations

import glob

import pytest


def _have_device() -> bool:
    return bool(glob.glob("/dev/fastrpc-cdsp*"))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if _have_device():
        return
    skip = pytest.mark.skip(reason="needs a /dev/fastrpc-cdsp* device node (no NPU here)")
    for item in items:
        if "hardware" in item.keywords:
            item.add_marker(skip)
