"""llama.cpp on the NPU through npud, in the calling process: what ``load_llm`` stands on.

The binding is llama-cpp-python (``pip install 'npu-client[llm]'``): its ctypes
bindings of libllama, at the version whose llama.cpp ``make peer-llama`` builds
(:data:`LLAMA_CPP_PYTHON_VERSION`), installed without a llama.cpp of its own
(``make llm``). The libraries are the peer build's, gathered in one directory
(:func:`locate_libraries`): libllama and the ggml libraries it needs, the CPU
backend, the Hexagon backend (libggml-hexagon.so, built against npud's headers)
and beside it ``libcdsprpc.so``, npud's library, which the Hexagon backend
loads from its own directory. llama-cpp-python loads libllama from there
(``LLAMA_CPP_LIB_PATH``, read when ``llama_cpp`` is first imported); the
binding cannot load a backend of a ``GGML_BACKEND_DL`` build itself, so
:mod:`~npu_client._llm_runtime` loads the CPU and Hexagon backends by path with ggml's own
``ggml_backend_load``, once per process. The Hexagon backend then opens its
connection to npud (a DSP process of its own, as any llama.cpp program gets)
and keeps it until the process exits; ``NPUD_SOCKET``, ``NPUD_CLIENT_NAME`` and
``NPUD_PRIORITY`` are set from the first ``load_llm``'s client before it does.

Generation uses the binding's low-level functions, the calls llama.cpp's own
``llama-simple`` makes (decode, sample with llama.cpp's sampler chain, turn the
token into text), so a token costs Python a few foreign calls more than it
costs llama-simple. Nothing here is imported by ``import npu_client``; only
:func:`load` imports llama-cpp-python.

The parts: :mod:`~npu_client._llm_libraries` (where the libraries are),
:mod:`~npu_client._llm_runtime` (the process's llama.cpp, loaded once),
:mod:`~npu_client._llm_model` (a model and its context) and
:mod:`~npu_client._llm_generation` (one generation); this module loads a model
and re-exports their names.
"""

from __future__ import annotations

import contextlib
import importlib
import os
from pathlib import Path

from npu_client._llm_generation import (
    Generation,
    LlmStatistics,
    Piece,
    Sampling,
    _longest_prefix_tail,
    check_request,
    invalid,
)
from npu_client._llm_libraries import (
    HOW_TO_BUILD,
    LIBRARIES_ENV,
    LLAMA_CPP_PYTHON_VERSION,
    PEER_CACHE_ENV,
    VERSION_FILE,
    Libraries,
    LlmUnavailable,
    default_libraries,
    locate_libraries,
)
from npu_client._llm_model import CONTEXT_STEP, GGUF_MAGIC, LlmCore, check_model_file
from npu_client._llm_runtime import RUNTIME, Connection, _import_binding, _load_backends

__all__ = [
    "CONTEXT_STEP",
    "GGUF_MAGIC",
    "HOW_TO_BUILD",
    "LIBRARIES_ENV",
    "LLAMA_CPP_PYTHON_VERSION",
    "PEER_CACHE_ENV",
    "RUNTIME",
    "VERSION_FILE",
    "Connection",
    "Generation",
    "Libraries",
    "LlmCore",
    "LlmStatistics",
    "LlmUnavailable",
    "Piece",
    "Sampling",
    "_import_binding",
    "_load_backends",
    "_longest_prefix_tail",
    "check_model_file",
    "check_request",
    "default_libraries",
    "importlib",
    "load",
    "locate_libraries",
]


def load(connection: Connection, path: str | os.PathLike[str], *, n_ctx: int,
         n_threads: int | None) -> LlmCore:  # fmt: skip
    """A model on the NPU (the process's llama.cpp loaded first if need be)."""
    if not 8 <= n_ctx <= 1 << 20:
        raise invalid(f"n_ctx must be 8..{1 << 20} tokens, not {n_ctx}")
    if n_threads is not None and not 1 <= n_threads <= 1024:
        raise invalid(f"n_threads must be 1..1024, not {n_threads}")
    model = Path(path)
    check_model_file(model)
    binding = RUNTIME.ensure(connection)
    with contextlib.suppress(OSError):
        model = model.resolve()
    return LlmCore(binding, model, n_ctx=n_ctx, n_threads=n_threads)
