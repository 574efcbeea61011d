"""The process's llama.cpp, loaded once: llama-cpp-python bound to the libraries'
libllama, the CPU and Hexagon backends loaded by path, the NPU found among ggml's
devices, and llama.cpp's log taken into the ``npu_client.llm`` logger."""

from __future__ import annotations

import collections
import ctypes
import importlib
import logging
import os
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from npu_client._errors import DeviceNotFound, InvalidArgument
from npu_client._llm_libraries import (
    HOW_TO_BUILD,
    LLAMA_CPP_PYTHON_VERSION,
    Libraries,
    locate_libraries,
    unavailable,
)
from npu_protocol import ErrorCode, format_message

HEXAGON_DEVICE: Final = "HTP0"
"""The Hexagon backend's first device: the NPU."""
MAX_BUFFER_MIB: Final = "256"
"""npud's largest buffer, in MiB (``GGML_HEXAGON_MBUF``: llama.cpp's default chunk is 1 GiB)."""
_GGML_LOG_CONT: Final = 5
_LOG_LEVELS: Final = {1: logging.DEBUG, 2: logging.DEBUG, 3: logging.WARNING, 4: logging.ERROR}
"""ggml's log levels (DEBUG, INFO, WARN, ERROR; CONT continues the line before) as the
``npu_client.llm`` logger's: its INFO lines describe the model, a debug level's worth."""

log: Final = logging.getLogger("npu_client.llm")


@dataclass(frozen=True)
class Connection:
    """How the Hexagon backend's library reaches npud (set once per process)."""

    socket: str
    name: str
    priority: str


class _Runtime:
    """The process's llama.cpp: the binding, the backends, the log; loaded once."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.binding: Any = None
        """The ``llama_cpp`` module once loaded."""
        self.libraries: Libraries | None = None
        self.connection: Connection | None = None
        self.errors: collections.deque[str] = collections.deque(maxlen=16)
        """llama.cpp's latest error and warning lines (its reasons for a failed load)."""
        self._log_callback: Any = None  # kept alive as long as llama.cpp may call it

    def ensure(self, connection: Connection) -> Any:
        """The binding, with both backends loaded and the NPU found; loads them the first
        time (for ``connection``). Raises LlmUnavailable, DeviceNotFound, InvalidArgument."""
        with self.lock:
            if self.binding is not None:
                assert self.connection is not None
                if connection.socket != self.connection.socket:
                    raise InvalidArgument(
                        format_message(
                            ErrorCode.INVALID_ARGUMENT,
                            detail=f"this process's llama.cpp reaches npud at "
                            f"{self.connection.socket} (its first load_llm), not "
                            f"{connection.socket}: one npud per process for LLMs",
                        )
                    )
                return self.binding
            libraries = locate_libraries()
            binding = _import_binding(libraries)
            self._take_log(binding)
            for name, value in (
                ("NPUD_SOCKET", connection.socket),
                ("NPUD_CLIENT_NAME", connection.name),
                ("NPUD_PRIORITY", connection.priority),
            ):
                os.environ[name] = value  # read by libcdsprpc when it connects
            os.environ.setdefault("GGML_HEXAGON_MBUF", MAX_BUFFER_MIB)
            _load_backends(libraries, self.errors, connection.socket)
            binding.llama_backend_init()
            self.binding, self.libraries, self.connection = binding, libraries, connection
            return binding

    def _take_log(self, binding: Any) -> None:
        """llama.cpp's log goes to the ``npu_client.llm`` logger (not to stderr), and its
        errors and warnings are kept for the messages of the errors raised here."""
        errors = self.errors
        last = [logging.DEBUG]

        @binding.llama_log_callback  # type: ignore[untyped-decorator]
        def callback(level: int, text: bytes, _user: ctypes.c_void_p) -> None:
            if level != _GGML_LOG_CONT:
                last[0] = _LOG_LEVELS.get(level, logging.DEBUG)
            line = text.decode("utf-8", "replace").rstrip()
            if not line:
                return
            if last[0] >= logging.WARNING:
                errors.append(line)
            log.log(last[0], "%s", line)

        self._log_callback = callback
        binding.llama_log_set(callback, ctypes.c_void_p(0))

    def reason(self) -> str:
        """llama.cpp's error lines since :meth:`errors` was last cleared, or a pointer to
        the log when it gave none."""
        if not self.errors:
            return "llama.cpp gave no reason (the npu_client.llm logger has its log)"
        return "; ".join(self.errors)

    def npu_reason(self) -> str | None:
        """The Hexagon backend's first error since the errors were cleared, if any."""
        return next((line for line in self.errors if line.startswith("ggml-hex")), None)


RUNTIME: Final = _Runtime()


def _import_binding(libraries: Libraries) -> Any:
    """llama-cpp-python, loading the libraries' libllama (never another)."""
    if "llama_cpp.llama_cpp" not in sys.modules:
        os.environ["LLAMA_CPP_LIB_PATH"] = str(libraries.directory)
    try:
        binding = importlib.import_module("llama_cpp")
    except ModuleNotFoundError:
        raise unavailable(
            f"llama-cpp-python {LLAMA_CPP_PYTHON_VERSION}, the binding: `make llm` installs it "
            "without building llama.cpp again (or: CMAKE_ARGS='-DLLAMA_BUILD=OFF "
            f"-DLLAVA_BUILD=OFF' pip install 'npu-client[llm]')"
        ) from None
    except (OSError, RuntimeError) as exc:  # libllama would not load
        raise unavailable(f"libllama from {libraries.directory}: {exc}") from None
    version = getattr(binding, "__version__", "?")
    if version != LLAMA_CPP_PYTHON_VERSION:
        raise unavailable(
            f"llama-cpp-python {LLAMA_CPP_PYTHON_VERSION} (installed: {version}; its ctypes "
            "bindings must match the libllama they call): `make llm` installs it"
        )
    built_for = libraries.version()
    if built_for and built_for != LLAMA_CPP_PYTHON_VERSION:
        raise unavailable(
            f"libraries built for llama-cpp-python {LLAMA_CPP_PYTHON_VERSION}: those in "
            f"{libraries.directory} are for {built_for}; " + HOW_TO_BUILD
        )
    loaded = Path(getattr(binding.llama_cpp._lib, "_name", ""))
    if loaded != libraries.libllama:
        raise unavailable(
            f"libllama from {libraries.directory}: llama_cpp was imported before load_llm "
            f"and loaded {loaded} (set LLAMA_CPP_LIB_PATH={libraries.directory} before "
            "importing it, or import it after the first load_llm)"
        )
    return binding


def _load_backends(libraries: Libraries, errors: collections.deque[str], socket: str) -> None:
    """The CPU and Hexagon backends into ggml's registry (by path: this process's
    executable is Python, beside which ggml_backend_load_all would look), then the NPU
    among its devices; raises LlmUnavailable or DeviceNotFound."""
    ggml = ctypes.CDLL(str(libraries.libggml))  # the libggml libllama loaded: the same one
    ggml.ggml_backend_load.restype = ctypes.c_void_p
    ggml.ggml_backend_load.argtypes = [ctypes.c_char_p]
    ggml.ggml_backend_dev_by_name.restype = ctypes.c_void_p
    ggml.ggml_backend_dev_by_name.argtypes = [ctypes.c_char_p]
    if not ggml.ggml_backend_load(os.fsencode(libraries.cpu_backend)):
        raise unavailable(f"llama.cpp's CPU backend would not load ({libraries.cpu_backend})")
    if not ggml.ggml_backend_load(os.fsencode(libraries.hexagon_backend)):
        reason = errors[-1] if errors else "no reason given"
        raise unavailable(
            f"llama.cpp's Hexagon backend would not load ({libraries.hexagon_backend}: {reason})"
        )
    if not ggml.ggml_backend_dev_by_name(HEXAGON_DEVICE.encode()):
        reason = errors[-1] if errors else "no reason given"
        raise DeviceNotFound(
            f"no NPU: llama.cpp's Hexagon backend found no device through npud at {socket} "
            f"({reason}); `npuctl status` shows npud's DSP, NPUD_SHIM_LOG=1 the library's "
            "side",
            fields={"tried": socket},
        )
