"""The emulated driver's faults as ``debug`` uses them (the Driver seam's ``FaultControl``).

The fault injector's own controls, and a crash of one DSP process, which needs the
driver's table of device fds (so the driver passes its ``crash_process``).
"""

from __future__ import annotations

from collections.abc import Callable

from npud.sim.faults import FaultInjector


class DriverFaultControl:
    """The driver's faults: the injector's, and a crash of one DSP process."""

    def __init__(self, faults: FaultInjector, crash_process: Callable[[int], bool]) -> None:
        self._crash_process = crash_process
        self.subsystem_restart = faults.subsystem_restart
        self.set_latency = faults.set_latency
        self.fail_next_invoke = faults.fail_next_invoke
        self.clear = faults.clear

    def crash_process(self, fd: int) -> bool:
        return self._crash_process(fd)
