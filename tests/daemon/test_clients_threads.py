"""The client table shared by the trio thread (admit, remove) and the workers (quota
checks at arrival): no check may ever see the set change under it (issue 17, item 7)."""

from __future__ import annotations

import sys
import threading
from collections.abc import Iterator

import pytest

from npud.ops.config import Config
from npud.requests.clients import Client, Clients


@pytest.fixture
def tiny_switch_interval() -> Iterator[None]:
    """Thread switches as often as CPython allows, so a race shows within a second."""
    before = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        yield
    finally:
        sys.setswitchinterval(before)


@pytest.mark.usefixtures("tiny_switch_interval")
def test_quota_checks_survive_clients_coming_and_going() -> None:
    clients = Clients(Config())
    checker = Client(pid=1, uid=1000, gid=1000)
    clients.admit(checker)
    failures: list[BaseException] = []
    stop = threading.Event()

    def check_forever() -> None:
        while not stop.is_set():
            try:
                clients.check_handle(checker)
                clients.check_buffer(checker, 4096)
                clients.check_model(checker, 4096)
            except BaseException as exc:  # what the worker thread would die of
                failures.append(exc)
                return

    worker = threading.Thread(target=check_forever)
    worker.start()
    try:
        for _ in range(3000):
            others = [Client(pid=100 + i, uid=2000 + i % 5, gid=2000) for i in range(8)]
            for other in others:
                clients.admit(other)
            for other in others:
                clients.remove(other)
            if failures:
                break
    finally:
        stop.set()
        worker.join()
    assert failures == []
