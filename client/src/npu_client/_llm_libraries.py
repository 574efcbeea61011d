"""Where ``load_llm``'s libraries are: the peer build's llama.cpp with its Hexagon
backend and npud's libcdsprpc.so, in one directory (``make llm``), and the binding
version they were built for; what is missing is :class:`LlmUnavailable`, saying how
to get it."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from npu_client._errors import Unsupported
from npu_protocol import ErrorCode, format_message

LLAMA_CPP_PYTHON_VERSION: Final = "0.3.36"
"""The binding's version: the one whose llama.cpp ``make peer-llama`` builds (the
binding's ctypes declarations must match the libllama they call)."""

LIBRARIES_ENV: Final = "NPUD_LLAMA_LIB"
"""The directory of the libraries (:func:`locate_libraries`), when not the peer cache's."""

PEER_CACHE_ENV: Final = "NPUD_PEER_CACHE"
VERSION_FILE: Final = "llama-cpp-python.version"
"""In the libraries' directory: the binding version their llama.cpp came with."""


class LlmUnavailable(Unsupported):
    """llama.cpp on the NPU cannot be used in this environment: the binding or the
    libraries are missing (or of another version). The message says which, and how to
    get them. A missing NPU is :class:`DeviceNotFound`."""


def unavailable(what: str) -> LlmUnavailable:
    return LlmUnavailable(format_message(ErrorCode.UNSUPPORTED, what=what), fields={"what": what})


@dataclass(frozen=True)
class Libraries:
    """The directory of libllama, the backends and npud's libcdsprpc.so."""

    directory: Path

    @property
    def libllama(self) -> Path:
        return self.directory / "libllama.so"

    @property
    def libggml(self) -> Path:
        return self.directory / "libggml.so"

    @property
    def cpu_backend(self) -> Path:
        return self.directory / "libggml-cpu.so"

    @property
    def hexagon_backend(self) -> Path:
        return self.directory / "libggml-hexagon.so"

    @property
    def libcdsprpc(self) -> Path:
        return self.directory / "libcdsprpc.so"

    def missing(self) -> list[str]:
        """The files that are not there (names), in the order they are needed."""
        wanted = (self.libllama, self.libggml, self.cpu_backend, self.hexagon_backend)
        return [path.name for path in (*wanted, self.libcdsprpc) if not path.exists()]

    def version(self) -> str:
        """The binding version the libraries were built for ("" when not recorded)."""
        try:
            return (self.directory / VERSION_FILE).read_text().strip()
        except OSError:
            return ""


HOW_TO_BUILD: Final = (
    "build them with `make llm` in npud's source tree (llama.cpp from the llama-cpp-python "
    f"{LLAMA_CPP_PYTHON_VERSION} sdist with its Hexagon backend against npud's "
    "libcdsprpc, about 10 minutes the first time), or name their directory in "
    f"${LIBRARIES_ENV}"
)


def default_libraries() -> Path:
    """Where ``make llm`` puts them: ``llm/`` in the peer build's cache."""
    cache = os.environ.get(PEER_CACHE_ENV)
    if not cache:
        base = os.environ.get("XDG_CACHE_HOME") or os.path.join(Path.home(), ".cache")
        cache = os.path.join(base, "npud-peer")
    return Path(cache) / "llm"


def locate_libraries() -> Libraries:
    """The libraries: ``$NPUD_LLAMA_LIB``, else the peer cache's ``llm/``
    (``$NPUD_PEER_CACHE``, ``$XDG_CACHE_HOME/npud-peer`` or ``~/.cache/npud-peer``).
    Raises :class:`LlmUnavailable` saying what is missing where and how to build it."""
    named = os.environ.get(LIBRARIES_ENV)
    directory = Path(named) if named else default_libraries()
    where = f"${LIBRARIES_ENV}={directory}" if named else str(directory)
    if not directory.is_dir():
        raise unavailable(
            f"llama.cpp's libraries with the Hexagon backend for npud: no {where}; " + HOW_TO_BUILD
        )
    libraries = Libraries(directory)
    missing = libraries.missing()
    if missing:
        raise unavailable(
            f"llama.cpp's libraries with the Hexagon backend for npud: {where} has no "
            f"{', '.join(missing)}; " + HOW_TO_BUILD
        )
    return libraries
