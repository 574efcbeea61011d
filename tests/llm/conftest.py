"""llama.cpp on the NPU through npud from Python (``load_llm``): these tests need the peer
build (``make llm``, or ``make peer-llama``, which CI runs before them). Without it they
skip, unless ``$NPUD_REQUIRE_PEER`` is set (CI's peer step): then they fail.

One npud (on the emulator) serves the whole module's LLMs: a process's llama.cpp
reaches one npud (the first ``load_llm`` decides which).
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Final, NoReturn

import pytest

from npu_client._llm import Libraries, LlmUnavailable, locate_libraries
from tests.e2e.daemon import Npud, start_npud

REQUIRE_PEER_ENV: Final = "NPUD_REQUIRE_PEER"
MODELS: Final = ("f16", "q8_0", "q4_0")
PROMPT: Final = "hello world"


def missing(what: str) -> NoReturn:
    """Skip (or, with $NPUD_REQUIRE_PEER, fail): ``what`` says what is missing and how to
    get it."""
    message = what
    if os.environ.get(REQUIRE_PEER_ENV, "") not in ("", "0"):
        pytest.fail(f"{message}; ${REQUIRE_PEER_ENV} forbids skipping", pytrace=False)
    pytest.skip(message)


@pytest.fixture(scope="session")
def libraries() -> Libraries:
    try:
        found = locate_libraries()
    except LlmUnavailable as exc:
        missing(str(exc))
    if importlib.util.find_spec("llama_cpp") is None:
        missing("llama-cpp-python is not installed: `make llm` installs it")
    return found


@pytest.fixture(scope="session")
def models(libraries: Libraries) -> Path:
    """The peer build's tiny GGUF llamas (its ``models`` step), beside ``llm/``."""
    directory = libraries.directory.parent / "models"
    if not all((directory / f"tiny-llama-{kind}.gguf").exists() for kind in MODELS):
        missing(f"the tiny GGUF models in {directory}: `make peer-llama` makes them")
    return directory


@pytest.fixture(scope="session")
def npud(tmp_path_factory: pytest.TempPathFactory, libraries: Libraries) -> Iterator[Npud]:
    daemon = start_npud(tmp_path_factory.mktemp("llm-npud"))
    yield daemon
    assert daemon.stop() == 0, daemon.log()


def model(models: Path, kind: str) -> Path:
    return models / f"tiny-llama-{kind}.gguf"
