"""A DSP process is a security boundary (issue 27): two users, npud's shipped
configuration, an attacker beside a victim.

DSP code reaches every buffer mapped into its DSP process by fd number (the
``alloc_reply.dsp_fd`` a client is told). So the attacker's DSP code is run on the
attacker's own domain's session here, as a skel of its would run there: an htp batch
naming the victim's ``dsp_fd``. Users must not share a DSP process, must not take
every one, and a user who left holds none.
"""

from __future__ import annotations

import contextlib
import io
import json
import mmap
import struct
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import trio

import npu_protocol as p
from npu_client import npuctl
from npu_client._status_text import domain_kind
from npu_protocol import ErrorCode
from npud.daemon.broker import Broker
from npud.daemon.server import Daemon, bind_socket
from npud.domain.domains import Domains
from npud.domain.life import Domain
from npud.fastrpc.host.dspqueue_cpu import CpuQueues
from npud.fastrpc.host.htp_host import F32, STATUS_INVAL_PARAMS, STATUS_OK, Arena, HtpHost, OpSpec
from npud.ops.backend import select_profile
from npud.ops.config import parse_config
from npud.sim import EmulatedDriver
from tests.e2e.daemon import RawPeer
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
    assert domain is not None
    assert domain.session is not None
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
        host.submit([OpSpec("CPY", [payload], [decoy])], raw_fds=[payload.buffer.fd, dsp_fd])
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
        outcome["read"], outcome["stolen"], outcome["write"] = dsp_code_of(daemon, ATTACKER, dsp_fd)

    def attacker_then_strike() -> None:
        outcome["attacker"] = as_user(ATTACKER, socket_path, attacker_waits, strike).decode()

    victim_sees = as_user(VICTIM, socket_path, victim_with_a_secret, attacker_then_strike)
    outcome["victim"] = notes[VICTIM].split()[1].decode()
    return victim_sees, outcome


async def test_another_users_dsp_code_reaches_none_of_a_users_buffers(tmp_path: Path) -> None:
    """The review's attack: with one `default` domain for all, one CPY naming the
    victim's dsp_fd read its secret and another wrote into it."""
    async with shipped_daemon(tmp_path) as daemon:
        victim_sees, outcome = await trio.to_thread.run_sync(attack, daemon, tmp_path / "npud.sock")
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
        victim_sees, outcome = await trio.to_thread.run_sync(attack, daemon, tmp_path / "npud.sock")
        assert (outcome["victim"], outcome["attacker"]) == ("default", "default")
        assert (outcome["read"], outcome["write"]) == (STATUS_OK, STATUS_OK)
        assert SECRET in outcome["stolen"]  # type: ignore[operator]
        assert victim_sees == PWNED


def isolated_hello(peer: RawPeer, name: str) -> p.Welcome | p.ErrorMessage:
    peer.send(p.Hello(protocol_version=p.PROTOCOL_VERSION, client_name=name, isolate=True))
    answer = peer.receive()
    assert isinstance(answer, p.Welcome | p.ErrorMessage), answer
    return answer


def hog(peer: RawPeer) -> bytes:
    """11 isolated Hellos of one user, all held while the victim tries."""
    answers = [isolated_hello(peer, "llama-0")]
    held = [peer]
    for n in range(1, 11):
        other = peer.again()  # type: ignore[attr-defined]
        held.append(other)
        answers.append(isolated_hello(other, f"llama-{n}"))
    welcomed = sum(isinstance(a, p.Welcome) for a in answers)
    refusals = {a.message for a in answers if isinstance(a, p.ErrorMessage)}
    peer.pause(f"{welcomed}".encode())  # type: ignore[attr-defined]
    for other in held:
        other.close()
    return "\n".join(sorted(refusals)).encode()


async def test_one_user_cannot_take_every_dsp_process(tmp_path: Path) -> None:
    """The review: 11 isolated Hellos of one uid took every context bank, and another
    user's isolated Hello was QUOTA_EXCEEDED. Now one user holds max_domains_per_uid."""
    socket_path = tmp_path / "npud.sock"
    async with shipped_daemon(tmp_path) as daemon:
        victim: dict[str, object] = {}

        def victim_isolates() -> None:
            def work(peer: RawPeer) -> bytes:
                answer = isolated_hello(peer, "llama-victim")
                return answer.domain.encode() if isinstance(answer, p.Welcome) else b"refused"

            victim["domain"] = as_user(VICTIM, socket_path, work).decode()
            victim["domains"] = daemon.broker.domains.owned_by(ATTACKER)

        refusals = await trio.to_thread.run_sync(
            lambda: as_user(ATTACKER, socket_path, hog, victim_isolates)
        )
        assert notes[ATTACKER] == b"4"  # welcomed: max_domains_per_uid, shipped as 4
        assert refusals.decode() == (
            f"DSP processes (domains) of uid {ATTACKER} quota exceeded: the limit is 4"
        )
        assert str(victim["domain"]).startswith(f"default@{VICTIM}#"), victim
        assert victim["domains"] == 4
        await settle(lambda: len(daemon.broker.domains) == 1)  # all gone with their clients


async def settle(condition: Callable[[], bool]) -> None:
    with trio.fail_after(10):
        while not condition():
            await trio.sleep(0.01)


async def test_a_users_domain_closes_when_its_last_connection_goes(tmp_path: Path) -> None:
    """A user who left holds no DSP process (context bank): default@UID opens at its
    first Hello, is shared by its connections, and closes with the last."""
    socket_path = tmp_path / "npud.sock"
    async with shipped_daemon(tmp_path) as daemon:
        seen: dict[str, object] = {}

        def two_connections(peer: RawPeer) -> bytes:
            first = peer.hello("vad-1").domain
            second = peer.again()  # type: ignore[attr-defined]
            also = second.hello("vad-2").domain
            second.close()
            peer.pause(b"")  # type: ignore[attr-defined]
            return f"{first} {also}".encode()

        def look() -> None:
            domain = daemon.broker.domains.get(f"default@{VICTIM}")
            seen["members"] = None if domain is None else len(domain.members)

        names = await trio.to_thread.run_sync(
            lambda: as_user(VICTIM, socket_path, two_connections, look)
        )
        assert names.decode() == f"default@{VICTIM} default@{VICTIM}"
        assert seen["members"] in (1, 2)  # the second's departure may still be under way
        await settle(lambda: daemon.broker.domains.get(f"default@{VICTIM}") is None)
        driver = daemon.broker.device.driver
        assert isinstance(driver, EmulatedDriver)
        await settle(lambda: driver.statistics().sessions_in_use == 1)  # root's default only


async def test_a_users_domain_lingers_for_its_next_connection(tmp_path: Path) -> None:
    """A connect/disconnect loop made npud start and stop a DSP process each time: the
    domain closed the moment its last connection left. Now it lingers
    ``user_domain_linger_s``: a connection of that user meanwhile joins the same
    domain, its session not reopened; the linger's end closes it."""
    socket_path = tmp_path / "npud.sock"
    linger = {"user_domain_linger_s = 2.0": "user_domain_linger_s = 600.0"}
    async with shipped_daemon(tmp_path, **linger) as daemon:
        driver = daemon.broker.device.driver
        assert isinstance(driver, EmulatedDriver)
        name = f"default@{VICTIM}"

        def hello(peer: RawPeer) -> bytes:
            return str(peer.hello("vad-loop").domain).encode()

        first = await trio.to_thread.run_sync(lambda: as_user(VICTIM, socket_path, hello))
        assert first.decode() == name
        domain = daemon.broker.domains.get(name)
        assert domain is not None
        await settle(lambda: not domain.members)  # the first connection has left
        assert daemon.broker.domains.get(name) is domain  # before the fix: closed, None
        session = domain.session
        seen: dict[str, object] = {}

        def look() -> None:
            seen["domain"] = daemon.broker.domains.get(name)
            seen["members"] = len(domain.members)

        def hello_and_wait(peer: RawPeer) -> bytes:
            welcome = peer.hello("vad-loop")
            peer.pause(b"")  # type: ignore[attr-defined]
            return str(welcome.domain).encode()

        second = await trio.to_thread.run_sync(
            lambda: as_user(VICTIM, socket_path, hello_and_wait, look)
        )
        assert second.decode() == name
        assert seen == {"domain": domain, "members": 1}
        assert domain.session is session  # the same DSP process: none started again
        await settle(lambda: not domain.members)
        await settle(lambda: len(daemon.broker.domains) == 2)  # default and the lingering one


async def test_a_lingering_domain_closes_when_its_linger_ends(tmp_path: Path) -> None:
    """Nobody came back: the domain closes, its DSP process (context bank) freed."""
    socket_path = tmp_path / "npud.sock"
    linger = {"user_domain_linger_s = 2.0": "user_domain_linger_s = 0.2"}
    async with shipped_daemon(tmp_path, **linger) as daemon:
        driver = daemon.broker.device.driver
        assert isinstance(driver, EmulatedDriver)

        def hello(peer: RawPeer) -> bytes:
            return str(peer.hello("vad-once").domain).encode()

        told = await trio.to_thread.run_sync(lambda: as_user(VICTIM, socket_path, hello))
        assert told.decode() == f"default@{VICTIM}"
        await settle(lambda: daemon.broker.domains.get(f"default@{VICTIM}") is None)
        await settle(lambda: driver.statistics().sessions_in_use == 1)  # root's default only


TEST_URI = "file:///libnpu_test_skel.so?npu_test_skel_handle_invoke&_modver=1.0&_dom=cdsp"


def answer(peer: RawPeer, request: p.AnyRequest) -> p.ServerMessage | p.ConnectionClosed:
    """The answer to ``request``, past the events before it (a restart's)."""
    peer.send(request)
    while isinstance(message := peer.receive(), p.SessionRestarted):
        pass
    return message


def said(message: p.ErrorMessage) -> str:
    return f"{ErrorCode(message.code).name}: {message.message}"


def call(peer: RawPeer, method: int, data: bytes = b"") -> p.ServerMessage | p.ConnectionClosed:
    """Open npu_test (again while the domain restarts, as a client does) and call
    ``method`` (4 busy, 5 fault) on it."""
    for _ in range(200):
        opened = answer(peer, p.OpenRequest(id=peer.next_id(), uri=TEST_URI))
        if not (isinstance(opened, p.ErrorMessage) and opened.code == ErrorCode.DSP_RESTARTED):
            break
        time.sleep(0.05)
    assert isinstance(opened, p.OpenReply), opened
    inputs = (p.InlineInput(data=data),) if data else ()
    return answer(
        peer, p.InvokeRequest(id=peer.next_id(), handle=opened.handle, method=method, inputs=inputs)
    )


def hang_with_fresh_connections(peer: RawPeer) -> bytes:
    """The review's way around a per-connection penalty: each hung call on a new
    connection. Says what each connection was told, and what a third Hello got."""
    told = []
    for n in range(2):
        conn = peer if n == 0 else peer.again()  # type: ignore[attr-defined]
        conn.hello(f"hanger-{n}")
        reply = call(conn, 4, struct.pack("<I", 60_000_000))  # a minute: "never"
        heard = [reply]
        while n and not isinstance(heard[-1], p.ConnectionClosed):  # until it is revoked
            heard.append(conn.receive())
        told.append(" | ".join(said(m) for m in heard if isinstance(m, p.ErrorMessage)))
        conn.close()
    third = peer.again()  # type: ignore[attr-defined]
    third.send(p.Hello(protocol_version=p.PROTOCOL_VERSION, client_name="hanger-2"))
    refused = third.receive()
    told.append(refused.message if isinstance(refused, p.ErrorMessage) else repr(refused))
    return "\n".join(told).encode()


async def test_the_hung_call_penalty_is_the_users_not_the_connections(tmp_path: Path) -> None:
    """The review: a 45 s call restarted the shared default domain, and a new connection
    shed the penalty. Now the call restarts the user's own domain only, and the user's
    second hung call, on a fresh connection, revokes it and refuses its next Hello."""
    socket_path = tmp_path / "npud.sock"
    async with shipped_daemon(
        tmp_path, **{"call_watchdog_s = 30.0": "call_watchdog_s = 0.3"}
    ) as daemon:
        told = await trio.to_thread.run_sync(
            lambda: as_user(ATTACKER, socket_path, hang_with_fresh_connections)
        )
        assert told.count(b"\n") == 2, told
        first, second, third = told.decode().splitlines()
        assert first.startswith("DSP_RESTARTED"), first
        assert f"NOT_PERMITTED: not permitted: 2 calls of uid {ATTACKER} hung past the " in second
        assert third == (
            f"not permitted: 2 calls of uid {ATTACKER} hung past the watchdog; its new "
            "connections are refused for 60 s more"
        )
        root = daemon.broker.domains.get("default")
        assert root is not None
        assert root.restarts == 0


def fault_then_busy(peer: RawPeer) -> bytes:
    """npu_test.fault (it crashes the DSP process), then npu_test.busy for 1 ms."""
    peer.hello("fault-loop")
    fault = call(peer, 5)
    busy = call(peer, 4, struct.pack("<I", 1000))
    return "\n".join(
        said(m) if isinstance(m, p.ErrorMessage) else type(m).__name__ for m in (fault, busy)
    ).encode()


async def test_fault_injection_is_roots_and_fault_uids_only(tmp_path: Path) -> None:
    """The review: npu_test.fault in a loop restarted the shared domain 298 times in 10 s.
    Now another user's fault is NOT_PERMITTED (its busy work is served), and a user
    [emulator] fault_uids lists may crash its own domain."""
    socket_path = tmp_path / "npud.sock"
    async with shipped_daemon(tmp_path) as daemon:
        told = await trio.to_thread.run_sync(
            lambda: as_user(ATTACKER, socket_path, fault_then_busy)
        )
        fault, busy = told.decode().splitlines()
        assert fault == (
            "NOT_PERMITTED: not permitted: method 5 of handle 1 crashes its DSP process on "
            "purpose (fault injection): for root and the users [emulator] fault_uids lists only"
        )
        assert busy == "InvokeReply"
        assert all(domain.restarts == 0 for domain in daemon.broker.domains)
    async with shipped_daemon(
        tmp_path, **{"fault_uids = []": f"fault_uids = [{ATTACKER}]"}
    ) as daemon:
        seen: dict[str, int] = {}

        def look() -> None:
            domain = daemon.broker.domains.get(f"default@{ATTACKER}")
            seen["restarts"] = -1 if domain is None else domain.restarts

        def listed(peer: RawPeer) -> bytes:
            told = fault_then_busy(peer)
            peer.pause(b"")  # type: ignore[attr-defined]
            return told

        told = await trio.to_thread.run_sync(lambda: as_user(ATTACKER, socket_path, listed, look))
        fault, busy = told.decode().splitlines()
        assert fault.startswith("DSP_RESTARTED"), fault
        assert busy == "InvokeReply"
        assert seen == {"restarts": 1}
        root = daemon.broker.domains.get("default")
        assert root is not None
        assert root.restarts == 0


async def test_a_user_sees_the_shared_domains_and_its_own(tmp_path: Path) -> None:
    """Another user's domain names that user: a non-root status leaves it out, as it
    leaves out that user's client rows; npuctl says which domains are a user's."""
    socket_path = tmp_path / "npud.sock"
    async with shipped_daemon(tmp_path):

        def attacker_looks() -> None:
            def look(peer: RawPeer) -> bytes:
                peer.hello("npuctl")
                status = answer(peer, p.StatusRequest(id=peer.next_id()))
                assert isinstance(status, p.StatusReply), status
                return " ".join(sorted(row.name for row in status.status.domains)).encode()

            notes[ATTACKER] = as_user(ATTACKER, socket_path, look)

        def victim_waits(peer: RawPeer) -> bytes:
            peer.hello("vad-victim")
            peer.pause(b"")  # type: ignore[attr-defined]
            return b""

        await trio.to_thread.run_sync(
            lambda: as_user(VICTIM, socket_path, victim_waits, attacker_looks)
        )
        assert notes[ATTACKER] == f"default default@{ATTACKER}".encode()
    assert domain_kind(f"default@{VICTIM}", False) == "user"
    assert (domain_kind("default", False), domain_kind("llm@5#2", True)) == ("shared", "isolated")


async def test_a_users_npuctl_status_opens_no_dsp_process(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """npuctl status, top and metrics say hello.watch: for a user other than root, any
    other Hello opens a DSP process of its own (a context bank) just to read the status.
    A watching connection's requests that need one are refused."""
    socket_path = tmp_path / "npud.sock"
    opened: list[str] = []
    real_open = Domains._open

    async def spy(self: Domains, name: str, **kwargs: Any) -> Any:
        opened.append(name)
        return await real_open(self, name, **kwargs)

    monkeypatch.setattr(Domains, "_open", spy)
    async with shipped_daemon(tmp_path):

        def npuctl_status(peer: RawPeer) -> bytes:
            peer.close()
            out = io.StringIO()
            with contextlib.redirect_stdout(out):
                code = npuctl.main(["--socket", str(peer.path), "status", "--json"])  # type: ignore[attr-defined]
            return f"{code} {out.getvalue()}".encode()

        told = await trio.to_thread.run_sync(lambda: as_user(ATTACKER, socket_path, npuctl_status))
        code, _, text = told.decode().partition(" ")
        assert code == "0", told
        assert [row["name"] for row in json.loads(text)["domains"]] == ["default"]
        assert opened == []  # not default@65533

        def watcher_allocates(peer: RawPeer) -> bytes:
            peer.send(
                p.Hello(protocol_version=p.PROTOCOL_VERSION, client_name="watcher", watch=True)
            )
            welcome = peer.receive()
            assert isinstance(welcome, p.Welcome), welcome
            refused = answer(peer, p.AllocRequest(id=peer.next_id(), size=4096))
            assert isinstance(refused, p.ErrorMessage), refused
            return f"{welcome.domain!r} {welcome.epoch} {said(refused)}".encode()

        told = await trio.to_thread.run_sync(
            lambda: as_user(ATTACKER, socket_path, watcher_allocates)
        )
        assert told.decode() == (
            "'' 0 NOT_PERMITTED: not permitted: alloc: this connection's hello said it only "
            "watches (hello.watch): it has no DSP process; connect without it"
        )
        assert opened == []


async def test_a_domain_whose_last_client_leaves_while_it_restarts_closes_for_good(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With a domain per user, its last client often leaves while it restarts (its hung
    call was the cause). The close waits for the recovery, which closes the session it
    opened and ends: no DSP process (context bank) is left behind, and no recovery
    waits for good on the lanes the close stopped (before, one did per such user)."""
    reopening = trio.Event()
    proceed = trio.Event()
    real_open = Domain._open_session

    async def held_open(self: Domain) -> Any:
        if self.epoch >= 1 and self.owner is not None:  # the recovery's open, not the first
            reopening.set()
            await proceed.wait()
        return await real_open(self)

    monkeypatch.setattr(Domain, "_open_session", held_open)
    socket_path = tmp_path / "npud.sock"
    async with shipped_daemon(
        tmp_path, **{"call_watchdog_s = 30.0": "call_watchdog_s = 0.3"}
    ) as daemon:
        driver = daemon.broker.device.driver
        assert isinstance(driver, EmulatedDriver)

        def hang_and_leave(peer: RawPeer) -> bytes:
            peer.hello("hanger")
            reply = call(peer, 4, struct.pack("<I", 60_000_000))
            peer.pause(b"")  # type: ignore[attr-defined]
            peer.close()  # gone while its domain's new session is being opened
            return said(reply).encode() if isinstance(reply, p.ErrorMessage) else b"?"

        held: list[Domain | None] = []

        def until_reopening() -> None:
            trio.from_thread.run(reopening.wait)
            held.append(daemon.broker.domains.get(f"default@{ATTACKER}"))

        told = await trio.to_thread.run_sync(
            lambda: as_user(ATTACKER, socket_path, hang_and_leave, until_reopening)
        )
        assert told.startswith(b"DSP_RESTARTED"), told
        await settle(lambda: daemon.broker.domains.get(f"default@{ATTACKER}") is None)
        await trio.sleep(0.2)  # the close has begun (and waits for the recovery)
        proceed.set()
        (restarting,) = held
        assert restarting is not None
        await settle(lambda: restarting.state == "closed" and not restarting.healthy())
        await settle(lambda: not restarting._recovering)  # ended, not stuck on a stopped lane
        await settle(lambda: len(daemon.broker.domains) == 1)
        await settle(lambda: driver.statistics().sessions_in_use == 1)  # root's default
