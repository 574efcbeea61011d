"""A model and its context on the NPU (:class:`LlmCore`): the GGUF file checked,
loaded by llama.cpp, tokenized and detokenized, its chat template applied, one
:class:`~npu_client._llm_generation.Generation` at a time begun on it."""

from __future__ import annotations

import codecs
import ctypes
import os
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Final

from npu_client._errors import (
    DeviceNotFound,
    ModelFileUnreadable,
    ModelFormatError,
    ModelMalformed,
    ModelNotLoaded,
)
from npu_client._llm_generation import (
    Generation,
    LlmStatistics,
    Sampling,
    check_request,
    invalid,
)
from npu_client._llm_runtime import RUNTIME
from npu_protocol import ErrorCode, format_message

GGUF_MAGIC: Final = b"GGUF"
CONTEXT_STEP: Final = 256
"""llama.cpp rounds a context's size up to a multiple of this."""


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
            raise invalid(f"{self.path.name} has no chat template")
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
                raise invalid(f"llama.cpp does not know {self.path.name}'s chat template")
            if length <= size:
                return buffer.raw[:length].decode("utf-8", "replace")
            size = length
        raise invalid("the chat template's text kept growing")

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
            raise invalid("the prompt is empty and the model adds no BOS token")
        if len(tokens) >= self.n_ctx:
            raise invalid(
                f"the prompt is {len(tokens)} tokens and the context holds {self.n_ctx} "
                "(load_llm's n_ctx): nothing is left to generate"
            )
        if len(tokens) > self.n_batch:
            raise invalid(
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
