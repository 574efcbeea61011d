"""A generation on an LLM: its arguments (:class:`Sampling`, :func:`check_request`),
the step that decodes and samples one token, the text handed out in :class:`Piece` s
(held back while it might begin a stop string), and its :class:`LlmStatistics`."""

from __future__ import annotations

import codecs
import threading
import time
from collections.abc import Iterator, Sequence
from typing import Any, Protocol

import msgspec

from npu_client._errors import InvalidArgument, ModelMalformed, SessionBusy
from npu_client._llm_runtime import RUNTIME
from npu_protocol import ErrorCode, format_message


class LlmCore(Protocol):
    """What a generation takes from its model's core (``npu_client._llm_model.LlmCore``):
    the llama.cpp binding, its context and vocabulary, and the one lock steps run under."""

    _lib: Any
    _ctx: Any
    _vocab: Any
    _step: threading.Lock
    _closed: bool
    n_ctx: int
    statistics: LlmStatistics

    def _check_open(self) -> None: ...

    def _piece_of(self, token: int) -> bytes: ...


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
            raise invalid("; ".join(problems))


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


def invalid(detail: str) -> InvalidArgument:
    return InvalidArgument(
        format_message(ErrorCode.INVALID_ARGUMENT, detail=detail), fields={"detail": detail}
    )


def check_request(max_tokens: int | None, sampling: Sampling, stop: Sequence[str]) -> None:
    """A generation's arguments, or InvalidArgument saying what is wrong."""
    sampling.check()
    if max_tokens is not None and (isinstance(max_tokens, bool) or max_tokens < 1):
        raise invalid(f"max_tokens must be at least 1 (or None), not {max_tokens}")
    if any(not isinstance(text, str) or not text for text in stop):
        raise invalid("a stop string is a non-empty str")


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
