"""npuctl against the protocol peer: status, status --json, selftest, exit codes."""

from __future__ import annotations

import os
import pathlib
import re
import subprocess
import sys

import msgspec
import pytest

import npu_client
import npu_protocol as p
from npu_client import npuctl
from npu_client._status_text import format_bytes, format_duration, render_status
from tests.client.peer import ECHO_URI, HANDLED, Peer, PeerConnection

STATUS_KEYS = [
    "daemon_version",
    "uptime_ms",
    "backend",
    "device",
    "dsp",
    "shell",
    "epoch",
    "restarts",
    "totals",
    "clients",
    "session",
    "lanes",
    "scheduler",
    "pool",
    "domains",
    "memory",
]
"""The stable top-level keys of ``npuctl status --json`` (client/README.md)."""


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = npuctl.main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_status_shows_everything(peer: Peer, capsys: pytest.CaptureFixture[str]) -> None:
    with npu_client.connect(peer.path, name="voice-stt", priority="realtime") as voice:
        buffer = voice.alloc(70000)
        buffer.map()
        code, out, err = run(capsys, "--socket", peer.path, "status")
    assert (code, err) == (0, "")
    lines = out.splitlines()
    assert lines[0] == "daemon      npud 0.1.0-peer"
    assert re.fullmatch(r"uptime      1h 02m 0\ds", lines[1])
    assert "backend     emulator" in lines
    assert "device      /dev/fastrpc-cdsp-secure" in lines
    assert (
        "shell       verified /usr/lib/dsp/cdsp/fastrpc_shell_unsigned_3 (sha256 " + "ab" * 32 + ")"
    ) in lines
    assert "session     epoch 1, 0 restarts" in lines
    assert (
        "totals      2 clients, 1 buffer (72.0 KiB), 1 mapping, 0 handles, "
        "0 models (0 B), 0 calls in flight, 0 calls done"
    ) in lines
    assert "dsp         cdsp" in lines
    assert any(re.fullmatch(r" +arch_ver +0x73 \(v73\)", line) for line in lines)
    assert any(re.fullmatch(r" +hvx_support_128b +4", line) for line in lines)
    header = next(line for line in lines if line.startswith("PID"))
    assert header.split() == [
        "PID",
        "UID",
        "NAME",
        "PRIORITY",
        "DOMAIN",
        "BUFFERS",
        "BYTES",
        "MAPPINGS",
        "HANDLES",
        "IN",
        "FLIGHT",
        "DONE",
    ]
    rows = {line.split()[2]: line.split() for line in lines[lines.index(header) + 1 :]}
    assert rows["voice-stt"] == [
        str(os.getpid()),
        str(os.getuid()),
        "voice-stt",
        "realtime",
        "-",  # the peer plays a daemon that names no domain
        "1",
        "72.0",
        "KiB",
        "1",
        "0",
        "0",
        "0",
    ]
    assert rows["npuctl"][3] == "normal"


def test_status_json_is_the_status_record(peer: Peer, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "--socket", peer.path, "status", "--json")
    assert (code, err) == (0, "")
    assert out.endswith("\n")
    assert out.count("\n") == 1
    document = msgspec.json.decode(out)
    assert list(document) == STATUS_KEYS
    assert list(document["totals"]) == list(p.Totals.__struct_fields__)
    assert list(document["clients"][0]) == list(p.ClientRow.__struct_fields__)
    assert list(document["dsp"]) == list(p.DspCapabilities.__struct_fields__)
    assert list(document["shell"]) == list(p.ShellStatus.__struct_fields__)
    status = msgspec.json.decode(out, type=p.DaemonStatus)
    assert status.clients[0].name == "npuctl"
    assert status.dsp.arch_ver == 0x73


def test_status_with_no_clients_and_an_unverified_shell() -> None:
    status = p.DaemonStatus(
        daemon_version="0.1.0",
        uptime_ms=59_000,
        backend="kernel",
        device="/dev/fastrpc-cdsp",
        dsp=p.DspCapabilities(),
        shell=p.ShellStatus(verified=False, path="/usr/lib/dsp/shell", detail="bad signature"),
        epoch=3,
        restarts=2,
    )
    text = render_status(status)
    assert "shell       NOT VERIFIED /usr/lib/dsp/shell: bad signature" in text
    verified = msgspec.structs.replace(
        status, shell=p.ShellStatus(verified=True, sha256="0f" * 32, detail="396 bytes, key 65")
    )
    assert f"shell       verified (sha256 {'0f' * 32}; 396 bytes, key 65)" in render_status(
        verified
    )
    unknown = msgspec.structs.replace(status, shell=p.ShellStatus(verified=False))
    assert "shell       NOT VERIFIED\n" in render_status(unknown)
    assert "session     epoch 3, 2 restarts" in text
    assert "uptime      59s" in text
    assert text.endswith("clients     none")
    assert "pool" not in text  # a daemon that does not report it
    pool = p.PoolRow(enabled=True, buffers=2, bytes=3 << 20, max_bytes=1 << 28, hits=5, misses=1)
    assert (
        "pool        2 buffers kept (3.0 MiB of 256.0 MiB), shared per client, 5 hits, 1 misses"
        in render_status(msgspec.structs.replace(status, pool=pool))
    )
    off = msgspec.structs.replace(status, pool=p.PoolRow(enabled=False))
    assert "pool        off\n" in render_status(off)
    # Issue 29, item 7: contexts that suspends left, and the reopens that freed them.
    quiet = p.DomainRow(name="quiet")
    suspended = p.DomainRow(name="default", interrupted_contexts=12, suspend_reopens=1)
    text = render_status(msgspec.structs.replace(status, domains=(quiet, suspended)))
    assert (
        "default: 12 calls interrupted by suspends hold contexts until the session closes; "
        "reopened 1 time to free them"
    ) in text
    assert "quiet:" not in text


def test_formatting_helpers() -> None:
    assert [format_bytes(n) for n in (0, 1023, 1024, 1536, 1 << 20, 5 << 30, 3 << 50)] == [
        "0 B",
        "1023 B",
        "1.0 KiB",
        "1.5 KiB",
        "1.0 MiB",
        "5.0 GiB",
        "3072.0 TiB",
    ]
    assert [format_duration(ms) for ms in (999, 61_000, 3_723_000, 93_784_000)] == [
        "0s",
        "1m 01s",
        "1h 02m 03s",
        "1d 2h 03m 04s",
    ]


def test_selftest_passes_against_an_honest_dsp(
    peer: Peer, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run(capsys, "--socket", peer.path, "selftest")
    assert (code, err) == (0, "")
    lines = out.splitlines()
    names = [
        "alloc 1 MiB",
        "map into the DSP",
        "write pattern",
        "open echo",
        "echo through the DSP",
        "open npu_test",
        "fill on the DSP",
        "checksum on the DSP",
        "unmap",
        "close handles",
        "free",
    ]
    assert len(lines) == len(names) + 1
    for line, name in zip(lines, names, strict=False):
        assert re.fullmatch(rf"{re.escape(name)} +ok( \(.*\))?", line), line
    assert lines[-1] == "selftest passed: 11 steps"
    kinds = [type(r) for r in peer.connection().requests]
    assert kinds.count(p.InvokeRequest) == 3
    assert peer.connection().buffers == {}  # freed
    assert peer.connection().handles == {}  # closed


def test_selftest_reports_a_wrong_echo(peer: Peer, capsys: pytest.CaptureFixture[str]) -> None:
    def corrupt(conn: PeerConnection, request: p.AnyRequest) -> object:
        answer = conn.serve(request)
        if (
            isinstance(request, p.InvokeRequest)
            and request.method == 2
            and len(request.inputs) == 2
        ):
            [out] = request.outputs
            assert isinstance(out, p.BufferSlice)
            memory = conn.buffers[out.buffer].memory
            memory[out.offset + 1000] ^= 0xFF
        return answer

    peer.intercept = corrupt
    code, out, err = run(capsys, "--socket", peer.path, "selftest")
    assert (code, err) == (1, "")
    lines = out.splitlines()
    [echo_line] = [line for line in lines if line.startswith("echo through the DSP")]
    assert re.fullmatch(
        r"echo through the DSP +FAILED: the echo differs at byte 1000: got 0x.., expected 0x..",
        echo_line,
    )
    assert sum(" ok" in line for line in lines) == 10
    assert lines[-1] == "selftest FAILED: 1 of 11 steps did not pass"


def test_selftest_skips_what_depends_on_a_failed_step(
    peer: Peer, capsys: pytest.CaptureFixture[str]
) -> None:
    def no_echo(conn: PeerConnection, request: p.AnyRequest) -> object:
        if isinstance(request, p.OpenRequest) and request.uri == ECHO_URI:
            return p.ErrorMessage.for_code(
                p.ErrorCode.OPEN_FAILED,
                id=request.id,
                uri=request.uri,
                code=0x80000445,
                detail="gone",
            )
        return None

    peer.intercept = no_echo
    code, out, _ = run(capsys, "--socket", peer.path, "selftest")
    assert code == 1
    lines = out.splitlines()
    assert any(
        re.fullmatch(r"open echo +FAILED: cannot open remote module .*: gone \(OPEN_FAILED\)", line)
        for line in lines
    ), lines
    assert any(
        re.fullmatch(r"echo through the DSP +skipped \(needs open echo\)", line) for line in lines
    )
    assert any(
        re.fullmatch(r"checksum on the DSP +ok \(CRC-32 0x[0-9a-f]{8}\)", line) for line in lines
    )
    assert lines[-1] == "selftest FAILED: 2 of 11 steps did not pass"


def test_selftest_json(peer: Peer, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "--socket", peer.path, "selftest", "--json")
    assert code == 0
    report = msgspec.json.decode(out)
    assert list(report) == ["ok", "steps"]
    assert report["ok"] is True
    assert len(report["steps"]) == 11
    assert all(list(step) == ["name", "status", "detail"] for step in report["steps"])
    assert {step["status"] for step in report["steps"]} == {"ok"}


def test_an_unreachable_daemon_is_one_line_and_exit_69(
    socket_path: str, capsys: pytest.CaptureFixture[str]
) -> None:
    for command in ("status", "selftest"):
        code, out, err = run(capsys, "--socket", socket_path, command)
        assert (code, out) == (69, "")  # EX_UNAVAILABLE
        assert err == (
            f"npuctl: cannot connect to npud at {socket_path}: No such file or directory; "
            "is npud running, and is that path its socket?\n"
        )


def test_a_socket_option_naming_a_directory_says_so(
    tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run(capsys, "--socket", str(tmp_path), "status")
    assert (code, out) == (69, "")
    assert err == (
        f"npuctl: cannot connect to npud at {tmp_path}: it is a directory, not a socket; "
        "name npud's socket itself (npud.sock, by default)\n"
    )


def test_without_a_socket_option_the_hint_is_npud_socket(
    tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("NPUD_SOCKET", str(tmp_path / "gone.sock"))
    code, _, err = run(capsys, "status")
    assert code == 69
    assert err.endswith("NPUD_SOCKET names that path: is it npud's socket?\n")


def test_an_error_from_the_daemon_is_one_line_and_exit_1(
    peer: Peer, capsys: pytest.CaptureFixture[str]
) -> None:
    peer.refusal = p.ErrorMessage.for_code(p.ErrorCode.SHUTTING_DOWN)
    code, out, err = run(capsys, "--socket", peer.path, "status")
    assert (code, out) == (1, "")
    assert err.startswith("npuctl: ")
    assert "(SHUTTING_DOWN, error " in err
    assert err.count("\n") == 1


def test_a_client_npud_does_not_permit_exits_77(
    peer: Peer, capsys: pytest.CaptureFixture[str]
) -> None:
    peer.refusal = p.ErrorMessage.for_code(
        p.ErrorCode.NOT_PERMITTED, detail="uid 1001 may not use the NPU"
    )
    code, out, err = run(capsys, "--socket", peer.path, "status")
    assert (code, out) == (77, "")  # EX_NOPERM
    assert err == "npuctl: not permitted: uid 1001 may not use the NPU (NOT_PERMITTED, error 600)\n"


def test_a_daemon_that_does_not_answer_times_out(
    peer: Peer, capsys: pytest.CaptureFixture[str]
) -> None:
    peer.intercept = lambda conn, request: HANDLED  # never answers
    code, out, err = run(capsys, "--socket", peer.path, "--timeout", "0.2", "status")
    assert (code, out, err) == (75, "", "npuctl: npud did not answer within 0.2 s\n")


def test_a_model_load_npud_does_not_answer_is_a_timeout_not_a_file_error(
    peer: Peer, capsys: pytest.CaptureFixture[str], tmp_path: pathlib.Path
) -> None:
    """A timeout is an OSError too: it said "cannot open MODEL: None" (exit 66)."""
    model = tmp_path / "m.onnx"
    model.write_bytes(b"\x08\x08")
    peer.intercept = lambda conn, request: HANDLED  # never answers
    code, out, err = run(capsys, "--socket", peer.path, "--timeout", "0.2", "run", str(model))
    assert (code, out, err) == (75, "", "npuctl: npud did not answer within 0.2 s\n")


def test_npud_socket_is_used_without_socket(
    peer: Peer, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("NPUD_SOCKET", peer.path)
    code, out, _ = run(capsys, "status", "--json")
    assert code == 0
    assert msgspec.json.decode(out)["daemon_version"] == "0.1.0-peer"


@pytest.mark.parametrize(
    "argv",
    [
        [],
        ["bogus"],
        ["status", "--yaml"],
        ["--timeout", "0", "status"],
        ["--timeout", "x", "status"],
        ["--socket", "", "status"],
    ],
)
def test_usage_errors_exit_64(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as caught:
        npuctl.main(argv)
    assert caught.value.code == 64  # EX_USAGE
    assert "usage: npuctl" in capsys.readouterr().err


def _console_script() -> pathlib.Path:
    script = pathlib.Path(sys.executable).parent / "npuctl"
    assert script.exists(), "npu-client is installed with its npuctl console script"
    return script


def test_the_console_script_has_help_and_no_tracebacks(socket_path: str) -> None:
    script = _console_script()
    help_text = subprocess.run(
        [script, "--help"], capture_output=True, text=True, check=True, timeout=60
    ).stdout
    for word in ("status", "selftest", "--socket", "NPUD_SOCKET", "exit status"):
        assert word in help_text
    status_help = subprocess.run(
        [script, "status", "--help"], capture_output=True, text=True, check=True, timeout=60
    ).stdout
    assert "--json" in status_help
    failed = subprocess.run(
        [script, "--socket", socket_path, "status"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert failed.returncode == 69
    assert failed.stdout == ""
    assert failed.stderr.count("\n") == 1
    assert failed.stderr.startswith("npuctl: cannot connect to npud at ")


def test_status_says_how_many_clients_of_other_users_it_does_not_show() -> None:
    status = p.DaemonStatus(
        daemon_version="0.1.0",
        uptime_ms=1_000,
        backend="emulator",
        device="",
        dsp=p.DspCapabilities(),
        shell=p.ShellStatus(verified=False),
        epoch=1,
        restarts=0,
        totals=p.Totals(clients=3),
        clients=(p.ClientRow(pid=7, uid=1000, name="mine", priority="normal"),),
    )
    assert "(and 2 clients of other users, not shown)" in render_status(status)
    alone = msgspec.structs.replace(status, totals=p.Totals(clients=1))
    assert "of other users" not in render_status(alone)
