"""Both clients' models behind one awaitable face, so one test body covers both.

The trio client is used as it is. The blocking client's waiting calls (``connect``,
``load_model``, ``status``, and a model's ``run``, ``execute``, ``info``,
``unload``) run in a worker thread (``trio.to_thread``), as a program that mixes
them would; everything that does not wait (a model's tensors, views and
descriptions) is the blocking object's own attribute, untouched.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Final, Literal, Self, TypeVar

import trio

import npu_client
from npu_client import trio_client
from npu_client._models import ModelSource, TensorValue
from npu_protocol import DaemonStatus, ModelInfo

ClientKind = Literal["trio", "blocking"]
CLIENT_KINDS: Final[tuple[ClientKind, ...]] = ("trio", "blocking")

T = TypeVar("T")


async def _in_thread(function: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    return await trio.to_thread.run_sync(functools.partial(function, *args, **kwargs))


class AwaitedModel:
    """A blocking ``npu_client.Model`` whose waiting calls are awaited."""

    def __init__(self, model: npu_client.Model) -> None:
        self.model = model

    def __getattr__(self, name: str) -> Any:
        return getattr(self.model, name)  # what does not wait: the model's own

    async def run(
        self, inputs: Mapping[str, TensorValue] | None = None, **options: Any
    ) -> dict[str, Any]:
        """``options``: ``graph``, ``timeout``, ``deadline``."""
        return await _in_thread(self.model.run, inputs, **options)

    async def execute(self, **options: Any) -> None:
        await _in_thread(self.model.execute, **options)

    async def info(self) -> ModelInfo:
        return await _in_thread(self.model.info)

    async def unload(self) -> None:
        await _in_thread(self.model.unload)

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.unload()


class AwaitedClient:
    """A blocking ``npu_client.Client`` whose waiting calls are awaited."""

    def __init__(self, client: npu_client.Client) -> None:
        self.client = client

    def __getattr__(self, name: str) -> Any:
        return getattr(self.client, name)

    async def load_model(
        self,
        source: ModelSource,
        *,
        shapes: Mapping[str, Sequence[int | Sequence[int]]] | None = None,
        name: str | None = None,
        constants: Mapping[str, object] | None = None,
    ) -> AwaitedModel:
        return AwaitedModel(
            await _in_thread(
                self.client.load_model, source, shapes=shapes, name=name, constants=constants
            )
        )

    async def status(self) -> DaemonStatus:
        return await _in_thread(self.client.status)


@contextlib.asynccontextmanager
async def open_client(kind: ClientKind, socket: Path, **options: Any) -> AsyncIterator[Any]:
    """A connected client of ``kind`` (``connect``'s options), closed at the end: the
    trio client itself, or the blocking one as :class:`AwaitedClient`."""
    if kind == "trio":
        async with trio_client.open_trio_client(str(socket), **options) as npu:
            yield npu
        return
    client = await _in_thread(npu_client.connect, str(socket), **options)
    try:
        yield AwaitedClient(client)
    finally:
        await _in_thread(client.close)
