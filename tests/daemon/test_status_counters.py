"""The status's counters never go back (Prometheus counters are read from them), and its
lanes are where PROTOCOL.md section 7.5 says: each domain's in its row from version 6."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import trio

import npu_protocol as p
from npud.daemon.broker import Broker
from npud.runtime.scheduler import Hold
from tests.daemon.test_broker import (
    DOMAINS,
    ECHO_URI,
    client,
    default,
    echo,
    emulator,
    invoke,
    open_handle,
    running,
)


@pytest.fixture
async def broker() -> AsyncIterator[Broker]:
    async with running() as b:
        yield b


async def test_the_calls_total_never_goes_back_when_a_client_leaves(broker: Broker) -> None:
    first = await client(broker)
    handle = await open_handle(broker, first, ECHO_URI)
    for _ in range(3):
        await invoke(broker, first, echo(handle, b"x", 1))
    second = await client(broker)
    handle = await open_handle(broker, second, ECHO_URI)
    await invoke(broker, second, echo(handle, b"y", 1))
    assert broker.status().totals.calls_done == 4
    await broker.release_client(first, DOMAINS[first])
    assert broker.status().totals.calls_done == 4  # was 1: the connected clients' sum
    await broker.release_client(second, DOMAINS[second])
    assert broker.status().totals == p.Totals(calls_done=4)


async def test_releasing_a_client_twice_counts_its_calls_once(broker: Broker) -> None:
    c = await client(broker)
    handle = await open_handle(broker, c, ECHO_URI)
    await invoke(broker, c, echo(handle, b"x", 1))
    await broker.release_client(c, DOMAINS[c])
    broker.clients.remove(c)
    assert broker.status().totals.calls_done == 1


async def test_a_domains_invokes_total_never_goes_back_at_a_restart(broker: Broker) -> None:
    c = await client(broker)
    handle = await open_handle(broker, c, ECHO_URI)
    for _ in range(3):
        await invoke(broker, c, echo(handle, b"x", 1))
    [before] = broker.status().domains
    assert before.invokes_total == before.invokes_done >= 4  # the open and 3 calls, at least
    emulator(broker).faults.subsystem_restart(down_for=0.2)
    with trio.fail_after(10):
        while default(broker).epoch < 2 or default(broker).state != "up":
            await trio.sleep(0.02)
    [after] = broker.status().domains
    assert after.invokes_done < before.invokes_done  # the new session's own count
    assert after.invokes_total >= before.invokes_total + after.invokes_done


async def test_lanes_are_each_domains_in_its_row_from_version_6(broker: Broker) -> None:
    viewer = await client(broker)
    status = broker.status(viewer)
    assert [lane.name for lane in status.lanes] == ["closer"]
    [domain] = status.domains
    assert [lane.name for lane in domain.lanes] == ["control", "loader", "waits"]
    assert all(lane.threads >= 1 for lane in domain.lanes)


async def test_an_older_connection_gets_the_default_domains_lanes_in_the_status() -> None:
    async with running() as broker:
        viewer = await client(broker)
        viewer.protocol_version = 5
        status = broker.status(viewer)
        # Each once, with the names section 7.5 gives (they were "control:default", ...).
        assert [lane.name for lane in status.lanes] == ["control", "loader", "waits", "closer"]


async def test_every_lane_name_is_one_the_protocol_documents() -> None:
    documented = {"control", "loader", "waits", "closer"}
    async with running("[domains]\nallow_isolate = true\n") as broker:
        c = await client(broker)
        isolated = await broker.admit(
            type(c)(pid=4243, uid=1000, gid=1000, name="own"), None, isolate=True
        )
        status = broker.status()
        names = {lane.name for lane in status.lanes}
        names |= {lane.name for row in status.domains for lane in row.lanes}
        assert len(status.domains) == 2
        assert names == documented
        assert isolated.name in {row.name for row in status.domains}


async def test_a_clients_held_batches_are_in_its_row_by_reason(broker: Broker) -> None:
    """What the gate held (the scheduler counts it: tests/daemon/test_scheduler_batches.py)
    reaches the status row as PROTOCOL.md section 7.5's HoldRow, in microseconds."""
    c = await client(broker, p.Priority.BACKGROUND)
    assert c.account is not None
    assert c.row().held == ()  # nothing held yet: empty, as from an older server
    c.account.batch_holds[Hold.REALTIME_DUE] = (3, 0.0125)
    c.account.batch_holds[Hold.REALTIME_OVERDUE] = (1, 0.002)
    (row,) = [r for r in broker.status(c).clients if r.pid == c.pid]
    assert row.held == (
        p.HoldRow(reason="realtime_due", batches=3, held_us=12_500),
        p.HoldRow(reason="realtime_overdue", batches=1, held_us=2_000),
    )
    assert {hold.value for hold in Hold} <= _documented_reasons()


def _documented_reasons() -> set[str]:
    """The reasons PROTOCOL.md's HoldRow table names."""
    document = (Path(__file__).parents[2] / "protocol" / "PROTOCOL.md").read_text()
    table = document[document.index("<!-- fields: HoldRow -->") :]
    reason = next(line for line in table.splitlines() if line.startswith("| `reason`"))
    return set(re.findall(r"`([a-z_]+)`", reason)) - {"reason"}
