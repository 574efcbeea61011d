"""A DSP process is a security boundary (issue 27): two users, npud's shipped
configuration, an attacker beside a victim.

DSP code reaches every buffer mapped into its DSP process by fd number (the
``alloc_reply.dsp_fd`` a client is told). So the attacker's DSP code is run on the
attacker's own domain's session here, as a skel of its would run there: an htp batch
naming the victim's ``dsp_fd``. Users must not share a DSP process, must not take
every one, and a user who left holds none.
"""

from __future__ import annotations

import mmap
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import numpy as np
import trio

import npu_protocol as p
from npud.backend import select_profile
from npud.broker import Broker
from npud.config import parse_config
from npud.server import Daemon, bind_socket
from tests.e2e.daemon import RawPeer
from tests.emulator.dspqueue_cpu import CpuQueues
from tests.emulator.htp_host import F32, STATUS_INVAL_PARAMS, STATUS_OK, Arena, HtpHost, OpSpec
from tests.users import ATTACKER, VICTIM, as_user, notes

SHIPPED = Path(__file__).parents[2] / "config" / "npud.toml"
SECRET = b"SECRET-of-the-victim-0123456789a" * 2  # 64 bytes: 16 float32
PWNED = b"PWNED-by-the-attacker-0123456789" * 2
VICTIM_BYTES = 8192
"""As large as the attacker's decoy buffer (htp checks a buffer's size, not its owner)."""


def shipped_config(**replace: str) -> str:
    """config/npud.toml as shipped, on the emulator, both test users allowed."""
    text = SHIPPED.read_text()
    changes = {
        'kind = "auto"': 'kind = "emulator"',
        "allow_uids = []": f"allow_uids = [{VICTIM}, {ATTACKER}]",
        **replace,
    }
    for old, new in changes.items():
        assert old in text, old
        text = text.replace(old, new)
    return text


@asynccontextmanager
async def shipped_daemon(tmp: Path, **replace: str) -> AsyncIterator[Daemon]:
    parsed = parse_config(shipped_config(**replace))
    bound = bind_socket(tmp / "npud.sock", 0o666, "")
    daemon = Daemon(parsed, Broker(parsed, select_profile(parsed)), bound.sock)
    async with trio.open_nursery() as nursery:
        await nursery.start(daemon.run)
        try:
            yield daemon
        finally:
            daemon.stop()
    bound.sock.close()


def victim_with_a_secret(peer: RawPeer) -> bytes:
    """The victim: a buffer holding its secret, mapped into its DSP process; it pauses
    (telling its dsp_fd) while the attacker tries, then says what its buffer holds."""
    welcome = peer.hello("vad-victim")
    reply = peer.request(p.AllocRequest(id=peer.next_id(), size=VICTIM_BYTES))
    assert isinstance(reply, p.AllocReply), reply
    memory = mmap.mmap(peer.received_fds[-1].fileno(), VICTIM_BYTES)
    memory[: len(SECRET)] = SECRET
    mapped = peer.request(p.MapRequest(id=peer.next_id(), buffer=reply.buffer))
    assert isinstance(mapped, p.MapReply), mapped
    peer.pause(f"{reply.dsp_fd} {welcome.domain}".encode())  # type: ignore[attr-defined]
    return bytes(memory[: len(SECRET)])


def attacker_waits(peer: RawPeer) -> bytes:
    welcome = peer.hello("attacker")
    peer.pause(welcome.domain.encode())  # type: ignore[attr-defined]
    return welcome.domain.encode()


def dsp_code_of(daemon: Daemon, uid: int, dsp_fd: int) -> tuple[int, bytes, int]:
    """What the DSP code of ``uid``'s DSP process gets from one htp CPY reading the
    buffer mapped there as ``dsp_fd`` and one writing it: (read status, bytes read,
    write status)."""
    row = next(r for r in daemon.broker.status().clients if r.uid == uid)
    domain = daemon.broker.domain_named(row.domain)
    assert domain is not None and domain.session is not None
    session = domain.session
    queues = CpuQueues(session)
    host = HtpHost(session, queues)
    try:
        assert host.start() == 0
        arena = Arena(host, 1 << 16)
        decoy = Arena(host, VICTIM_BYTES - 4096).tensor(F32, (16,))  # its fd: the victim's
        loot = arena.tensor(F32, (16,))
        host.submit([OpSpec("CPY", [decoy], [loot])], raw_fds=[dsp_fd])
        read = host.collect().status
        stolen = loot.array().tobytes()
        payload = arena.tensor(F32, (16,))
        payload.set(np.frombuffer(PWNED, np.float32).reshape(1, 1, 1, 16))
        host.submit(
            [OpSpec("CPY", [payload], [decoy])], raw_fds=[payload.buffer.fd, dsp_fd]
        )
        write = host.collect().status
        return read, stolen, write
    finally:
        host.close()
        queues.close()


def attack(daemon: Daemon, socket_path: Path) -> tuple[bytes, dict[str, object]]:
    """The victim holds its secret and the attacker its connection while the attacker's
    DSP code reads and writes the victim's dsp_fd: (what the victim's buffer holds
    after, what happened)."""
    outcome: dict[str, object] = {}

    def strike() -> None:
        dsp_fd = int(notes[VICTIM].split()[0])
        outcome["read"], outcome["stolen"], outcome["write"] = dsp_code_of(
            daemon, ATTACKER, dsp_fd
        )

    def attacker_then_strike() -> None:
        outcome["attacker"] = as_user(ATTACKER, socket_path, attacker_waits, strike).decode()

    victim_sees = as_user(VICTIM, socket_path, victim_with_a_secret, attacker_then_strike)
    outcome["victim"] = notes[VICTIM].split()[1].decode()
    return victim_sees, outcome


async def test_another_users_dsp_code_reaches_none_of_a_users_buffers(tmp_path: Path) -> None:
    """The review's attack: with one `default` domain for all, one CPY naming the
    victim's dsp_fd read its secret and another wrote into it."""
    async with shipped_daemon(tmp_path) as daemon:
        victim_sees, outcome = await trio.to_thread.run_sync(
            attack, daemon, tmp_path / "npud.sock"
        )
        assert (outcome["victim"], outcome["attacker"]) == (
            f"default@{VICTIM}",
            f"default@{ATTACKER}",
        )
        assert (outcome["read"], outcome["write"]) == (STATUS_INVAL_PARAMS, STATUS_INVAL_PARAMS)
        assert SECRET not in outcome["stolen"]  # type: ignore[operator]
        assert victim_sees == SECRET
        assert daemon.broker.domains.get("default") is not None  # root's, opened at start


async def test_share_default_gives_that_away_as_deploy_md_says(tmp_path: Path) -> None:
    """The opt-in to one shared process: the same attack reads and writes (docs/deploy.md,
    Sharing a DSP process, says so); the attack above is a real one."""
    async with shipped_daemon(
        tmp_path, **{"share_default = false": "share_default = true"}
    ) as daemon:
        victim_sees, outcome = await trio.to_thread.run_sync(
            attack, daemon, tmp_path / "npud.sock"
        )
        assert (outcome["victim"], outcome["attacker"]) == ("default", "default")
        assert (outcome["read"], outcome["write"]) == (STATUS_OK, STATUS_OK)
        assert SECRET in outcome["stolen"]  # type: ignore[operator]
        assert victim_sees == PWNED
