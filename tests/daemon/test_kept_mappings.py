"""A client keeps its mapping of a buffer it freed into its own pool (Welcome.own_pool)
and uses it when npud hands the same buffer back: no second mapping of the pages.

Through a real daemon (in process, on the emulator) for what the Welcome says and what
comes back; KeptMappings alone, on a fake clock, for its bounds."""

from __future__ import annotations

import mmap
import os
from pathlib import Path

import pytest
import trio

import npu_client
import npu_protocol as p
from npu_client._memory import MAX_KEPT_BYTES, KeptMappings
from npu_client.trio_client import open_trio_client
from tests.daemon.wire import RawPeer, serve_daemon

SIZE = 1 << 20


def inode(fd: int) -> tuple[int, int]:
    status = os.fstat(fd)
    return status.st_dev, status.st_ino


async def test_a_freed_buffer_comes_back_with_the_mapping_kept_and_reads_zeros(
    tmp_path: Path,
) -> None:
    async with (
        serve_daemon(tmp_path),
        open_trio_client(tmp_path / "npud.sock", name="keeper") as client,
    ):
        assert client.welcome is not None
        assert client.welcome.own_pool == p.OwnPool(idle_ms=30_000, max_buffer_bytes=64 << 20)
        buffer = await client.alloc(SIZE)
        buffer.view()[:] = b"\x5a" * SIZE
        freed = inode(buffer.fd)
        await buffer.free()
        kept = client._core.kept_mappings
        assert (kept.bytes, kept.reused) == (SIZE, 0)

        again = await client.alloc(SIZE)
        assert inode(again.fd) == freed
        assert (kept.bytes, kept.reused) == (0, 1)
        # npud zeroed the buffer through its own mapping; the kept one shows it.
        assert bytes(again.view()) == bytes(SIZE)
        copy = await client.alloc(SIZE)  # another buffer: not a kept one
        assert inode(copy.fd) != freed
        assert kept.reused == 1
        await again.free()
        await copy.free()
        assert kept.bytes == 2 * SIZE
    assert kept.bytes == 0  # the close unmapped what was kept


async def test_another_size_is_a_fresh_mapping(tmp_path: Path) -> None:
    async with (
        serve_daemon(tmp_path),
        open_trio_client(tmp_path / "npud.sock", name="keeper") as client,
    ):
        buffer = await client.alloc(SIZE)
        await buffer.free()
        other = await client.alloc(2 * SIZE)
        assert client._core.kept_mappings.reused == 0
        assert bytes(other.view()) == bytes(2 * SIZE)
        await other.free()


@pytest.mark.parametrize(
    "config",
    ["[pool]\nshare = 'user'\n", "[pool]\nenabled = false\n"],
    ids=["share-user", "pool-off"],
)
async def test_without_an_own_pool_nothing_is_kept(tmp_path: Path, config: str) -> None:
    async with (
        serve_daemon(tmp_path, config),
        open_trio_client(tmp_path / "npud.sock", name="keeper") as client,
    ):
        assert client.welcome is not None
        assert client.welcome.own_pool is None
        buffer = await client.alloc(SIZE)
        await buffer.free()
        assert client._core.kept_mappings.bytes == 0


async def test_a_buffer_larger_than_the_pool_keeps_is_not_kept(tmp_path: Path) -> None:
    async with (
        serve_daemon(tmp_path, "[pool]\nmax_buffer_bytes = 65536\n"),
        open_trio_client(tmp_path / "npud.sock", name="keeper") as client,
    ):
        buffer = await client.alloc(SIZE)
        await buffer.free()
        assert client._core.kept_mappings.bytes == 0


async def test_an_older_client_is_not_told(tmp_path: Path) -> None:
    async with serve_daemon(tmp_path):
        peer = await RawPeer.connect(tmp_path / "npud.sock", version=3)
        try:
            assert peer.welcome is not None
            assert peer.welcome.own_pool is None
        finally:
            peer.close()


async def test_the_blocking_client_keeps_and_reuses_too(tmp_path: Path) -> None:
    def blocking() -> None:
        with npu_client.connect(str(tmp_path / "npud.sock"), name="blocking") as client:
            buffer = client.alloc(SIZE)
            freed = inode(buffer.fd)
            buffer.free()
            again = client.alloc(SIZE)
            assert inode(again.fd) == freed
            assert client._core.kept_mappings.reused == 1
            assert bytes(again.view()) == bytes(SIZE)
            again.free()

    async with serve_daemon(tmp_path):
        await trio.to_thread.run_sync(blocking)


# --- KeptMappings alone -------------------------------------------------------------------


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def memfd(size: int) -> tuple[int, mmap.mmap]:
    fd = os.memfd_create("kept-test", os.MFD_CLOEXEC)
    os.ftruncate(fd, size)
    return fd, mmap.mmap(fd, size)


TERMS = p.OwnPool(idle_ms=1000, max_buffer_bytes=MAX_KEPT_BYTES)


def test_a_kept_mapping_expires_when_the_pool_would_release_its_buffer() -> None:
    clock = Clock()
    kept = KeptMappings(clock)
    fd, memory = memfd(4096)
    try:
        assert kept.keep(fd, memory, 4096, TERMS)
        clock.now += 1.0
        assert kept.take(fd, 4096) is None  # expired at the look, and unmapped
        assert memory.closed
        assert kept.bytes == 0
    finally:
        os.close(fd)


def test_take_needs_the_same_size_and_gives_a_mapping_once() -> None:
    kept = KeptMappings(Clock())
    fd, memory = memfd(8192)
    try:
        assert kept.keep(fd, memory, 8192, TERMS)
        assert kept.take(fd, 4096) is None
        assert kept.take(fd, 8192) is memory
        assert kept.take(fd, 8192) is None
        assert (kept.reused, kept.bytes) == (1, 0)
    finally:
        memory.close()
        os.close(fd)


def test_kept_bytes_are_bounded_and_the_oldest_go_first() -> None:
    kept = KeptMappings(Clock())
    half = MAX_KEPT_BYTES // 2
    fds = [memfd(half) for _ in range(3)]
    try:
        for fd, memory in fds:
            assert kept.keep(fd, memory, half, TERMS)
        assert kept.bytes == MAX_KEPT_BYTES
        assert fds[0][1].closed  # the oldest made room
        assert not fds[1][1].closed
        assert not fds[2][1].closed
        kept.close()
        assert all(memory.closed for _, memory in fds)
        assert kept.bytes == 0
    finally:
        for fd, memory in fds:
            memory.close()
            os.close(fd)


def test_nothing_is_kept_without_terms_or_beyond_them() -> None:
    kept = KeptMappings(Clock())
    fd, memory = memfd(8192)
    try:
        assert not kept.keep(fd, memory, 8192, None)
        small = p.OwnPool(idle_ms=1000, max_buffer_bytes=4096)
        assert not kept.keep(fd, memory, 8192, small)
        assert kept.bytes == 0
        assert not memory.closed
    finally:
        memory.close()
        os.close(fd)
