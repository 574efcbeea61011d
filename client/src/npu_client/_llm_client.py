"""``Client.load_llm``'s object: an LLM on the NPU, generating in the calling process."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Final, Self

from npu_client._errors import SessionBusy
from npu_client._llm import Generation, LlmCore, LlmStatistics, Piece, Sampling, check_request

DEFAULT_N_CTX: Final = 512
"""Tokens of context, prompt and answer together (llama-cpp-python's default)."""
DEFAULT_MAX_TOKENS: Final = 256

Messages = Sequence[Mapping[str, str]]
"""Chat messages: ``{"role": "system" | "user" | "assistant", "content": text}``."""


def chat_pairs(messages: Messages) -> list[tuple[str, str]]:
    """``messages`` as (role, content), refusing what is not a chat message."""
    pairs = []
    for message in messages:
        role, content = message.get("role"), message.get("content")
        if not isinstance(role, str) or not isinstance(content, str):
            raise TypeError(f"a chat message has a str role and content: {message!r}")
        pairs.append((role, content))
    return pairs


def stop_strings(stop: str | Sequence[str]) -> tuple[str, ...]:
    return (stop,) if isinstance(stop, str) else tuple(stop)


class Llm:
    """An LLM (a GGUF model) on the NPU: llama.cpp in this process, its work on the DSP
    through npud. Make one with :meth:`Client.load_llm`; close it (or use ``with``) to
    give its memory back. Closing its client closes it too.

    Each generation starts from an empty context (``n_ctx`` tokens for the prompt and
    the answer together) and ends at the model's end of text, after ``max_tokens``
    (None: until the context is full), or before the first ``stop`` string (not
    included). ``temperature`` 0 picks the most likely token each time (greedy);
    above 0, llama.cpp's top-k, top-p and temperature shape a draw seeded by ``seed``
    (None: a new seed each time). Threads may share an LLM: generations take turns.
    A stream holds the turn until it is finished or closed.
    """

    def __init__(self, core: LlmCore, on_close: Callable[[Llm], None]) -> None:
        """Internal: use :meth:`Client.load_llm`. Takes ownership of ``core``."""
        self._core = core
        self._on_close = on_close
        self._turn = threading.Lock()
        self._owner: int | None = None
        """The thread whose generation holds the turn."""

    # --- what it is ----------------------------------------------------------------------

    @property
    def path(self) -> Path:
        """The model file."""
        return self._core.path

    @property
    def n_ctx(self) -> int:
        """Tokens of context: prompt and answer together."""
        return self._core.n_ctx

    @property
    def n_ctx_train(self) -> int:
        """The context the model was trained with."""
        return self._core.n_ctx_train

    @property
    def description(self) -> str:
        """llama.cpp's description of the model (architecture, size, type)."""
        return self._core.description

    @property
    def closed(self) -> bool:
        return self._core.closed

    def statistics(self) -> LlmStatistics:
        """The last generation's tokens and times."""
        return self._core.statistics

    # --- generating -----------------------------------------------------------------------

    def generate(
        self,
        prompt: str,
        *,
        max_tokens: int | None = DEFAULT_MAX_TOKENS,
        temperature: float = 0.8,
        top_k: int = 40,
        top_p: float = 0.95,
        seed: int | None = None,
        stop: str | Sequence[str] = (),
    ) -> str:
        """The whole text the model writes after ``prompt`` (see the class for the rest)."""
        sampling = Sampling(temperature=temperature, top_k=top_k, top_p=top_p, seed=seed)
        with self._taking_turn():
            generation = self._begin(prompt, max_tokens, sampling, stop)
            return "".join(piece.text for piece in generation.pieces())

    def stream(
        self,
        prompt: str,
        *,
        max_tokens: int | None = DEFAULT_MAX_TOKENS,
        temperature: float = 0.8,
        top_k: int = 40,
        top_p: float = 0.95,
        seed: int | None = None,
        stop: str | Sequence[str] = (),
    ) -> Iterator[str]:
        """The text as it is written: pieces of whole characters, one token's or a few
        (text that may begin a stop string waits until it cannot)."""
        sampling = Sampling(temperature=temperature, top_k=top_k, top_p=top_p, seed=seed)
        check_request(max_tokens, sampling, stop_strings(stop))
        return (piece.text for piece in self._pieces(prompt, max_tokens, sampling, stop))

    def tokens(
        self,
        prompt: str,
        *,
        max_tokens: int | None = DEFAULT_MAX_TOKENS,
        temperature: float = 0.8,
        top_k: int = 40,
        top_p: float = 0.95,
        seed: int | None = None,
        stop: str | Sequence[str] = (),
    ) -> Iterator[int]:
        """The tokens (their ids) as they are chosen, as :meth:`stream` hands out their
        text (the end-of-text token is not one of them)."""
        sampling = Sampling(temperature=temperature, top_k=top_k, top_p=top_p, seed=seed)
        check_request(max_tokens, sampling, stop_strings(stop))
        return (
            token
            for piece in self._pieces(prompt, max_tokens, sampling, stop)
            for token in piece.tokens
        )

    def _pieces(
        self, prompt: str, max_tokens: int | None, sampling: Sampling, stop: str | Sequence[str]
    ) -> Iterator[Piece]:
        with self._taking_turn():
            yield from self._begin(prompt, max_tokens, sampling, stop).pieces()

    def _begin(
        self, prompt: str, max_tokens: int | None, sampling: Sampling, stop: str | Sequence[str]
    ) -> Generation:
        return self._core.begin(
            prompt, max_tokens=max_tokens, sampling=sampling, stop=stop_strings(stop)
        )

    @contextlib.contextmanager
    def _taking_turn(self) -> Iterator[None]:
        me = threading.get_ident()
        if self._owner == me:
            raise SessionBusy(
                "this thread's earlier stream of this LLM is still open: finish it or "
                "close it (stream.close()) before the next generation"
            )
        with self._turn:
            self._owner = me
            try:
                yield
            finally:
                self._owner = None

    # --- text and tokens --------------------------------------------------------------------

    def tokenize(self, text: str, *, special: bool = True) -> list[int]:
        """``text``'s tokens; ``special``: the model's BOS first and control tokens written
        in the text read as such (as a prompt is)."""
        return self._core.tokenize(text, special=special)

    def detokenize(self, tokens: Sequence[int]) -> str:
        return self._core.detokenize(tokens)

    def apply_chat_template(self, messages: Messages, *, add_assistant: bool = True) -> str:
        """The prompt the model's own chat template (in its GGUF) makes of ``messages``,
        the assistant's turn opened when ``add_assistant``. InvalidArgument when the model
        has none (or one llama.cpp does not know)."""
        return self._core.apply_chat_template(chat_pairs(messages), assistant=add_assistant)

    # --- closing ------------------------------------------------------------------------------

    def close(self) -> None:
        """Free the model and its context: their NPU memory goes back to npud (the
        process's connection for LLMs stays). Waits for a token being made; a stream
        still open then fails with ModelNotLoaded. Idempotent."""
        self._core.close()
        self._on_close(self)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self.closed else f"n_ctx {self.n_ctx}"
        return f"<npu_client.Llm {self.path.name} {state}>"
