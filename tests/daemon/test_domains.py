"""Domains through a real daemon: who shares a DSP process, who gets one of their own,
the bound, faults that stay in their domain, the client that pays for a hung call, and
model loads shared within a domain (issue 17)."""

from __future__ import annotations

import socket
from pathlib import Path

import numpy as np
import pytest
import trio
import trio.testing

import npu_client
import npu_protocol as p
from npu_client import trio_client
from npu_protocol import ErrorCode
from npud.daemon.server import Daemon
from npud.sim import EmulatedDriver
from tests.daemon.wire import ECHO_URI, TEST_URI, RawPeer, busy, serve_daemon
from tests.emulator import onnx_models

RULES = (
    "[domains]\n"
    "{domains}"
    "[[domains.rule]]\nname = 'voice'\nclients = ['voice-*']\n"
    "[[domains.rule]]\nname = 'iso'\nclients = ['iso-*']\nisolate = true\n"
)


def sim_of(daemon: Daemon) -> EmulatedDriver:
    driver = daemon.broker.device.driver
    assert isinstance(driver, EmulatedDriver)
    return driver


def rows(daemon: Daemon) -> dict[str, p.DomainRow]:
    return {row.name: row for row in daemon.broker.status().domains}


async def hello(path: Path, name: str) -> p.Welcome | p.ErrorMessage:
    """One Hello on a raw socket: the Welcome, or the error that refused it."""
    sock = trio.socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    await sock.connect(str(path))
    peer = RawPeer(sock)
    await peer.write(p.Hello(protocol_version=p.PROTOCOL_VERSION, client_name=name))
    while True:
        event = peer.protocol.next_event()
        if event is p.NEED_DATA:
            peer.protocol.receive_data(await sock.recv(65536))
            continue
        sock.close()
        assert isinstance(event, p.Welcome | p.ErrorMessage), event
        return event


async def settle(daemon: Daemon, condition: object) -> None:
    with trio.fail_after(10):
        while not condition():  # type: ignore[operator]
            await trio.sleep(0.01)


async def test_connections_go_where_the_rules_say(tmp_path: Path) -> None:
    path = tmp_path / "npud.sock"
    async with (
        serve_daemon(tmp_path, RULES.format(domains="")) as daemon,
        trio_client.open_trio_client(path, name="plain") as plain,
        trio_client.open_trio_client(path, name="voice-vad") as vad,
        trio_client.open_trio_client(path, name="voice-stt") as stt,
        trio_client.open_trio_client(path, name="iso-a") as iso_a,
        trio_client.open_trio_client(path, name="iso-b") as iso_b,
    ):
        assert (plain.domain, vad.domain, stt.domain) == ("default", "voice", "voice")
        assert {iso_a.domain, iso_b.domain} == {"iso#1", "iso#2"}
        table = rows(daemon)
        assert set(table) == {"default", "voice", "iso#1", "iso#2"}
        assert (table["voice"].clients, table["voice"].isolated) == (2, False)
        assert (table[iso_a.domain].clients, table[iso_a.domain].isolated) == (1, True)
        assert sim_of(daemon).statistics().sessions_in_use == 4  # one DSP process each
        by_name = {row.name: row.domain for row in daemon.broker.status().clients}
        assert by_name["iso-a"] == iso_a.domain
        # Each DSP process runs its clients' calls.
        for client in (plain, vad, iso_a):
            async with await client.open(ECHO_URI) as echo:
                out = await echo.invoke(2, [b"\x02\0\0\0\x02\0\0\0", b"hi"], [2])
                assert out == [b"hi"]
        await iso_b.close()
        await settle(daemon, lambda: "iso#2" not in rows(daemon) or iso_a.domain == "iso#2")
    assert sim_of(daemon).statistics().sessions_in_use == 0


async def test_an_isolated_domain_closes_with_its_client(tmp_path: Path) -> None:
    path = tmp_path / "npud.sock"
    async with serve_daemon(tmp_path, RULES.format(domains="")) as daemon:
        async with trio_client.open_trio_client(path, name="iso-once") as npu:
            buffer = await npu.alloc(4096)
            await buffer.map()
            await npu.open(TEST_URI)
            assert sim_of(daemon).statistics().sessions_in_use == 2
        await settle(daemon, lambda: len(rows(daemon)) == 1)
        stats = sim_of(daemon).statistics()
        assert (stats.sessions_in_use, stats.mem_maps, stats.remote_handles_open) == (1, 0, 0)
        memory = daemon.broker.device.require_memory().statistics()
        assert memory.buffers == 0


async def test_the_bound_on_dsp_processes_refuses_clearly(tmp_path: Path) -> None:
    path = tmp_path / "npud.sock"
    async with (
        serve_daemon(tmp_path, RULES.format(domains="max_domains = 2\n")) as daemon,
        trio_client.open_trio_client(path, name="iso-first") as first,
    ):
        assert first.domain == "iso#1"
        refused = await hello(path, "iso-second")
        assert isinstance(refused, p.ErrorMessage)
        assert refused.error_code is ErrorCode.QUOTA_EXCEEDED
        assert refused.message == "DSP processes (domains) quota exceeded: the limit is 2"
        # A shared domain would need a process too: refused the same way.
        assert isinstance(await hello(path, "voice-x"), p.ErrorMessage)
        # The default domain's clients are unaffected.
        welcome = await hello(path, "plain")
        assert isinstance(welcome, p.Welcome)
        assert welcome.domain == "default"
        assert len(rows(daemon)) == 2


async def test_a_device_without_free_sessions_is_no_free_session(tmp_path: Path) -> None:
    path = tmp_path / "npud.sock"
    async with serve_daemon(tmp_path, RULES.format(domains="")) as daemon:
        sim_of(daemon).faults.limit_sessions(1)  # another program holds the rest
        refused = await hello(path, "iso-greedy")
        assert isinstance(refused, p.ErrorMessage)
        assert refused.error_code is ErrorCode.NO_FREE_SESSION
        assert len(rows(daemon)) == 1


WATCHDOG = "[daemon]\ncall_watchdog_s = 0.3\nhung_call_throttle_s = 30\n"


async def test_a_hung_call_restarts_its_domain_only_and_its_client_pays(tmp_path: Path) -> None:
    """A call past the watchdog in an isolated domain: that DSP process restarts, the
    client is told and throttled, and a client of another domain sees no event, no
    error and keeps its objects; a second hang revokes the offender."""
    path = tmp_path / "npud.sock"
    seen: list[p.ServerEvent] = []
    async with (
        serve_daemon(tmp_path, WATCHDOG + RULES.format(domains="")) as daemon,
        trio_client.open_trio_client(path, name="bystander", on_event=seen.append) as bystander,
    ):
        kept = await bystander.alloc(4096)
        await kept.map()
        echo = await bystander.open(ECHO_URI)
        offender = await RawPeer.connect(path, name="iso-looper")
        await offender.write(p.OpenRequest(id=1, uri=TEST_URI))
        opened = await offender.next()
        assert isinstance(opened, p.OpenReply)
        await offender.write(busy(2, opened.handle, 5_000_000))
        answer = await offender.next()  # the domain's DSP process was ended under it
        assert isinstance(answer, p.ErrorMessage)
        assert answer.error_code is ErrorCode.DSP_RESTARTED
        restarted = await offender.next()
        assert isinstance(restarted, p.SessionRestarted)
        assert (restarted.epoch, restarted.domain) == (2, "iso#1")
        row = next(r for r in daemon.broker.status().clients if r.name == "iso-looper")
        assert (row.hung_calls, row.throttled) == (1, True)
        assert rows(daemon)["iso#1"].hung_calls == 1
        assert rows(daemon)["default"].restarts == 0
        # The bystander: no event, its objects intact, its calls served all along.
        assert await echo.invoke(2, [b"\x02\0\0\0\x02\0\0\0", b"ok"], [2]) == [b"ok"]
        assert kept.dsp_address is not None
        assert seen == []
        # A second hang: revoked.
        await offender.write(p.OpenRequest(id=3, uri=TEST_URI))
        reopened = await offender.next()
        assert isinstance(reopened, p.OpenReply)
        await offender.write(busy(4, reopened.handle, 5_000_000))
        revoked: list[p.ServerMessage] = []
        with trio.fail_after(10):
            while not any(isinstance(m, p.ErrorMessage) and m.id is None for m in revoked):
                revoked.append(await offender.next())
        final = revoked[-1]
        assert isinstance(final, p.ErrorMessage)
        assert final.error_code is ErrorCode.NOT_PERMITTED
        assert "2 calls of uid 0 hung past the watchdog" in final.message
        offender.close()
        assert seen == []


async def test_a_skel_crash_restarts_its_domain_only(tmp_path: Path) -> None:
    """A skel faults mid-call: its DSP process dies. The daemon sees the process end (the
    session's listener stops), answers the call DSP_RESTARTED, tells that domain's clients
    and restarts it; the other domain sees nothing, and the crashed domain serves again."""
    path = tmp_path / "npud.sock"
    seen: list[p.ServerEvent] = []
    told: list[p.ServerEvent] = []
    async with (
        serve_daemon(tmp_path, RULES.format(domains="")) as daemon,
        trio_client.open_trio_client(path, name="bystander", on_event=seen.append) as bystander,
        trio_client.open_trio_client(path, name="iso-crasher", on_event=told.append) as crasher,
    ):
        echo = await bystander.open(ECHO_URI)
        skel = await crasher.open(TEST_URI)
        with pytest.raises(npu_client.DspRestarted, match="crashed"):
            await skel.invoke(5, [])
        await settle(daemon, lambda: rows(daemon)[crasher.domain].state == "up")
        assert rows(daemon)[crasher.domain].restarts == 1
        again = await crasher.open(TEST_URI)  # reads the event that came meanwhile
        assert len(told) == 1
        assert isinstance(told[0], p.SessionRestarted)
        assert told[0].domain == crasher.domain
        assert "ended on its own" in told[0].reason
        await again.invoke(4, [b"\x01\0\0\0"])
        assert await echo.invoke(2, [b"\x02\0\0\0\x02\0\0\0", b"ok"], [2]) == [b"ok"]
        assert (seen, rows(daemon)["default"].restarts) == ([], 0)


async def test_news_of_a_replaced_session_changes_nothing(tmp_path: Path) -> None:
    """A listener that stops, or a watchdog that fires, after its domain restarted speaks
    of the old session: the new one stays (it restarted twice before this fix)."""
    async with serve_daemon(tmp_path) as daemon:
        domain = daemon.broker.domains.get("default")
        assert domain is not None
        old = domain.session
        domain.notice_restart("the first news")
        await settle(daemon, lambda: domain.state == "up" and domain.session is not old)
        assert domain.epoch == 2
        domain.notice_restart("late news of the old session", old)
        domain.notice_hung("a late watchdog of the old session", old)
        # The notices reach trio through run_sync_soon; once every task is blocked again
        # they have been handled, and a restart would have begun.
        await trio.testing.wait_all_tasks_blocked(cushion=0.05)
        assert (domain.epoch, domain.state) == (2, "up")
        domain.notice_restart("news of the current session", domain.session)
        await settle(daemon, lambda: domain.epoch == 3 and domain.state == "up")


async def test_an_endless_model_burns_only_its_own_domain(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A model that loops without end (one the load check missed, as a file rewritten
    after the check would be) runs in its client's DSP process: the watchdog ends that
    process, the offender pays, and another client's model runs all along, every one of
    them answered, the daemon healthy throughout (issue 16, item 3)."""
    from npud.fastrpc.stubs import model_format, model_walks
    from npud.requests import model_check

    monkeypatch.setattr(model_format, "check_contents", lambda fd, size, budget=None: None)
    # in npud's process, where the patch holds (a large file is walked in a child)
    monkeypatch.setattr(model_check, "walk_in_child", model_walks.walk_model_file)
    path = tmp_path / "npud.sock"
    looping = tmp_path / "loop.onnx"
    looping.write_bytes(onnx_models.endless_loop())
    steady = tmp_path / "affine.onnx"
    steady.write_bytes(onnx_models.affine())
    seen: list[p.ServerEvent] = []
    async with (
        serve_daemon(tmp_path, WATCHDOG + RULES.format(domains="")) as daemon,
        trio_client.open_trio_client(path, name="steady", on_event=seen.append) as victim,
        trio_client.open_trio_client(path, name="iso-spinner") as spinner,
    ):
        model = await victim.load_model(steady)
        endless = await spinner.load_model(looping)
        a = np.array([1, 2, 3], np.float32)
        runs = 0
        healthy = True

        async def keep_running() -> None:
            nonlocal runs, healthy
            while True:
                out = await model.run({"a": a, "b": a, "k": runs})
                np.testing.assert_array_equal(out["y"], a * 3)
                healthy = healthy and daemon.broker.healthy()
                runs += 1
                await trio.sleep(0)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(keep_running)
            with pytest.raises(npu_client.DspRestarted), trio.fail_after(30):
                await endless.run({"x": np.zeros(1, np.float32)})
            nursery.cancel_scope.cancel()
        assert runs > 0
        assert healthy
        assert seen == []
        table = rows(daemon)
        assert (table[spinner.domain].hung_calls, table["default"].restarts) == (1, 0)
        row = next(r for r in daemon.broker.status().clients if r.name == "iso-spinner")
        assert (row.hung_calls, row.throttled) == (1, True)


async def test_a_model_loaded_twice_in_a_domain_is_loaded_once(tmp_path: Path) -> None:
    path = tmp_path / "npud.sock"
    model_path = tmp_path / "affine.onnx"
    model_path.write_bytes(onnx_models.affine())
    async with (
        serve_daemon(tmp_path) as daemon,
        trio_client.open_trio_client(path, name="first") as first,
        trio_client.open_trio_client(path, name="second") as second,
    ):
        one = await first.load_model(model_path)
        handles_after_one = sim_of(daemon).statistics().remote_handles_open
        two = await second.load_model(model_path)
        assert sim_of(daemon).statistics().remote_handles_open == handles_after_one
        assert rows(daemon)["default"].models == 1
        assert (await one.info()).arena_bytes == (await two.info()).arena_bytes
        a = np.array([1, 2, 3], np.float32)
        b = np.full(3, 0.5, np.float32)
        out_one = await one.run({"a": a, "b": b, "k": 1})
        out_two = await two.run({"a": -a, "b": b, "k": 7})  # each its own arena
        np.testing.assert_array_equal(out_one["y"], a * 2 + 0.5)
        np.testing.assert_array_equal(out_two["y"], -a * 2 + 0.5)
        assert (int(out_one["n"]), int(out_two["n"])) == (2, 8)
        other_shapes = await first.load_model(tmp_path / "affine.onnx", name="again")
        assert rows(daemon)["default"].models == 1  # the same bytes and shapes: shared
        await other_shapes.unload()
        await one.unload()
        np.testing.assert_array_equal((await two.run({"a": a}))["y"], a * 2 + 0.5)
        await two.unload()
        assert rows(daemon)["default"].models == 0
        assert sim_of(daemon).statistics().remote_handles_open == handles_after_one - 1


async def test_different_shapes_or_bytes_are_different_loads(tmp_path: Path) -> None:
    path = tmp_path / "npud.sock"
    free = tmp_path / "free.onnx"
    free.write_bytes(onnx_models.add_one(("n", 4)))
    async with (
        serve_daemon(tmp_path) as daemon,
        trio_client.open_trio_client(path, name="shapes") as npu,
    ):
        three = await npu.load_model(free, shapes={"x": (3, 4)})
        five = await npu.load_model(free, shapes={"x": (5, 4)})
        assert rows(daemon)["default"].models == 2
        assert three.inputs[0].shape == (3, 4)
        assert five.inputs[0].shape == (5, 4)
        await three.unload()
        await five.unload()


async def test_a_file_rewritten_in_place_is_a_different_load(tmp_path: Path) -> None:
    path = tmp_path / "npud.sock"
    model_path = tmp_path / "model.onnx"
    model_path.write_bytes(onnx_models.affine())
    async with (
        serve_daemon(tmp_path) as daemon,
        trio_client.open_trio_client(path, name="first") as first,
        trio_client.open_trio_client(path, name="second") as second,
    ):
        old = await first.load_model(model_path)
        with model_path.open("r+b") as rewritten:  # the same inode, other bytes
            rewritten.write(onnx_models.add_one((3,)))
            rewritten.truncate()
        new = await second.load_model(model_path)
        assert rows(daemon)["default"].models == 2
        x = np.array([1, 2, 3], np.float32)
        np.testing.assert_array_equal((await new.run({"x": x}))["y"], x + 1)
        assert {tensor.name for tensor in old.inputs} == {"a", "b", "k"}


async def test_domains_do_not_share_loads(tmp_path: Path) -> None:
    path = tmp_path / "npud.sock"
    model_path = tmp_path / "affine.onnx"
    model_path.write_bytes(onnx_models.affine())
    async with (
        serve_daemon(tmp_path, RULES.format(domains="")) as daemon,
        trio_client.open_trio_client(path, name="plain") as plain,
        trio_client.open_trio_client(path, name="iso-own") as own,
    ):
        await plain.load_model(model_path)
        await own.load_model(model_path)
        table = rows(daemon)
        assert (table["default"].models, table[own.domain].models) == (1, 1)


async def test_status_names_each_clients_domain_and_npuctl_shows_them(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from npu_client import npuctl

    path = tmp_path / "npud.sock"
    async with (
        serve_daemon(tmp_path, RULES.format(domains="")),
        trio_client.open_trio_client(path, name="iso-shown"),
    ):
        code = await trio.to_thread.run_sync(lambda: npuctl.main(["--socket", str(path), "status"]))
    out = capsys.readouterr().out
    assert code == 0
    assert "domains:" in out
    assert "iso#1" in out
    assert "isolated" in out
