"""``npud --trace``: a whole daemon run recorded, then replayed against today's session code."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from npud.fastrpc.recording.replay import load_trace, replay
from tests.e2e.daemon import start_npud


def test_a_traced_daemon_run_replays(tmp_path: Path) -> None:
    trace = tmp_path / "run.jsonl"
    npud = start_npud(tmp_path, extra_args=["--trace", str(trace)])
    try:
        result = subprocess.run(
            [sys.executable, "-m", "npu_client.npuctl", "selftest"],
            env={**os.environ, "NPUD_SOCKET": str(npud.socket_path)},
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert result.returncode == 0, result.stdout + result.stderr
    finally:
        assert npud.stop() == 0, npud.log()
    assert "tracing FastRPC calls" in npud.log()
    loaded = load_trace(trace)
    assert loaded.complete  # the daemon closed it on SIGTERM
    ops = [op["op"] for op in loaded.ops]
    assert ops[:3] == ["heap_open", "open", "load_shell"]  # memory first, then the default domain
    # Client buffers come from the system heap (heap_alloc), or from the driver's
    # ALLOC_DMA_BUFF where there is none (alloc_unowned); the daemon lets go (release).
    assert {"map", "remote_open", "invoke", "remote_close", "release", "close"} <= set(ops)
    assert {"heap_open"} <= set(ops)
    assert {"heap_alloc", "alloc_unowned"} & set(ops)
    threads = {op["thread"] for op in loaded.ops}
    assert len(threads) > 1  # lanes and workers: the replay runs them on threads of their own
    report = replay(trace)
    assert report.ok, report.summary()


def test_the_config_key_records_too_and_a_bad_path_stops_npud(tmp_path: Path) -> None:
    trace = tmp_path / "by-config.jsonl"
    npud = start_npud(tmp_path, f"[daemon]\ntrace = '{trace}'\n")
    assert npud.stop() == 0, npud.log()
    first = json.loads(trace.read_text().splitlines()[0])
    assert (first["kind"], first["backend"]) == ("header", "emulator")

    bad = tmp_path / "bad"
    bad.mkdir()
    broken = start_npud(bad, extra_args=["--trace", str(bad / "missing" / "t.jsonl")], wait=False)
    assert broken.process.wait(30) == 73  # EX_CANTCREAT
    assert "cannot write the trace" in broken.log()
