"""npud's footprint during an attack: its peak resident memory and open fds."""

from __future__ import annotations

import contextlib
import os
import threading
import time
from pathlib import Path


class Sampler:
    """npud's peak RSS and fd count, sampled every 20 ms while a window lasts."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.rss = 0
        self.fds = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="attacks-sampler", daemon=True)

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while True:
            with contextlib.suppress(OSError):
                for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
                    if line.startswith("VmRSS:"):
                        self.rss = max(self.rss, int(line.split()[1]) * 1024)
                self.fds = max(self.fds, len(os.listdir(f"/proc/{self.pid}/fd")))
            if self._stop.wait(0.02):
                return


def open_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def settle(pid: int, fds: int, timeout: float = 15.0) -> None:
    """Wait until npud holds no more fds than with the victim alone: the last attack's
    connections and DSP processes are gone before the next quiet window."""
    deadline = time.monotonic() + timeout
    while open_fds(pid) > fds and time.monotonic() < deadline:
        time.sleep(0.05)
