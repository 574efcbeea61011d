"""Record and replay: the shipped trace replays, an altered one names its divergence.

``tests/emulator/traces/echo.jsonl`` is the emulator's recording of the echo
scenario, made with::

    npud trace record --replace --backend emulator --scenario echo tests/emulator/traces/echo.jsonl

A test below records the scenario again and checks the file is still what the
recorder produces (regenerate it with that command when a change to the
session is meant to change its calls). Traces recorded on a device replay
the same way (docs/hardware.md).
"""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from npud.fastrpc.kernel import abi
from npud.fastrpc.kernel.driver import Driver, KernelDriver
from npud.fastrpc.kernel.errors import RpcError
from npud.fastrpc.recording.replay import TraceFormatError, load_trace, replay
from npud.fastrpc.recording.trace import TraceWriter, TracingDriver
from npud.fastrpc.session import FastRpcSession
from npud.ops.backend import DEV_SHELL
from npud.ops.trace_cli import echo_scenario, model_scenario
from npud.sim import DSP_LIBRARY_DIR, EmulatedDriver, SimConfig
from tests.emulator import onnx_models
from tests.emulator.conftest import fastrpc_threads, library_path, open_fds

FIXTURE = Path(__file__).parent / "traces" / "echo.jsonl"
VOLATILE = frozenset({"t", "dur", "started", "npud", "machine", "in", "out"})
"""Times, versions and raw struct bytes (they hold this run's pointers) differ between runs."""


def record(
    path: Path,
    scenario: Callable[[FastRpcSession], None],
    *,
    config: SimConfig | None = None,
    inject: Callable[[EmulatedDriver], None] | None = None,
) -> None:
    writer = TraceWriter(path, backend="emulator")
    emulator = EmulatedDriver(config)
    try:
        with FastRpcSession.open(
            TracingDriver(emulator, writer), library_path=[DSP_LIBRARY_DIR]
        ) as session:
            session.load_shell(DEV_SHELL.read_bytes())
            if inject is not None:
                inject(emulator)
            scenario(session)
    finally:
        writer.close()


def records(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def stable(record: dict[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in record.items() if key not in VOLATILE}


def rewrite(source: Path, target: Path, change: Callable[[dict[str, Any]], None]) -> None:
    lines = []
    for record in records(source):
        change(record)
        lines.append(json.dumps(record, separators=(",", ":")))
    target.write_text("\n".join(lines) + "\n")


@pytest.fixture(autouse=True)
def _nothing_left_behind() -> Any:
    before = open_fds()
    yield
    assert open_fds() == before, "fds leaked"
    assert not fastrpc_threads()


# --- the shipped trace -------------------------------------------------------------------


def test_the_shipped_trace_replays_without_divergence() -> None:
    report = replay(FIXTURE)
    assert report.ok, report.summary()
    assert report.replayed == report.calls > 30
    assert report.summary().startswith(f"replayed {report.calls} calls in {report.ops} operations")


def test_the_shipped_trace_is_what_the_recorder_writes_today(tmp_path: Path) -> None:
    fresh = tmp_path / "echo.jsonl"
    record(fresh, echo_scenario)
    assert [stable(r) for r in records(fresh)] == [stable(r) for r in records(FIXTURE)], (
        "the session's calls changed: if that is intended, regenerate the fixture with "
        "`npud trace record --replace --backend emulator --scenario echo tests/emulator/traces/echo.jsonl`"
    )


def test_the_shipped_trace_names_no_path_of_a_machine() -> None:
    text = FIXTURE.read_text()
    for prefix in ("/work", "/tmp", "/root", "/home"):
        assert prefix not in text
    header = records(FIXTURE)[0]
    assert (header["format"], header["version"], header["kernel"]) == (
        "npud-trace",
        1,
        "emulated",
    )


# --- altered traces: the first divergence, by call number and field -------------------------


def test_an_altered_field_is_reported_with_its_call_and_name(tmp_path: Path) -> None:
    altered = tmp_path / "altered.jsonl"
    changed: list[int] = []

    def change(record: dict[str, Any]) -> None:
        fields = record.get("fields") or {}
        if record.get("request") == "INVOKE" and fields.get("sc") == 0x02020100 and not changed:
            fields["sc"] = 0x02020101
            changed.append(record["n"])

    rewrite(FIXTURE, altered, change)
    report = replay(altered)
    assert not report.ok
    divergence = report.divergence
    assert divergence is not None
    assert (divergence.call, divergence.field) == (changed[0], "fields.sc")
    assert (divergence.expected, divergence.actual) == (0x02020101, 0x02020100)
    assert str(divergence).startswith(f"call {changed[0]} (INVOKE on dev0")
    assert "fields.sc: trace 0x2020101, session 0x2020100" in str(divergence)


def test_an_altered_input_buffer_is_reported(tmp_path: Path) -> None:
    altered = tmp_path / "altered.jsonl"

    def change(record: dict[str, Any]) -> None:
        if record.get("kind") == "op" and record.get("op") == "remote_open":
            record["args"]["uri"] = record["args"]["uri"].replace("echo", "ohce")

    rewrite(FIXTURE, altered, change)
    divergence = replay(altered).divergence
    assert divergence is not None
    assert divergence.field == "args[1].data"  # the URI the session sent to remotectl
    assert divergence.call is not None


def test_an_altered_answer_is_reported_at_the_operation(tmp_path: Path) -> None:
    altered = tmp_path / "altered.jsonl"

    def change(record: dict[str, Any]) -> None:
        if record.get("kind") == "op" and record.get("op") == "map":
            record["result"]["address"] += 4096

    rewrite(FIXTURE, altered, change)
    divergence = replay(altered).divergence
    assert divergence is not None
    assert (divergence.call, divergence.field) == (None, "result.address")
    assert str(divergence).startswith(f"op {divergence.op} (map)")


def test_a_missing_call_is_reported(tmp_path: Path) -> None:
    altered = tmp_path / "altered.jsonl"
    lines = FIXTURE.read_text().splitlines()
    unmap = next(i for i, line in enumerate(lines) if '"request":"MEM_UNMAP"' in line)
    number = json.loads(lines[unmap])["n"]
    altered.write_text("\n".join(lines[:unmap] + lines[unmap + 1 :]) + "\n")
    report = replay(altered, timeout=2.0)
    assert not report.ok
    assert "made a ioctl call" in report.summary() or f"call {number}" in report.summary()


def test_a_recorded_errno_is_given_back(tmp_path: Path) -> None:
    """A trace of a device that timed out a MEM_MAP: the session fails the same way."""
    trace = tmp_path / "timeout.jsonl"

    def scenario(session: FastRpcSession) -> None:
        buffer = session.alloc(4096)
        with pytest.raises(RpcError):
            session.map(buffer)
        session.free(buffer)

    def inject(emulator: EmulatedDriver) -> None:
        emulator.faults.fail_next_ioctl(abi.FASTRPC_IOCTL_MEM_MAP, errno.ETIMEDOUT)

    record(trace, scenario, inject=inject)
    mem_map = next(r for r in records(trace) if r.get("request") == "MEM_MAP")
    assert mem_map["errno"] == errno.ETIMEDOUT
    op = next(r for r in records(trace) if r.get("op") == "map")
    assert op["error"]["code"] == "TIMEOUT"
    assert replay(trace).ok


# --- what else a trace carries ------------------------------------------------------------


@pytest.mark.parametrize("path", ["fopen_with_env", "fopen_with_env_fd", "search_paths"])
def test_model_loads_through_lent_descriptors_replay(tmp_path: Path, path: str) -> None:
    model = tmp_path / "m.onnx"
    model.write_bytes(onnx_models.add_one())
    trace = tmp_path / "model.jsonl"
    record(
        trace,
        lambda session: model_scenario(session, model),
        config=SimConfig(loader_paths=(path,)),  # type: ignore[arg-type]
    )
    kinds = {r["kind"] for r in records(trace)}
    assert {"reverse", "file", "op", "call"} <= kinds
    exposed = next(r for r in records(trace) if r.get("op") == "expose_file")
    assert exposed["result"]["name"].startswith("npud-fd-")
    model.unlink()  # the replay reads it from the trace
    if path == "search_paths":
        # The DSP asked for absolute paths of this machine's library directory.
        report = replay(trace, library_path=[DSP_LIBRARY_DIR])
    else:
        report = replay(trace)
    assert report.ok, report.summary()


def test_reverse_calls_name_their_method_and_file(tmp_path: Path) -> None:
    trace = tmp_path / "echo.jsonl"
    record(trace, echo_scenario)
    reverse = [r for r in records(trace) if r["kind"] == "reverse"]
    assert {"module": "apps_remotectl", "name": "open", "file": "apps_std"}.items() <= reverse[
        0
    ].items()
    fopen = next(r for r in reverse if r["name"] == "fopen_with_env")
    assert (fopen["module"], fopen["file"], fopen["result"]) == (
        "apps_std",
        "libecho_skel.so",
        0,
    )
    files = [r for r in records(trace) if r["kind"] == "file"]
    assert [f["name"] for f in files] == ["libecho_skel.so"]


def test_errors_pass_through_the_tracing_driver_unchanged(tmp_path: Path) -> None:
    writer = TraceWriter(tmp_path / "t.jsonl", backend="emulator")
    driver = TracingDriver(EmulatedDriver(), writer)
    with pytest.raises(OSError, match="not a node of the emulated DSP") as caught:
        driver.open("/dev/nothing", os.O_RDWR)
    assert caught.value.errno == errno.ENOENT
    writer.close()
    writer.close()  # idempotent
    (call,) = [r for r in records(tmp_path / "t.jsonl") if r["kind"] == "call"]
    assert (call["call"], call["errno"], call["path"]) == ("open", errno.ENOENT, "/dev/nothing")
    assert records(tmp_path / "t.jsonl")[-1]["kind"] == "end"


# --- files that are not traces --------------------------------------------------------------


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("", "empty"),
        ("not json\n", ":1: not a JSON line"),
        ('{"kind":"call"}\n', ":1: not an npud-trace file"),
        ('{"kind":"header","format":"npud-trace","version":2}\n', "version 2; this npud reads"),
        ('{"kind":"header","format":"npud-trace","version":1}\n[1]\n', ":2: a record must be"),
        ('{"kind":"header","format":"npud-trace","version":1}\n{"kind":"x"}\n', "unknown record"),
    ],
)
def test_files_that_are_not_traces(tmp_path: Path, content: str, message: str) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text(content)
    with pytest.raises(TraceFormatError, match=message):
        load_trace(path)


def test_the_command_line(tmp_path: Path) -> None:
    def npud(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "npud.daemon.main", "trace", *args],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )

    ok = npud("replay", str(FIXTURE))
    assert (ok.returncode, ok.stdout.startswith("replayed ")) == (0, True), ok.stderr
    altered = tmp_path / "altered.jsonl"
    rewrite(
        FIXTURE, altered, lambda r: r.update(path="/dev/x") if r.get("call") == "open" else None
    )
    diverged = npud("replay", str(altered))
    assert diverged.returncode == 1
    assert "first divergence: call 1 (open /dev/x, in op 1): path" in diverged.stdout
    bad = tmp_path / "bad.jsonl"
    bad.write_text("nope\n")
    assert npud("replay", str(bad)).returncode == 65  # EX_DATAERR: not a trace
    assert npud("replay", str(tmp_path / "absent.jsonl")).returncode == 66  # EX_NOINPUT
    no_model = npud("record", "--backend", "emulator", "--scenario", "model", str(tmp_path / "m"))
    assert no_model.returncode == 64
    assert "--scenario model needs --model FILE" in no_model.stderr
    recorded = npud("record", "--backend", "emulator", str(tmp_path / "r.jsonl"))
    assert recorded.returncode == 0, recorded.stderr
    assert load_trace(tmp_path / "r.jsonl").complete
    assert (tmp_path / "r.jsonl").stat().st_mode & 0o777 == 0o600
    again = npud("record", "--backend", "emulator", str(tmp_path / "r.jsonl"))
    assert again.returncode == 73  # EX_CANTCREAT
    assert "exists (--replace removes it first)" in again.stderr
    replaced = npud("record", "--replace", "--backend", "emulator", str(tmp_path / "r.jsonl"))
    assert replaced.returncode == 0, replaced.stderr
    (tmp_path / "link.jsonl").symlink_to(tmp_path / "elsewhere.jsonl")
    linked = npud("record", "--replace", "--backend", "emulator", str(tmp_path / "link.jsonl"))
    assert linked.returncode == 73
    assert "not a regular file; not replaced" in linked.stderr
    assert not (tmp_path / "elsewhere.jsonl").exists()


@pytest.mark.parametrize("kind", ["file", "symlink", "dangling symlink"])
def test_a_trace_is_a_new_private_file(tmp_path: Path, kind: str) -> None:
    """A trace holds clients' bytes: 0600, never over an existing file, never through a
    symlink (issue 16, item 7)."""
    target = tmp_path / "victim"
    path = tmp_path / "trace.jsonl"
    if kind == "file":
        path.write_text("keep me")
    else:
        if kind == "symlink":
            target.write_text("keep me")
        path.symlink_to(target)
    with pytest.raises(FileExistsError):
        TraceWriter(path, backend="emulator")
    if kind != "dangling symlink":
        assert (target if kind == "symlink" else path).read_text() == "keep me"
    else:
        assert not target.exists()
    fresh = TraceWriter(tmp_path / "fresh.jsonl", backend="emulator")
    fresh.close()
    assert (tmp_path / "fresh.jsonl").stat().st_mode & 0o777 == 0o600


# --- on the device too ------------------------------------------------------------------


def test_a_run_on_this_driver_records_and_replays(
    driver: Driver, shell_bytes: bytes, tmp_path: Path
) -> None:
    """On the emulator, and (marked hardware) on the device: the echo scenario's trace
    of this very driver replays against the session code without the driver."""
    trace = tmp_path / "run.jsonl"
    writer = TraceWriter(
        trace, backend="kernel" if isinstance(driver, KernelDriver) else "emulator"
    )
    try:
        with FastRpcSession.open(
            TracingDriver(driver, writer), library_path=library_path(driver)
        ) as session:
            session.load_shell(shell_bytes)
            echo_scenario(session)
    finally:
        writer.close()
    report = replay(trace)
    assert report.ok, report.summary()
