"""npud's libcdsprpc against a scripted npud (tests/shim/fake_npud.py): frames and
values the real npud on the emulator never sends."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from tests.shim.fake_npud import Frame, fake_npud
from tests.shim.programs import run


def test_a_frame_declaring_two_fds_leaks_neither(api_test: Path, tmp_path: Path) -> None:
    """An alloc_reply declaring (and carrying) 2 fds: the library refuses the frame and
    closes both (it kept the second one before)."""

    def answer(request: dict[str, Any]) -> list[Frame]:
        if request["type"] != "alloc":
            return []
        fds = [os.memfd_create("npud-fake"), os.memfd_create("npud-fake")]
        for fd in fds:
            os.ftruncate(fd, 4096)
        reply = {"type": "alloc_reply", "buffer": 1, "size": 4096, "fd": 0, "dsp_fd": 5}
        return [(reply, fds)]

    with fake_npud(tmp_path / "fake.sock", answer) as path:
        run(api_test, "two_fds", path, timeout=60)


def test_capability_attributes_as_the_device_answers(api_test: Path, tmp_path: Path) -> None:
    """DSPRPC_GET_DSP_INFO for libcdsprpc's internal attributes 128..131 (dspsignal's
    among them) answers what the DSP said in npud's Welcome, not 0; the driver's
    256..259 answer 0 as libcdsprpc's do on mainline."""
    dsp = {
        "arch_ver": 0x79,
        "perf_v2_dsp_support": 0x11,
        "map_dma_handle_reverserpc": 0x12,
        "dspsignal_dsp_support": 1,
        "proc_shared_buffer_support": 0x14,
    }
    with fake_npud(tmp_path / "fake.sock", lambda request: [], dsp) as path:
        run(api_test, "caps", path, timeout=60)


def test_an_older_npud_is_never_asked_for_more_than_256_mib(api_test: Path, tmp_path: Path) -> None:
    """A Welcome without limits.max_buffer_size (a server before version 6, which answers a
    larger alloc with a fatal BAD_MESSAGE): the library refuses it itself."""
    asked: list[dict[str, Any]] = []

    def answer(request: dict[str, Any]) -> list[Frame]:
        asked.append(request)
        return []

    with fake_npud(tmp_path / "fake.sock", answer) as path:
        run(api_test, "big_old", path, timeout=60)
    assert asked == []
