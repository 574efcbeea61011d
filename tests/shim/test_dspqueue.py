"""dspqueue, CPU side, against a DSP in a thread (tests/shim/c/fake_dsp.c).

The fake DSP maps the same memory at addresses of its own and speaks the DSP
side of the ring protocol with code of its own; it answers dspqueue_rpc's
methods as a versioning DSP does (or as an old one, for old_dsp). Each
scenario is a run of tests/shim/c/dspq_test.c under the sanitizers.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from tests.shim.programs import INCLUDE, SHIM, run
from tests.tools import require_tool

SCENARIOS = [
    "basic",  # a round trip: header version negotiation, buffers, fd+offset addresses
    "old_dsp",  # a DSP that takes header version UINT32_MAX: no wait counts
    "wrap",  # 256-byte rings, every packet size: wrap-around and the replicated header
    "many",  # 20000 packets from a send and a receive thread; signals coalesce
    "full",  # the DSP reads nothing: writes time out, a blocked writer waits for room
    "resp_full",  # the CPU reads nothing: the DSP waits, and reads wake it
    "timeout",  # AEE_EEXPIRED and AEE_EWOULDBLOCK
    "errors",  # bad arguments, small read buffers, REF/DEREF
    "restart",  # the DSP process dies: waiters wake, AEE_ECONNRESET, a new process
    "lost_idle",  # it dies while nobody waits
    "callbacks",  # packet and error callbacks
    "imported",  # close refused while the DSP still has the queue
    "multi",  # three queues of one process; the 64-queue limit
    "unsupported",  # no dspqueue_rpc skel on the DSP
    "wakeup",  # early-wakeup packets are skipped
    "teardown_error",  # destroy_queue fails: close says so, frees all, a husk to close again
    "hostile",  # a DSP writes impossible ring positions and lengths: AEE_EBADITEM, no access
]


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_scenario(dspq_test: Path, scenario: str) -> None:
    run(dspq_test, scenario, None, timeout=120)


def _functions(disassembly: str) -> dict[str, str]:
    """objdump -d's text, cut into its functions by name."""
    functions: dict[str, str] = {}
    name = ""
    for line in disassembly.splitlines():
        match = re.match(r"^[0-9a-f]+ <(\w+)>:$", line)
        if match:
            name = match.group(1)
            functions[name] = ""
        elif name:
            functions[name] += line + "\n"
    return functions


def test_ring_barriers_on_aarch64(tmp_path: Path) -> None:
    """On ARM the ring is ordered as libcdsprpc orders it: ``dmb sy`` after reading the
    other side's position and before publishing a read position, ``dmb st`` before
    publishing a write position; ``dmb ish``/``dmb ishst`` only as the
    NPUD_SHIM_BARRIERS=inner alternative."""
    gcc = require_tool("aarch64-linux-gnu-gcc", "gcc-aarch64-linux-gnu")
    objdump = require_tool("aarch64-linux-gnu-objdump", "binutils-aarch64-linux-gnu")
    obj = tmp_path / "dspq_ring.o"
    subprocess.run(
        [
            gcc,
            "-std=c11",
            "-O2",
            "-D_GNU_SOURCE",
            f"-I{INCLUDE}",
            f"-I{SHIM / 'src'}",
            "-Wall",
            "-Wextra",
            "-Werror",
            "-c",
            str(SHIM / "src" / "dspq_ring.c"),
            "-o",
            str(obj),
        ],
        check=True,
        timeout=120,
    )
    text = subprocess.run(
        [objdump, "-d", "--no-show-raw-insn", str(obj)],
        check=True,
        capture_output=True,
        text=True,
        timeout=60,
    ).stdout
    functions = _functions(text)
    barriers = {
        name: re.findall(r"\bdmb\s+(\w+)", functions[name])
        for name in ("dspq_ring_room", "dspq_ring_put", "dspq_ring_peek", "dspq_ring_take")
    }
    for name in ("dspq_ring_room", "dspq_ring_peek", "dspq_ring_take"):
        assert "sy" in barriers[name], barriers
        assert "ish" in barriers[name], barriers
        assert "st" not in barriers[name], barriers
    assert barriers["dspq_ring_put"].count("st") == 2, barriers  # position, packet count
    assert "ishst" in barriers["dspq_ring_put"], barriers
    assert not re.search(r"\b(ldar|stlr)\b", "".join(functions[n] for n in barriers))


def test_inner_shareable_is_said(dspq_test: Path) -> None:
    """NPUD_SHIM_BARRIERS=inner is taken, and the log says so."""
    result = run(
        dspq_test,
        "basic",
        None,
        env={"NPUD_SHIM_BARRIERS": "inner", "NPUD_SHIM_LOG": "1"},
    )
    assert "inner-shareable barriers (NPUD_SHIM_BARRIERS=inner)" in result.stderr
    plain = run(dspq_test, "basic", None, env={"NPUD_SHIM_LOG": "1"})
    assert "inner-shareable" not in plain.stderr
