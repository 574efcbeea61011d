"""``TrioClient.load_llm``'s object: :class:`npu_client.Llm`'s methods, awaited.

llama.cpp blocks while it works, so everything it does for one LLM (each token, a
tokenization, the close) runs on one thread of the LLM's own (:class:`_Worker`),
always the same: llama.cpp's CPU backend keeps a pool of OpenMP threads per thread
that calls it, and a call from each of trio's worker threads in turn would start a
pool each (measured: a third of the tokens/s gone on two cores). Each token's text
is handed to the task as it comes (one wake-up of trio per token); between tokens
the task can be cancelled, which ends the generation there (a token being made is
finished first: it is on the DSP).
"""

from __future__ import annotations

import contextlib
import math
import queue
import threading
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Sequence
from pathlib import Path
from typing import Any, Self, TypeVar

import trio

from npu_client._errors import SessionBusy
from npu_client._llm import Generation, LlmCore, LlmStatistics, Piece, Sampling, check_request
from npu_client._llm_client import DEFAULT_MAX_TOKENS, Messages, chat_pairs, stop_strings

T = TypeVar("T")


def _soon(token: trio.lowlevel.TrioToken, fn: Callable[..., object], *args: Any) -> None:
    """``fn(*args)`` on trio's thread, from the worker; nothing once trio's run is over
    (its task is gone with it)."""
    with contextlib.suppress(trio.RunFinishedError):
        token.run_sync_soon(fn, *args)


class _Worker:
    """One thread that runs an LLM's jobs in turn; owned by its TrioLlm, which stops it."""

    def __init__(self, name: str) -> None:
        self._jobs: queue.SimpleQueue[Callable[[], None] | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._serve, name=name, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while (job := self._jobs.get()) is not None:
            job()

    def submit(self, job: Callable[[], None]) -> None:
        self._jobs.put(job)

    async def run(self, fn: Callable[[], T]) -> T:
        """``fn()`` on the worker; its result or exception here. Not cancellable: the
        job runs to its end (llama.cpp's calls cannot be stopped), then this returns."""
        token = trio.lowlevel.current_trio_token()
        done = trio.Event()
        outcome: list[Any] = []

        def job() -> None:
            try:
                outcome.append((True, fn()))
            except BaseException as exc:  # handed to the task, raised there
                outcome.append((False, exc))
            _soon(token, done.set)

        self.submit(job)
        with trio.CancelScope(shield=True):
            await done.wait()
        ok, value = outcome[0]
        if not ok:
            raise value
        return value  # type: ignore[no-any-return]

    async def stop(self) -> None:
        """End the thread after the jobs queued (shielded: it waits for them)."""
        self._jobs.put(None)
        with trio.CancelScope(shield=True):
            await trio.to_thread.run_sync(self._thread.join)


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
        self._worker = _Worker(f"llm-{core.path.name}"[:15])

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
            generation: Generation = await self._worker.run(
                lambda: self._core.begin(
                    prompt, max_tokens=max_tokens, sampling=sampling, stop=stop_strings(stop)
                )
            )
            # The worker makes the tokens one after the other and hands each piece over;
            # ``wanted`` cleared stops it between two tokens.
            send, receive = trio.open_memory_channel[Piece | BaseException | None](math.inf)
            token = trio.lowlevel.current_trio_token()
            wanted = threading.Event()
            wanted.set()
            finished = trio.Event()

            def deliver(item: Piece | BaseException | None) -> None:  # on trio's thread
                with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
                    send.send_nowait(item)  # the task may have stopped reading

            def produce() -> None:
                try:
                    while wanted.is_set() and (piece := generation.step()) is not None:
                        if piece.text or piece.tokens:
                            _soon(token, deliver, piece)
                    _soon(token, deliver, None)
                except BaseException as exc:  # handed to the task, raised there
                    _soon(token, deliver, exc)
                finally:
                    _soon(token, finished.set)

            self._worker.submit(produce)
            try:
                async with receive:
                    async for item in receive:
                        if item is None:
                            break
                        if isinstance(item, BaseException):
                            raise item
                        yield item
            finally:
                wanted.clear()
                with trio.CancelScope(shield=True):
                    await finished.wait()  # at most the token being made

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
        return await self._worker.run(lambda: self._core.tokenize(text, special=special))

    async def detokenize(self, tokens: Sequence[int]) -> str:
        return await self._worker.run(lambda: self._core.detokenize(tokens))

    async def apply_chat_template(self, messages: Messages, *, add_assistant: bool = True) -> str:
        pairs = chat_pairs(messages)
        return await self._worker.run(
            lambda: self._core.apply_chat_template(pairs, assistant=add_assistant)
        )

    async def close(self) -> None:
        """As :meth:`npu_client.Llm.close`, and its thread ends; done even when cancelled
        (shielded: it waits at most for the token being made). Idempotent."""
        with trio.CancelScope(shield=True):
            # Not on the worker: a generation there ends at its next token, on seeing this.
            await trio.to_thread.run_sync(self._core.close)
            await self._worker.stop()
        self._on_close(self)

    aclose = close

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    def __repr__(self) -> str:
        state = "closed" if self.closed else f"n_ctx {self.n_ctx}"
        return f"<npu_client.trio_client.TrioLlm {self.path.name} {state}>"
