"""The library and the test programs, built once per session; npud, once per module."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.daemon import Npud, start_npud
from tests.shim.programs import C_DIR, SHIM, compile_program, make_library


@pytest.fixture(scope="session")
def shim_plain(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The library as it ships: libcdsprpc.so.1 and libcdsprpc.so."""
    return make_library(tmp_path_factory.mktemp("shim-plain"))


@pytest.fixture(scope="session")
def shim_asan(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_library(tmp_path_factory.mktemp("shim-asan"), sanitize=True)


@pytest.fixture(scope="session")
def shim_faults(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_library(tmp_path_factory.mktemp("shim-faults"), sanitize=True, faults=True)


@pytest.fixture(scope="session")
def api_test(tmp_path_factory: pytest.TempPathFactory, shim_asan: Path) -> Path:
    out = tmp_path_factory.mktemp("api-test") / "api_test"
    return compile_program(out, [C_DIR / "api_test.c"], library=shim_asan)


@pytest.fixture(scope="session")
def fault_run(tmp_path_factory: pytest.TempPathFactory, shim_faults: Path) -> Path:
    out = tmp_path_factory.mktemp("fault-run") / "fault_run"
    return compile_program(out, [C_DIR / "fault_run.c"], library=shim_faults)


@pytest.fixture(scope="session")
def dspq_test(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """dspqueue.c, its parts and the ring code linked with the fake DSP (and the fault hook)."""
    src = SHIM / "src"
    out = tmp_path_factory.mktemp("dspq-test") / "dspq_test"
    sources = [C_DIR / "dspq_test.c", C_DIR / "fake_dsp.c"] + [
        src / name
        for name in (
            "dspqueue.c",
            "dspq_domain.c",
            "dspq_packets.c",
            "dspq_ring.c",
            "dspq_rpc.c",
            "fault.c",
            "log.c",
            "errors.c",
        )
    ]
    return compile_program(out, sources, extra=(f"-I{src}", "-DSHIM_FAULTS"))


@pytest.fixture(scope="module")
def npud(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Npud]:
    """npud on the emulator, shared by the tests of a module (they leave it clean)."""
    daemon = start_npud(tmp_path_factory.mktemp("npud"))
    yield daemon
    assert daemon.stop() == 0, daemon.log()
