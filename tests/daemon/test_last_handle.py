"""No remotectl close for the handles of a DSP process that ends anyway (issue 21, item 5).

libcdsprpc's remote_handle64_close skips the remotectl close of the last
handle of a domain and ends the session instead (the process's exit unloads
every skel). An isolated domain ends with its client: its handles are not
closed one by one. A shared domain outlives its clients: their handles are.
"""

from __future__ import annotations

from pathlib import Path

import trio

from npu_client import trio_client
from npud.daemon.server import Daemon
from npud.fastrpc.kernel import abi
from npud.fastrpc.kernel.driver import IoctlArg
from npud.sim import EmulatedDriver
from tests.daemon.wire import TEST_URI, serve_daemon

RULES = "[domains]\n[[domains.rule]]\nname = 'iso'\nclients = ['iso-*']\nisolate = true\n"
CLOSES = frozenset({(abi.REMOTECTL1_HANDLE, 0x03010200), (abi.REMOTECTL_HANDLE, 0x01010200)})


def watch_closes(daemon: Daemon) -> list[int]:
    """The handle of every remotectl close INVOKE from now on."""
    driver = daemon.broker.device.driver
    assert isinstance(driver, EmulatedDriver)
    seen: list[int] = []
    ioctl = driver.ioctl

    def watching(fd: int, request: int, arg: IoctlArg) -> int:
        if (
            request == abi.FASTRPC_IOCTL_INVOKE
            and isinstance(arg, abi.fastrpc_invoke)
            and (int(arg.handle), int(arg.sc)) in CLOSES
        ):
            seen.append(int(arg.handle))
        return ioctl(fd, request, arg)

    driver.ioctl = watching  # type: ignore[method-assign,assignment]
    return seen


async def settled(daemon: Daemon, domains: int) -> None:
    with trio.fail_after(10):
        while len(daemon.broker.status().domains) != domains:
            await trio.sleep(0.01)


async def test_an_isolated_clients_handles_go_with_its_process(tmp_path: Path) -> None:
    path = tmp_path / "npud.sock"
    async with serve_daemon(tmp_path, RULES) as daemon:
        closes = watch_closes(daemon)
        async with trio_client.open_trio_client(path, name="iso-once") as npu:
            await npu.open(TEST_URI)
        await settled(daemon, 1)
        assert closes == []
        driver = daemon.broker.device.driver
        assert isinstance(driver, EmulatedDriver)
        assert driver.statistics().remote_handles_open == 0  # the exit unloaded it


async def test_a_shared_domains_handles_are_closed(tmp_path: Path) -> None:
    path = tmp_path / "npud.sock"
    async with serve_daemon(tmp_path, RULES) as daemon:
        closes = watch_closes(daemon)
        async with trio_client.open_trio_client(path, name="plain") as npu:
            await npu.open(TEST_URI)
        with trio.fail_after(10):
            while not closes:
                await trio.sleep(0.01)
        assert len(closes) == 1
