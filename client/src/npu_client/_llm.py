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
binding cannot load a backend of a ``GGML_BACKEND_DL`` build itself, so this
module loads the CPU and Hexagon backends by path with ggml's own
``ggml_backend_load``, once per process. The Hexagon backend then opens its
connection to npud (a DSP process of its own, as any llama.cpp program gets)
and keeps it until the process exits; ``NPUD_SOCKET``, ``NPUD_CLIENT_NAME`` and
``NPUD_PRIORITY`` are set from the first ``load_llm``'s client before it does.

Generation uses the binding's low-level functions, the calls llama.cpp's own
``llama-simple`` makes (decode, sample with llama.cpp's sampler chain, turn the
token into text), so a token costs Python a few foreign calls more than it
costs llama-simple. Nothing here is imported by ``import npu_client``; only
:func:`load` imports llama-cpp-python.
"""

from __future__ import annotations

import codecs
import collections
import contextlib
import ctypes
import importlib
import logging
import os
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import msgspec

from npu_client._errors import (
    DeviceNotFound,
    InvalidArgument,
    ModelFileUnreadable,
    ModelFormatError,
    ModelMalformed,
    ModelNotLoaded,
    SessionBusy,
    Unsupported,
)
from npu_protocol import ErrorCode, format_message

LLAMA_CPP_PYTHON_VERSION: Final = "0.3.36"
"""The binding's version: the one whose llama.cpp ``make peer-llama`` builds (the
binding's ctypes declarations must match the libllama they call)."""

LIBRARIES_ENV: Final = "NPUD_LLAMA_LIB"
"""The directory of the libraries (:func:`locate_libraries`), when not the peer cache's."""

PEER_CACHE_ENV: Final = "NPUD_PEER_CACHE"
VERSION_FILE: Final = "llama-cpp-python.version"
"""In the libraries' directory: the binding version their llama.cpp came with."""
HEXAGON_DEVICE: Final = "HTP0"
"""The Hexagon backend's first device: the NPU."""
MAX_BUFFER_MIB: Final = "256"
"""npud's largest buffer, in MiB (``GGML_HEXAGON_MBUF``: llama.cpp's default chunk is 1 GiB)."""
GGUF_MAGIC: Final = b"GGUF"
CONTEXT_STEP: Final = 256
"""llama.cpp rounds a context's size up to a multiple of this."""
_GGML_LOG_CONT: Final = 5
_LOG_LEVELS: Final = {1: logging.DEBUG, 2: logging.DEBUG, 3: logging.WARNING, 4: logging.ERROR}
"""ggml's log levels (DEBUG, INFO, WARN, ERROR; CONT continues the line before) as the
``npu_client.llm`` logger's: its INFO lines describe the model, a debug level's worth."""

log: Final = logging.getLogger("npu_client.llm")


class LlmUnavailable(Unsupported):
    """llama.cpp on the NPU cannot be used in this environment: the binding or the
    libraries are missing (or of another version). The message says which, and how to
    get them. A missing NPU is :class:`DeviceNotFound`."""


def _unavailable(what: str) -> LlmUnavailable:
    return LlmUnavailable(format_message(ErrorCode.UNSUPPORTED, what=what), fields={"what": what})


# --- where the libraries are ---------------------------------------------------------


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
        raise _unavailable(
            f"llama.cpp's libraries with the Hexagon backend for npud: no {where}; " + HOW_TO_BUILD
        )
    libraries = Libraries(directory)
    missing = libraries.missing()
    if missing:
        raise _unavailable(
            f"llama.cpp's libraries with the Hexagon backend for npud: {where} has no "
            f"{', '.join(missing)}; " + HOW_TO_BUILD
        )
    return libraries


# --- the process's llama.cpp ------------------------------------------------------------


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
        raise _unavailable(
            f"llama-cpp-python {LLAMA_CPP_PYTHON_VERSION}, the binding: `make llm` installs it "
            "without building llama.cpp again (or: CMAKE_ARGS='-DLLAMA_BUILD=OFF "
            f"-DLLAVA_BUILD=OFF' pip install 'npu-client[llm]')"
        ) from None
    except (OSError, RuntimeError) as exc:  # libllama would not load
        raise _unavailable(f"libllama from {libraries.directory}: {exc}") from None
    version = getattr(binding, "__version__", "?")
    if version != LLAMA_CPP_PYTHON_VERSION:
        raise _unavailable(
            f"llama-cpp-python {LLAMA_CPP_PYTHON_VERSION} (installed: {version}; its ctypes "
            "bindings must match the libllama they call): `make llm` installs it"
        )
    built_for = libraries.version()
    if built_for and built_for != LLAMA_CPP_PYTHON_VERSION:
        raise _unavailable(
            f"libraries built for llama-cpp-python {LLAMA_CPP_PYTHON_VERSION}: those in "
            f"{libraries.directory} are for {built_for}; " + HOW_TO_BUILD
        )
    loaded = Path(getattr(binding.llama_cpp._lib, "_name", ""))
    if loaded != libraries.libllama:
        raise _unavailable(
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
        raise _unavailable(f"llama.cpp's CPU backend would not load ({libraries.cpu_backend})")
    if not ggml.ggml_backend_load(os.fsencode(libraries.hexagon_backend)):
        reason = errors[-1] if errors else "no reason given"
        raise _unavailable(
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


# --- a model on the NPU -----------------------------------------------------------------------


class Sampling(msgspec.Struct, frozen=True, kw_only=True):
    """How the next token is chosen: ``temperature`` 0 is greedy (the most likely token);
    above 0, llama.cpp's chain top-k, top-p, temperature and a draw seeded by ``seed``
    (None: a new seed each time)."""

    temperature: float = 0.8
    top_k: int = 40
    top_p: float = 0.95
    seed: int | None = None

    def check(self) -> None:
        problems = []
        if not 0 <= self.temperature < float("inf"):
            problems.append(f"temperature must be 0 or more, not {self.temperature}")
        if self.top_k < 0:
            problems.append(f"top_k must be 0 (off) or more, not {self.top_k}")
        if not 0 < self.top_p <= 1:
            problems.append(f"top_p must be in (0, 1], not {self.top_p}")
        if self.seed is not None and not 0 <= self.seed < 2**32:
            problems.append(f"seed must be a u32, not {self.seed}")
        if problems:
            raise _invalid("; ".join(problems))


class LlmStatistics(msgspec.Struct, frozen=True, kw_only=True):
    """The last generation: its prompt's and its own tokens and times (0 before one)."""

    prompt_tokens: int = 0
    tokens: int = 0
    """Tokens generated (the end-of-generation token not counted)."""
    first_token_s: float = 0.0
    """From the call to the first token chosen: the prompt's evaluation and one sample."""
    seconds: float = 0.0
    """From the call to the last token."""
    tokens_per_s: float = 0.0
    """``tokens / seconds``: as llama-simple counts, the prompt's evaluation included."""
    stopped_by: str = ""
    """``eog`` (the model ended), ``length`` (``max_tokens``), ``context`` (the context
    was full), ``stop`` (a stop string), ``closed`` (the LLM was closed) or ``error``."""


class Piece(msgspec.Struct, frozen=True):
    """Text and the tokens it came from, as a generation hands them out."""

    text: str
    tokens: tuple[int, ...]


def _invalid(detail: str) -> InvalidArgument:
    return InvalidArgument(
        format_message(ErrorCode.INVALID_ARGUMENT, detail=detail), fields={"detail": detail}
    )


def check_request(max_tokens: int | None, sampling: Sampling, stop: Sequence[str]) -> None:
    """A generation's arguments, or InvalidArgument saying what is wrong."""
    sampling.check()
    if max_tokens is not None and (isinstance(max_tokens, bool) or max_tokens < 1):
        raise _invalid(f"max_tokens must be at least 1 (or None), not {max_tokens}")
    if any(not isinstance(text, str) or not text for text in stop):
        raise _invalid("a stop string is a non-empty str")


def check_model_file(path: Path) -> None:
    """A readable GGUF file, or ModelFileUnreadable / ModelFormatError saying why."""
    try:
        with path.open("rb") as file:
            head = file.read(4)
    except OSError as exc:
        detail = f"{path}: {exc.strerror or exc}"
        raise ModelFileUnreadable(
            format_message(ErrorCode.MODEL_FILE_UNREADABLE, detail=detail),
            fields={"detail": detail},
        ) from None
    if head != GGUF_MAGIC:
        detail = (
            f"{path} is not a GGUF file (load_llm takes llama.cpp's GGUF models; "
            "load_model takes the NPU's own model files)"
        )
        raise ModelFormatError(
            format_message(ErrorCode.MODEL_FORMAT, detail=detail), fields={"detail": detail}
        )


class LlmCore:
    """One model and its context on the NPU. Thread-safe: a step (one token) runs under
    the step lock; :meth:`close` waits for the step running, then frees everything.
    The clients' ``Llm`` give it one generation at a time (:class:`Generation`)."""

    def __init__(self, binding: Any, path: Path, *, n_ctx: int, n_threads: int | None) -> None:
        self._lib = binding
        self.path = path
        self._step = threading.Lock()
        self._closed = False
        self._active: Generation | None = None
        self.statistics = LlmStatistics()
        params = binding.llama_model_default_params()
        params.n_gpu_layers = 999  # every layer on the NPU
        RUNTIME.errors.clear()
        model = binding.llama_model_load_from_file(os.fsencode(path), params)
        if not model:
            npu = RUNTIME.npu_reason()
            if npu is not None:
                socket = RUNTIME.connection.socket if RUNTIME.connection else "?"
                raise DeviceNotFound(
                    f"llama.cpp could not use the NPU through npud at {socket}: {npu} "
                    "(NPUD_SHIM_LOG=1 shows what npud answered: a DSP process of its own, "
                    "which [domains] allow_isolate may refuse, or npud's quotas)",
                    fields={"tried": socket},
                )
            detail = f"llama.cpp cannot load {path}: {RUNTIME.reason()}"
            raise ModelMalformed(
                format_message(ErrorCode.MODEL_MALFORMED, detail=detail), fields={"detail": detail}
            )
        self._model: Any = model
        context = binding.llama_context_default_params()
        # llama.cpp rounds the context up to a multiple of 256 (and a batch down to the
        # context asked for): asked so, a prompt that fills the context goes in one batch.
        context.n_ctx = context.n_batch = -(-n_ctx // CONTEXT_STEP) * CONTEXT_STEP
        context.no_perf = False
        if n_threads is not None:
            context.n_threads = context.n_threads_batch = n_threads
        ctx = binding.llama_init_from_model(model, context)
        if not ctx:
            binding.llama_model_free(model)
            detail = f"llama.cpp cannot make a context of {n_ctx} tokens: {RUNTIME.reason()}"
            raise ModelMalformed(
                format_message(ErrorCode.MODEL_MALFORMED, detail=detail), fields={"detail": detail}
            )
        self._ctx: Any = ctx
        self._vocab: Any = binding.llama_model_get_vocab(model)
        self.n_ctx = int(binding.llama_n_ctx(ctx))
        self.n_batch = int(binding.llama_n_batch(ctx))
        """The most tokens one decode takes: the longest prompt."""
        self.n_ctx_train = int(binding.llama_model_n_ctx_train(model))
        self.description = self._model_desc()
        self._piece = ctypes.create_string_buffer(256)

    @property
    def closed(self) -> bool:
        return self._closed

    def _model_desc(self) -> str:
        buffer = ctypes.create_string_buffer(128)
        length = self._lib.llama_model_desc(self._model, buffer, len(buffer))
        return buffer.raw[: max(length, 0)].decode("utf-8", "replace")

    # --- text and tokens ------------------------------------------------------------------

    def tokenize(self, text: str, *, special: bool = True) -> list[int]:
        """``text``'s tokens; ``special``: begin with the model's BOS and read control
        tokens written in the text (as llama-simple tokenizes its prompt)."""
        with self._step:
            self._check_open()
            data = text.encode("utf-8")
            capacity = len(data) + 8
            while True:
                tokens = (self._lib.llama_token * capacity)()
                count = self._lib.llama_tokenize(
                    self._vocab, data, len(data), tokens, capacity, special, special
                )
                if count >= 0:
                    return list(tokens[:count])
                capacity = -count

    def detokenize(self, tokens: Sequence[int]) -> str:
        """The text of ``tokens`` (special tokens as their text)."""
        with self._step:
            self._check_open()
            decoder = codecs.getincrementaldecoder("utf-8")("replace")
            text = [decoder.decode(self._piece_of(int(token))) for token in tokens]
            return "".join(text) + decoder.decode(b"", final=True)

    def _piece_of(self, token: int) -> bytes:
        """A token's bytes (under the step lock)."""
        size = self._lib.llama_token_to_piece(
            self._vocab, token, self._piece, len(self._piece), 0, True
        )
        if size < 0:  # longer than the buffer: make room once
            self._piece = ctypes.create_string_buffer(-size)
            size = self._lib.llama_token_to_piece(
                self._vocab, token, self._piece, len(self._piece), 0, True
            )
        return self._piece.raw[: max(size, 0)]

    def chat_template(self) -> str | None:
        """The model's chat template (GGUF ``tokenizer.chat_template``), or None."""
        with self._step:
            self._check_open()
            template = self._lib.llama_model_chat_template(self._model, None)
            return template.decode("utf-8", "replace") if template else None

    def apply_chat_template(self, messages: Sequence[tuple[str, str]], *, assistant: bool) -> str:
        """``messages`` ((role, content) pairs) as the model's chat template writes them,
        with the assistant's turn opened when ``assistant``; InvalidArgument when the
        model has no template llama.cpp knows."""
        template = self.chat_template()
        if template is None:
            raise _invalid(f"{self.path.name} has no chat template")
        lib = self._lib
        keep = [(role.encode(), content.encode()) for role, content in messages]
        chat = (lib.llama_chat_message * max(len(keep), 1))()
        for index, (role, content) in enumerate(keep):
            chat[index].role = role
            chat[index].content = content
        size = sum(len(role) + len(content) for role, content in keep) * 2 + 256
        for _ in range(2):
            buffer = ctypes.create_string_buffer(size)
            length = lib.llama_chat_apply_template(
                template.encode(), chat, len(keep), assistant, buffer, size
            )
            if length < 0:
                raise _invalid(f"llama.cpp does not know {self.path.name}'s chat template")
            if length <= size:
                return buffer.raw[:length].decode("utf-8", "replace")
            size = length
        raise _invalid("the chat template's text kept growing")

    # --- generation --------------------------------------------------------------------------

    def begin(
        self, prompt: str, *, max_tokens: int | None, sampling: Sampling, stop: Sequence[str]
    ) -> Generation:
        """A new generation of ``prompt``: the context starts empty. The caller makes
        sure one runs at a time (a later one supersedes an unfinished earlier one)."""
        check_request(max_tokens, sampling, stop)
        if not isinstance(prompt, str):
            raise TypeError(f"the prompt is a str, not {type(prompt).__name__}")
        tokens = self.tokenize(prompt)
        if not tokens:
            raise _invalid("the prompt is empty and the model adds no BOS token")
        if len(tokens) >= self.n_ctx:
            raise _invalid(
                f"the prompt is {len(tokens)} tokens and the context holds {self.n_ctx} "
                "(load_llm's n_ctx): nothing is left to generate"
            )
        if len(tokens) > self.n_batch:
            raise _invalid(
                f"the prompt is {len(tokens)} tokens and llama.cpp takes {self.n_batch} at once"
            )
        with self._step:
            self._check_open()
            if self._active is not None and not self._active.done:
                self._active.superseded = True  # its next step says so
                self._active.free_sampler()
            generation = Generation(self, tokens, max_tokens, sampling, tuple(stop))
            self._active = generation
            return generation

    def close(self) -> None:
        """Free the context and the model (their NPU memory goes back to npud); waits
        for the step running. Idempotent."""
        with self._step:
            if self._closed:
                return
            self._closed = True
            if self._active is not None:
                self._active.free_sampler()
            self._lib.llama_free(self._ctx)
            self._lib.llama_model_free(self._model)
            self._ctx = self._model = self._vocab = None

    def _check_open(self) -> None:
        if self._closed:
            raise ModelNotLoaded(
                f"the LLM {self.path.name} was closed", fields={"model": self.path.name}
            )


class Generation:
    """One completion: :meth:`step` decodes and samples one token at a time, and the
    text comes out in :class:`Piece` s, held back while it might be the start of a stop
    string. Not thread-safe by itself: its owner drives it from one thread at a time
    (a step takes the model's step lock)."""

    def __init__(
        self,
        core: LlmCore,
        prompt: list[int],
        max_tokens: int | None,
        sampling: Sampling,
        stop: tuple[str, ...],
    ) -> None:
        self._core = core
        self._lib = core._lib
        self.prompt = prompt
        self.max_tokens = max_tokens
        self.stop = stop
        self.superseded = False
        self.done = False
        self.tokens = 0
        self._sampler: Any = None
        self._started = 0.0
        self._first = 0.0
        self._decoder = codecs.getincrementaldecoder("utf-8")("replace")
        self._text = ""
        """Text decoded and not handed out yet."""
        self._held: list[tuple[int, int]] = []
        """(token, its text's end in ``_text``) of tokens not handed out yet."""
        self._next: Any = None  # the batch to decode next (the prompt, then each token)
        self._last = (self._lib.llama_token * 1)()
        self._make_sampler(sampling)

    def _make_sampler(self, sampling: Sampling) -> None:
        lib = self._lib
        chain = lib.llama_sampler_chain_init(lib.llama_sampler_chain_default_params())
        if sampling.temperature <= 0:
            lib.llama_sampler_chain_add(chain, lib.llama_sampler_init_greedy())
        else:
            if sampling.top_k > 0:
                lib.llama_sampler_chain_add(chain, lib.llama_sampler_init_top_k(sampling.top_k))
            if sampling.top_p < 1:
                lib.llama_sampler_chain_add(chain, lib.llama_sampler_init_top_p(sampling.top_p, 1))
            lib.llama_sampler_chain_add(chain, lib.llama_sampler_init_temp(sampling.temperature))
            seed = lib.LLAMA_DEFAULT_SEED if sampling.seed is None else sampling.seed
            lib.llama_sampler_chain_add(chain, lib.llama_sampler_init_dist(seed))
        self._sampler = chain

    def free_sampler(self) -> None:
        """Give the sampler chain back (under the step lock, or when no step can run)."""
        if self._sampler is not None:
            self._lib.llama_sampler_free(self._sampler)
            self._sampler = None

    def step(self) -> Piece | None:
        """Decode and sample one token; the text now safe to hand out (maybe empty; at
        the end, what was held back), or None once the generation is over (then
        :attr:`LlmCore.statistics` says how it ended)."""
        core = self._core
        if self.done:
            return None
        with core._step:
            if core._closed:
                self._finish("closed")
                core._check_open()
            if self.superseded:
                raise SessionBusy("a later generation on this LLM replaced this one: one at a time")
            lib = self._lib
            if self._next is None:  # the first step: the prompt
                lib.llama_memory_clear(lib.llama_get_memory(core._ctx), True)
                self._started = time.perf_counter()
                prompt = (lib.llama_token * len(self.prompt))(*self.prompt)
                self._prompt_array = prompt  # the batch points into it
                self._next = lib.llama_batch_get_one(prompt, len(self.prompt))
            elif self.max_tokens is not None and self.tokens >= self.max_tokens:
                return self._finish("length")
            elif len(self.prompt) + self.tokens >= core.n_ctx:
                return self._finish("context")
            self._decode(self._next)
            token = int(lib.llama_sampler_sample(self._sampler, core._ctx, -1))
            if self.tokens == 0:
                self._first = time.perf_counter()
            if lib.llama_vocab_is_eog(core._vocab, token):
                return self._finish("eog")
            self.tokens += 1
            self._text += self._decoder.decode(core._piece_of(token))
            self._held.append((token, len(self._text)))
            self._last[0] = token
            self._next = lib.llama_batch_get_one(self._last, 1)
        return self._release()

    def _decode(self, batch: Any) -> None:
        """One llama_decode (under the step lock); its failure ends the generation."""
        status = self._lib.llama_decode(self._core._ctx, batch)
        if status != 0:
            self._finish("error")
            detail = f"llama.cpp's decode failed ({status}): {RUNTIME.reason()}"
            raise ModelMalformed(
                format_message(ErrorCode.MODEL_MALFORMED, detail=detail), fields={"detail": detail}
            )

    def _release(self) -> Piece:
        """What may be handed out: up to a stop string found (then the generation is
        over, the stop string and what follows dropped), else all but a tail that may
        begin one."""
        for stop in self.stop:
            at = self._text.find(stop)
            if at >= 0:
                piece = self._take(at)
                self._finish("stop")
                self._text, self._held = "", []
                return piece
        safe = len(self._text) - _longest_prefix_tail(self._text, self.stop)
        return self._take(safe)

    def _take(self, end: int) -> Piece:
        text, self._text = self._text[:end], self._text[end:]
        given = [token for token, until in self._held if until <= end]
        self._held = [(token, until - end) for token, until in self._held if until > end]
        return Piece(text, tuple(given))

    def _finish(self, why: str) -> Piece:
        """Over: the statistics, the sampler back, and what was held back (the whole
        rest of the text: no stop string can begin in it any more)."""
        self.done = True
        now = time.perf_counter()
        seconds = now - self._started if self._started else 0.0
        self._core.statistics = LlmStatistics(
            prompt_tokens=len(self.prompt),
            tokens=self.tokens,
            first_token_s=self._first - self._started if self._first else 0.0,
            seconds=seconds,
            tokens_per_s=self.tokens / seconds if seconds > 0 else 0.0,
            stopped_by=why,
        )
        self.free_sampler()
        self._text += self._decoder.decode(b"", final=True)
        return self._take(len(self._text))

    def pieces(self) -> Iterator[Piece]:
        """Every non-empty piece to the end (drives :meth:`step` on the calling thread)."""
        while (piece := self.step()) is not None:
            if piece.text or piece.tokens:
                yield piece


def _longest_prefix_tail(text: str, stops: Sequence[str]) -> int:
    """The length of the longest end of ``text`` that begins some stop string."""
    longest = 0
    for stop in stops:
        for size in range(min(len(stop) - 1, len(text)), longest, -1):
            if text.endswith(stop[:size]):
                longest = size
                break
    return longest


def load(connection: Connection, path: str | os.PathLike[str], *, n_ctx: int,
         n_threads: int | None) -> LlmCore:  # fmt: skip
    """A model on the NPU (the process's llama.cpp loaded first if need be)."""
    if not 8 <= n_ctx <= 1 << 20:
        raise _invalid(f"n_ctx must be 8..{1 << 20} tokens, not {n_ctx}")
    if n_threads is not None and not 1 <= n_threads <= 1024:
        raise _invalid(f"n_threads must be 1..1024, not {n_threads}")
    model = Path(path)
    check_model_file(model)
    binding = RUNTIME.ensure(connection)
    with contextlib.suppress(OSError):
        model = model.resolve()
    return LlmCore(binding, model, n_ctx=n_ctx, n_threads=n_threads)
