"""The buffer pool through the daemon: real clients on a real socket (npud in process, on the
emulator). No client ever sees another's bytes, whatever the order of events: a free, an
invoke still writing after the free, a disconnect, a DSP restart."""

from __future__ import annotations

import os
import secrets
import struct
from pathlib import Path

import msgspec
import trio

import npu_protocol as p
from npu_client.trio_client import open_trio_client
from npu_protocol import ErrorCode
from npud.daemon.server import Daemon
from npud.ops.config import PoolConfig
from npud.sim import EmulatedDriver
from tests.daemon.test_broker import alloc, call, client, running
from tests.daemon.wire import ECHO_URI, RawPeer, serve_daemon

SIZE = 64 * 1024


def inode(fd: int) -> tuple[int, int]:
    """Which memory an fd is: the same DMA-BUF has the same (device, inode) in every fd."""
    status = os.fstat(fd)
    return status.st_dev, status.st_ino


def pool_of(daemon: Daemon) -> p.PoolRow:
    row = daemon.broker.status().pool
    assert row is not None
    return row


def sim_of(daemon: Daemon) -> EmulatedDriver:
    driver = daemon.broker.device.driver
    assert isinstance(driver, EmulatedDriver)
    return driver


async def settled(daemon: Daemon) -> None:
    """Wait for the default domain's control lane to run what is queued on it (the
    zeroing after a free)."""
    domain = daemon.broker.default_domain
    assert domain is not None
    await domain.control.call(lambda: None)


async def test_a_secret_freed_by_one_client_reaches_the_next_as_zeros(tmp_path: Path) -> None:
    """share = user: client B gets the very buffer client A freed, and reads zeros."""
    secret = secrets.token_bytes(SIZE)
    async with serve_daemon(tmp_path, "[pool]\nshare = 'user'\n") as daemon:
        path = tmp_path / "npud.sock"
        async with open_trio_client(path, name="a") as a, open_trio_client(path, name="b") as b:
            buffer = await a.alloc(SIZE)
            buffer.view()[:] = secret
            freed = inode(buffer.fd)
            await buffer.free()
            again = await b.alloc(SIZE)
            assert inode(again.fd) == freed  # the same underlying buffer
            assert bytes(again.view()) == bytes(SIZE)
            row = pool_of(daemon)
            assert (row.hits, row.kept, row.buffers, row.share) == (1, 1, 0, "user")
            assert row.scrubbed_bytes == SIZE
            await again.free()


async def test_by_default_a_freed_buffer_goes_back_to_its_connection_only(tmp_path: Path) -> None:
    async with serve_daemon(tmp_path) as daemon:
        path = tmp_path / "npud.sock"
        async with open_trio_client(path, name="a") as a, open_trio_client(path, name="b") as b:
            buffer = await a.alloc(SIZE)
            buffer.view()[:] = b"\xa5" * SIZE
            freed = inode(buffer.fd)
            await buffer.free()
            other = await b.alloc(SIZE)
            assert inode(other.fd) != freed  # another connection: a new buffer
            mine = await a.alloc(SIZE)
            assert inode(mine.fd) == freed  # its own, zeroed
            assert bytes(mine.view()) == bytes(SIZE)
            row = pool_of(daemon)
            assert (row.share, row.hits, row.misses) == ("client", 1, 2)
            await mine.free()
            await settled(daemon)
            assert pool_of(daemon).buffers == 1
        # Both gone: what "a" freed was kept for "a" alone, and goes with it.
        with trio.fail_after(10):
            while pool_of(daemon).buffers:
                await trio.sleep(0.01)
        assert pool_of(daemon).dropped == 1
        memory = daemon.broker.device.require_memory()
        assert memory.statistics().buffers == 0  # npud holds no DMA-BUF any more


async def test_a_free_behind_a_call_still_writing_the_buffer_waits_for_it(
    tmp_path: Path,
) -> None:
    """An invoke times out (its caller is answered) while the DSP goes on writing the
    buffer, and the client frees the buffer: the free takes effect when the DSP is done,
    so the late write is zeroed with the rest before the next holder gets the buffer.
    (A buffer still pinned when the pool is offered it is not kept at all: see
    tests/emulator/test_pool.py.)"""
    secret = secrets.token_bytes(4096)
    async with serve_daemon(tmp_path, "[pool]\nshare = 'user'\n") as daemon:
        peer = await RawPeer.connect(tmp_path / "npud.sock")
        await peer.write(p.AllocRequest(id=1, size=SIZE), p.OpenRequest(id=2, uri=ECHO_URI))
        # The alloc and the open run on different lanes: pair the answers by id.
        answers = {answer.id: answer for answer in await peer.answers(2)}  # type: ignore[union-attr]
        allocated, opened = answers[1], answers[2]
        assert isinstance(allocated, p.AllocReply)
        assert isinstance(opened, p.OpenReply)
        freed = inode(peer.fds[-1])
        domain = daemon.broker.default_domain
        assert domain is not None
        session = domain.session
        assert session is not None
        sim_of(daemon).faults.set_latency(0.3)
        late = p.InvokeRequest(
            id=3,
            handle=opened.handle,
            method=2,
            inputs=(p.InlineInput(data=struct.pack("<II", 4096, 4096)), p.InlineInput(data=secret)),
            outputs=(p.BufferSlice(buffer=allocated.buffer, offset=0, length=4096),),
            timeout_ms=30,
        )
        await peer.write(late, p.FreeRequest(id=4, buffer=allocated.buffer))
        timed_out = await peer.next()
        assert isinstance(timed_out, p.ErrorMessage)
        assert timed_out.error_code is ErrorCode.TIMEOUT
        assert session.statistics().invokes_in_flight >= 1  # still writing
        assert await peer.next() == p.FreeReply(id=4)
        assert session.statistics().invokes_in_flight == 0  # the free came after it
        sim_of(daemon).faults.clear()
        async with open_trio_client(tmp_path / "npud.sock", name="next") as following:
            other = await following.alloc(SIZE)
            assert inode(other.fd) == freed  # the buffer the DSP wrote into
            assert bytes(other.view()) == bytes(SIZE)
            await other.free()
        peer.close()


async def test_what_a_connection_still_holds_when_it_ends_is_released_not_kept(
    tmp_path: Path,
) -> None:
    async with serve_daemon(tmp_path, "[pool]\nshare = 'user'\n") as daemon:
        path = tmp_path / "npud.sock"
        async with open_trio_client(path, name="leaver") as leaver:
            buffer = await leaver.alloc(SIZE)
            buffer.view()[:] = b"\x5a" * SIZE
            held = inode(buffer.fd)
        async with open_trio_client(path, name="next") as following:
            other = await following.alloc(SIZE)
            assert inode(other.fd) != held
            assert bytes(other.view()) == bytes(SIZE)
        row = pool_of(daemon)
        assert row.kept == 0


async def test_a_dsp_restart_keeps_kept_buffers_and_ends_their_mappings(tmp_path: Path) -> None:
    """A buffer belongs to no DSP process: a restart ends its mapping, not the buffer,
    which the next allocation of its size gets, zeroed and unmapped."""
    async with serve_daemon(tmp_path) as daemon:
        path = tmp_path / "npud.sock"
        async with open_trio_client(path, name="a") as a:
            buffer = await a.alloc(SIZE)
            await buffer.map()
            freed = inode(buffer.fd)
            await buffer.free()
            await settled(daemon)
            assert (pool_of(daemon).buffers, pool_of(daemon).mapped) == (1, 1)
            sim_of(daemon).faults.subsystem_restart(down_for=0.2)
            domain = daemon.broker.default_domain
            assert domain is not None
            with trio.fail_after(10):
                while domain.epoch < 2 or domain.session is None:
                    await trio.sleep(0.01)
            row = pool_of(daemon)
            assert (row.buffers, row.mapped, row.dropped) == (1, 0, 0)
            again = await a.alloc(SIZE)
            assert inode(again.fd) == freed
            assert bytes(again.view()) == bytes(SIZE)
            assert pool_of(daemon).hits == 1
            assert daemon.broker.status().clients[0].mappings == 0
            await again.free()


async def test_a_kept_buffer_comes_back_mapped(tmp_path: Path) -> None:
    async with (
        serve_daemon(tmp_path) as daemon,
        open_trio_client(tmp_path / "npud.sock", name="mapper") as mapper,
    ):
        buffer = await mapper.alloc(SIZE)
        address = await buffer.map()
        await buffer.free()
        again = await mapper.alloc(SIZE)
        assert await again.map() == address  # the mapping it kept
        assert daemon.broker.status().clients[0].mappings == 1
        await again.unmap()
        await again.free()


async def test_idle_buffers_are_trimmed_and_a_reload_applies_the_pool_settings(
    tmp_path: Path,
) -> None:
    async with (
        serve_daemon(tmp_path, "[pool]\nidle_s = 0.2\n") as daemon,
        open_trio_client(tmp_path / "npud.sock", name="idle") as idle,
    ):
        await (await idle.alloc(SIZE)).free()
        with trio.fail_after(10):
            while pool_of(daemon).buffers:
                await trio.sleep(0.02)
        assert pool_of(daemon).trimmed == 1
        # A reload applies: a long idle time keeps what is freed (however slow the
        # machine), and turning the pool off then releases what it kept.
        broker = daemon.broker
        broker.config = msgspec.structs.replace(broker.config, pool=PoolConfig(idle_s=3600))
        await broker.device.closer.call(lambda: None)  # where the reload reconfigures the pool
        await (await idle.alloc(SIZE)).free()
        await settled(daemon)
        assert pool_of(daemon).buffers == 1
        broker.config = msgspec.structs.replace(broker.config, pool=PoolConfig(enabled=False))
        await broker.device.closer.call(lambda: None)
        await settled(daemon)
        row = pool_of(daemon)
        assert (row.enabled, row.buffers, row.dropped) == (False, 0, 1)
        await (await idle.alloc(SIZE)).free()
        assert pool_of(daemon).passed == 1


async def test_with_share_user_another_users_client_never_gets_it() -> None:
    async with running("[pool]\nshare = 'user'\n") as broker:
        mine = await client(broker)
        theirs = await client(broker, uid=1001)
        also_mine = await client(broker)
        buffer_id, buffer = await alloc(broker, mine, SIZE)
        await call(broker, mine, p.FreeRequest(id=2, buffer=buffer_id))
        domain = broker.default_domain
        assert domain is not None
        await domain.control.call(lambda: None)  # zeroed
        _, other = await alloc(broker, theirs, SIZE)
        assert other is not buffer
        _, same = await alloc(broker, also_mine, SIZE)
        assert same is buffer


async def test_a_write_through_a_mapping_kept_after_free_never_reaches_another_holder(
    tmp_path: Path,
) -> None:
    """A process that keeps its fd and mapping after its free and writes through them:
    the next holder, another connection of the same user (share = "user"), still reads
    zeros, because a buffer another connection freed is zeroed again when handed out
    (issue 16, item 9)."""
    import mmap

    async with serve_daemon(tmp_path, "[pool]\nshare = 'user'\n") as daemon:
        peer = await RawPeer.connect(tmp_path / "npud.sock")
        await peer.write(p.AllocRequest(id=1, size=SIZE))
        allocated = await peer.next()
        assert isinstance(allocated, p.AllocReply)
        kept_view = mmap.mmap(peer.fds[-1], SIZE)  # kept past the free
        await peer.write(p.FreeRequest(id=2, buffer=allocated.buffer))
        assert await peer.next() == p.FreeReply(id=2)
        await settled(daemon)  # the pool zeroed it
        kept_view[:] = b"\xee" * SIZE  # written after the free
        async with open_trio_client(tmp_path / "npud.sock", name="next") as following:
            other = await following.alloc(SIZE)
            assert inode(other.fd) == inode(peer.fds[-1])  # that very buffer
            assert bytes(other.view()) == bytes(SIZE)
            await other.free()
        kept_view.close()
        peer.close()
