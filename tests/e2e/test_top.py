"""``npuctl top`` against a real npud with a real client working beside it."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import msgspec
import pytest

from npu_client._top import TopFrame
from tests.e2e.daemon import Npud, start_npud

WORKER = """
import struct, sys, npu_client
TEST = "file:///libnpu_test_skel.so?npu_test_skel_handle_invoke&_modver=1.0&_dom=cdsp"
with npu_client.connect(name="decoder", priority="background") as npu:
    with npu.open(TEST) as skel:
        print("READY", flush=True)
        while True:
            skel.invoke(4, [struct.pack("<I", 5000)])  # 5 ms on the DSP, over and over
"""


@pytest.fixture
def npud(tmp_path: Path) -> Iterator[Npud]:
    daemon = start_npud(tmp_path)
    yield daemon
    assert daemon.stop() == 0, daemon.log()


@pytest.fixture
def worker(npud: Npud) -> Iterator[None]:
    env = {**os.environ, "NPUD_SOCKET": str(npud.socket_path)}
    process = subprocess.Popen(
        [sys.executable, "-c", WORKER], env=env, stdout=subprocess.PIPE, text=True
    )
    assert process.stdout is not None
    assert process.stdout.readline().strip() == "READY"
    yield
    process.kill()
    process.wait()
    process.stdout.close()


def npuctl(npud: Npud, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "npu_client.npuctl", "--socket", str(npud.socket_path), *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_top_json_shows_the_working_client(npud: Npud, worker: None) -> None:
    result = npuctl(npud, "top", "--once", "--json", "--interval", "0.5")
    assert result.returncode == 0, result.stderr
    view = msgspec.json.decode(result.stdout, type=TopFrame)
    (row,) = view.rows  # npuctl's own connection is not shown
    assert (row.name, row.priority) == ("decoder", "background")
    assert row.calls_per_s > 10
    assert 10 < row.dsp_pct <= 100  # 5 ms calls back to back: most of the interval
    assert view.mode == "fair"
    assert view.dsp_slots == 4


def test_top_text_into_a_pipe_is_whole_and_counts_agree(npud: Npud, worker: None) -> None:
    result = npuctl(npud, "top", "--count", "2", "--interval", "0.2", "--sort", "name")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert "…" not in result.stdout  # not a terminal: nothing cut
    assert sum(line.startswith("npud ") for line in lines) == 2  # two frames
    assert sum("decoder" in line for line in lines) == 2
    assert "\x1b[" not in result.stdout  # not a terminal: no redrawing
    # One client shown (npuctl's own connection is not), one counted in the domain.
    assert sum("domain default (shared): up, epoch 1, 0 restarts, 1 client," in line
               for line in lines) == 2  # fmt: skip
    assert "(no clients)" not in result.stdout


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--interval", "0"], "must be a positive number of seconds"),
        (["--count", "0"], "must be at least 1"),
        (["--sort", "colour"], "invalid choice"),
    ],
)
def test_top_refuses_bad_arguments(npud: Npud, args: list[str], message: str) -> None:
    result = npuctl(npud, "top", *args)
    assert result.returncode == 64
    assert message in result.stderr
