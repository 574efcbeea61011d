"""The DSP's view of the host's reverse modules: apps_remotectl in front of apps_std/apps_mem."""

from __future__ import annotations

from npud.fastrpc.reverse.apps_std import AppsStdServer
from npud.fastrpc.reverse.reverse_modules import Reply, ReverseModule, ReverseModules


class Host:
    """``ReverseModules`` over an AppsStdServer (and more modules), with the server's counters."""

    def __init__(self, std: AppsStdServer, *more: ReverseModule) -> None:
        self.std = std
        self.modules = ReverseModules([std, *more])
        self.apps_std_handle: int | None = None

    def dispatch(self, handle: int, sc: int, inputs: list[bytes], caps: list[int]) -> Reply:
        return self.modules.dispatch(handle, sc, inputs, caps)

    @property
    def open_files(self) -> int:
        return self.std.open_files

    @property
    def files_served(self) -> int:
        return self.std.files_served

    def close(self) -> None:
        self.modules.close()
