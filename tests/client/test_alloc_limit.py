"""An alloc's size is checked against the largest buffer npud announced in its Welcome
(``limits.max_buffer_size``: 2 GiB by default, up to 4 GiB), not a fixed 256 MiB; an npud
older than protocol version 6 announces none and takes at most 256 MiB, the field's
default. A size above is refused here, before anything is sent, by both clients."""

from __future__ import annotations

import msgspec
import pytest

import npu_client
import npu_protocol as p
from npu_client._args import largest_buffer
from tests.client.peer import Peer

ANNOUNCED = (1 << 30) + 4096
"""A ceiling past the old 256 MiB, not a power of two (the check is the announced one)."""


def announcing(path: str, largest: int) -> Peer:
    return Peer(path, limits=p.ClientLimits(priority=p.Priority.NORMAL, max_buffer_size=largest))


def allocs(peer: Peer) -> list[int]:
    return [r.size for r in peer.connection().requests if isinstance(r, p.AllocRequest)]


def test_an_older_npuds_welcome_means_256_mib() -> None:
    """A Welcome's limits without max_buffer_size (an npud before version 6)."""
    older = {"priority": "normal", "max_buffers": 16}
    limits = msgspec.msgpack.decode(msgspec.msgpack.encode(older), type=p.ClientLimits)
    assert largest_buffer(limits) == p.MAX_DMA_SIZE == 256 << 20
    beyond_the_wire = p.ClientLimits(priority=p.Priority.NORMAL, max_buffer_size=1 << 40)
    assert largest_buffer(beyond_the_wire) == p.MAX_BUFFER_SIZE


def test_the_blocking_client_allocs_up_to_the_announced_size(socket_path: str) -> None:
    with announcing(socket_path, ANNOUNCED) as peer, npu_client.connect(peer.path) as client:
        assert client.limits.max_buffer_size == ANNOUNCED
        with client.alloc(p.MAX_DMA_SIZE + 1) as past_256_mib:
            assert past_256_mib.size == p.MAX_DMA_SIZE + 4096
        with client.alloc(ANNOUNCED) as largest:
            assert largest.size == ANNOUNCED
        with pytest.raises(
            ValueError,
            match=rf"size must be between 1 and {ANNOUNCED} \(npud's largest buffer,"
            rf" limits.max_buffer_size\), got {ANNOUNCED + 1}",
        ):
            client.alloc(ANNOUNCED + 1)
        assert allocs(peer) == [p.MAX_DMA_SIZE + 1, ANNOUNCED]  # the refused one not sent


def test_the_blocking_client_asks_an_older_npud_for_256_mib_at_most(socket_path: str) -> None:
    with announcing(socket_path, p.MAX_DMA_SIZE) as peer, npu_client.connect(peer.path) as client:
        with pytest.raises(ValueError, match=f"between 1 and {p.MAX_DMA_SIZE} "):
            client.alloc(p.MAX_DMA_SIZE + 1)
        with client.alloc(p.MAX_DMA_SIZE) as largest:
            assert largest.size == p.MAX_DMA_SIZE
        assert allocs(peer) == [p.MAX_DMA_SIZE]


async def test_the_trio_client_allocs_up_to_the_announced_size(socket_path: str) -> None:
    with announcing(socket_path, ANNOUNCED) as peer:
        async with npu_client.open_trio_client(peer.path, name="big") as npu:
            assert npu.limits.max_buffer_size == ANNOUNCED
            buffer = await npu.alloc(ANNOUNCED)
            assert buffer.size == ANNOUNCED
            await buffer.free()
            with pytest.raises(
                ValueError, match=f"between 1 and {ANNOUNCED} .*got {ANNOUNCED + 1}"
            ):
                await npu.alloc(ANNOUNCED + 1)
            assert allocs(peer) == [ANNOUNCED]


async def test_the_trio_client_asks_an_older_npud_for_256_mib_at_most(socket_path: str) -> None:
    with announcing(socket_path, p.MAX_DMA_SIZE) as peer:
        async with npu_client.open_trio_client(peer.path, name="old") as npu:
            with pytest.raises(ValueError, match=f"between 1 and {p.MAX_DMA_SIZE} "):
                await npu.alloc(p.MAX_DMA_SIZE + 1)
            assert allocs(peer) == []
