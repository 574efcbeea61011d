"""``TrioClient.load_llm``'s object: :class:`npu_client.Llm`'s methods, awaited.

llama.cpp blocks while it works, so every step (one token, a tokenization, the
load, the close) runs on a worker thread (``trio.to_thread``); between tokens the
task can be cancelled, which ends the generation there (a token being made is
finished first: it is on the DSP).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Sequence
from pathlib import Path
from typing import Self

import trio

from npu_client._errors import SessionBusy
from npu_client._llm import Generation, LlmCore, LlmStatistics, Piece, Sampling, check_request
from npu_client._llm_client import DEFAULT_MAX_TOKENS, Messages, chat_pairs, stop_strings


class TrioLlm:
    """An LLM on the NPU for trio code; see :class:`npu_client.Llm` for the semantics.

    Tasks may share it: generations take turns. ``stream`` and ``tokens`` are async
    generators that hold the turn until they end; close one you leave early (``async
    with contextlib.aclosing(llm.stream(...)) as pieces:``), or the next generation
    waits until it is collected.
    """

    def __init__(self, core: LlmCore, on_close: Callable[[TrioLlm], None]) -> None:
        """Internal: use ``TrioClient.load_llm``. Takes ownership of ``core``."""
        self._core = core
        self._on_close = on_close
        self._turn = trio.Lock()

    @property
    def path(self) -> Path:
        return self._core.path

    @property
    def n_ctx(self) -> int:
        return self._core.n_ctx

    @property
    def n_ctx_train(self) -> int:
        return self._core.n_ctx_train

    @property
    def description(self) -> str:
        return self._core.description

    @property
    def closed(self) -> bool:
        return self._core.closed

    def statistics(self) -> LlmStatistics:
        return self._core.statistics

    async def generate(
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
        """As :meth:`npu_client.Llm.generate`."""
        sampling = Sampling(temperature=temperature, top_k=top_k, top_p=top_p, seed=seed)
        check_request(max_tokens, sampling, stop_strings(stop))
        texts = [piece.text async for piece in self._pieces(prompt, max_tokens, sampling, stop)]
        return "".join(texts)

    async def stream(
        self,
        prompt: str,
        *,
        max_tokens: int | None = DEFAULT_MAX_TOKENS,
        temperature: float = 0.8,
        top_k: int = 40,
        top_p: float = 0.95,
        seed: int | None = None,
        stop: str | Sequence[str] = (),
    ) -> AsyncGenerator[str]:
        """As :meth:`npu_client.Llm.stream`: ``async for piece in llm.stream(prompt)``."""
        sampling = Sampling(temperature=temperature, top_k=top_k, top_p=top_p, seed=seed)
        check_request(max_tokens, sampling, stop_strings(stop))
        async for piece in self._pieces(prompt, max_tokens, sampling, stop):
            yield piece.text

    async def tokens(
        self,
        prompt: str,
        *,
        max_tokens: int | None = DEFAULT_MAX_TOKENS,
        temperature: float = 0.8,
        top_k: int = 40,
        top_p: float = 0.95,
        seed: int | None = None,
        stop: str | Sequence[str] = (),
    ) -> AsyncGenerator[int]:
        """As :meth:`npu_client.Llm.tokens`."""
        sampling = Sampling(temperature=temperature, top_k=top_k, top_p=top_p, seed=seed)
        check_request(max_tokens, sampling, stop_strings(stop))
        async for piece in self._pieces(prompt, max_tokens, sampling, stop):
            for token in piece.tokens:
                yield token

    async def _pieces(
        self, prompt: str, max_tokens: int | None, sampling: Sampling, stop: str | Sequence[str]
    ) -> AsyncGenerator[Piece]:
        async with self._taking_turn():
            generation: Generation = await trio.to_thread.run_sync(
                lambda: self._core.begin(
                    prompt, max_tokens=max_tokens, sampling=sampling, stop=stop_strings(stop)
                )
            )
            while (piece := await trio.to_thread.run_sync(generation.step)) is not None:
                if piece.text or piece.tokens:
                    yield piece

    @contextlib.asynccontextmanager
    async def _taking_turn(self) -> AsyncIterator[None]:
        try:
            await self._turn.acquire()
        except RuntimeError:  # trio: this task holds it, in a stream it left open
            raise SessionBusy(
                "this task's earlier stream of this LLM is still open: finish it or close "
                "it (await stream.aclose()) before the next generation"
            ) from None
        try:
            yield
        finally:
            self._turn.release()

    async def tokenize(self, text: str, *, special: bool = True) -> list[int]:
        return await trio.to_thread.run_sync(lambda: self._core.tokenize(text, special=special))

    async def detokenize(self, tokens: Sequence[int]) -> str:
        return await trio.to_thread.run_sync(self._core.detokenize, tokens)

    async def apply_chat_template(self, messages: Messages, *, add_assistant: bool = True) -> str:
        pairs = chat_pairs(messages)
        return await trio.to_thread.run_sync(
            lambda: self._core.apply_chat_template(pairs, assistant=add_assistant)
        )

    async def close(self) -> None:
        """As :meth:`npu_client.Llm.close`; done even when cancelled (shielded: it waits
        at most for the token being made)."""
        with trio.CancelScope(shield=True):
            await trio.to_thread.run_sync(self._core.close)
        self._on_close(self)

    aclose = close

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    def __repr__(self) -> str:
        state = "closed" if self.closed else f"n_ctx {self.n_ctx}"
        return f"<npu_client.trio_client.TrioLlm {self.path.name} {state}>"
