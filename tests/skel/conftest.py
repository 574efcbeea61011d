"""Build the host skels and the fake model libraries once per session, outside the source tree."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Final

import pytest

from tests.skel.portal_qnn_calls import PortalQnn
from tests.skel.remote_args import SkelLibrary
from tests.tools import require_tool

REPO: Final = Path(__file__).resolve().parents[2]
SKEL_DIR: Final = REPO / "skel"
FAKE_MODEL_SOURCE: Final = Path(__file__).with_name("fake_model.c")

# The same warnings as skel/Makefile: the fake model is held to the skels' standard.
CFLAGS: Final = (
    "-std=c11",
    "-O2",
    "-fPIC",
    "-pthread",
    "-shared",
    "-fvisibility=hidden",
    "-Wall",
    "-Wextra",
    "-Werror",
    "-Wshadow",
    "-Wconversion",
    "-Wsign-conversion",
    "-Wcast-qual",
)

FAKE_MODEL_VARIANTS: Final[dict[str, tuple[str, ...]]] = {
    "default": (),
    "eight_graphs": ("-DFAKE_MODEL_GRAPHS=8",),
    "nine_graphs": ("-DFAKE_MODEL_GRAPHS=9",),
    # 0xABCD in the high bits must not leak into qnn_status: 6004 = QNN_GRAPH_ERROR_INVALID_TENSOR
    "compose_fails": ("-DFAKE_MODEL_COMPOSE_ERROR=0xABCD00001774ull",),
    "finalize_fails": ("-DFAKE_MODEL_FINALIZE_ERROR=6022",),
    "unknown_type": ("-DFAKE_MODEL_INPUT_TYPE=0xDEAD",),
    # The longest name a spec holds (127 bytes), and one byte more: refused at load.
    "longest_name": (f'-DFAKE_MODEL_INPUT_NAME="{"n" * 127}"',),
    "long_name": (f'-DFAKE_MODEL_INPUT_NAME="{"n" * 128}"',),
    "unnamed": ("-DFAKE_MODEL_INPUT_NAME=NULL",),
    # The same for the graphs' names (graph_name).
    "longest_graph_name": (f'-DFAKE_MODEL_GRAPH_NAME="{"g" * 127}"',),
    "long_graph_name": (f'-DFAKE_MODEL_GRAPH_NAME="{"g" * 128}"',),
    "unnamed_graph": ("-DFAKE_MODEL_GRAPH_NAME=NULL",),
    "no_free": ("-DFAKE_MODEL_NO_FREE",),
    "gated": ("-DFAKE_MODEL_GATED",),
    "dynamic": ("-DFAKE_MODEL_DYNAMIC",),
}


def _need_compiler() -> None:
    require_tool("gcc", "gcc")
    require_tool("make", "make")


def build_host_skels(out: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["make", "-C", str(SKEL_DIR), "host", f"OUT={out}"],
        capture_output=True,
        text=True,
        check=False,
    )


@pytest.fixture(scope="session")
def skel_out(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Directory holding libecho_skel.so and libportal_qnn_skel.so."""
    _need_compiler()
    out = tmp_path_factory.mktemp("skel-host")
    built = build_host_skels(out)
    if built.returncode != 0:
        pytest.fail(f"make -C skel host failed:\n{built.stdout}\n{built.stderr}")
    return out


@pytest.fixture(scope="session")
def fake_models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Every fake model variant, compiled to its own library."""
    _need_compiler()
    out = tmp_path_factory.mktemp("fake-models")
    libraries: dict[str, Path] = {}
    for name, defines in FAKE_MODEL_VARIANTS.items():
        target = out / f"libfake_model_{name}.so"
        built = subprocess.run(
            [
                "gcc",
                *CFLAGS,
                f"-I{SKEL_DIR / 'include'}",
                *defines,
                "-o",
                str(target),
                str(FAKE_MODEL_SOURCE),
            ],
            capture_output=True,
            text=True,
            check=False,
        )
        if built.returncode != 0:
            pytest.fail(f"building fake model {name} failed:\n{built.stderr}")
        libraries[name] = target
    return libraries


@pytest.fixture(scope="session")
def echo_skel(skel_out: Path) -> SkelLibrary:
    return SkelLibrary(skel_out / "libecho_skel.so", "echo")


@pytest.fixture(scope="session")
def portal_skel(skel_out: Path) -> SkelLibrary:
    return SkelLibrary(skel_out / "libportal_qnn_skel.so", "portal_qnn")


@pytest.fixture
def portal(portal_skel: SkelLibrary) -> Iterator[PortalQnn]:
    """An open portal_qnn handle; closing it at the end must succeed."""
    opened = portal_skel.open("file:///libportal_qnn_skel.so?portal_qnn_skel_handle_invoke")
    assert opened.rc == 0
    handle = opened.handles[2]
    assert handle
    yield PortalQnn(portal_skel, handle)
    assert portal_skel.close(handle) == 0
