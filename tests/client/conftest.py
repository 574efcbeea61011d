"""Fixtures for the client tests: a real protocol peer on a temporary socket."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

import npu_client
from tests.client.peer import Peer


def open_fds() -> int:
    """This process's open fds (the peer's included: it runs in threads here)."""
    return len(os.listdir("/proc/self/fd"))


@pytest.fixture
def socket_path(tmp_path: os.PathLike[str]) -> str:
    return os.path.join(tmp_path, "npud.sock")


@pytest.fixture
def peer(socket_path: str) -> Iterator[Peer]:
    with Peer(socket_path) as running:
        yield running


@pytest.fixture
def client(peer: Peer) -> Iterator[npu_client.Client]:
    with npu_client.connect(peer.path, name="test-client") as connected:
        yield connected
