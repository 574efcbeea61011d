"""Where the client connects, what it calls itself, which priority it asks for."""

from __future__ import annotations

import pathlib
import subprocess
import sys

import pytest

import npu_client
import npu_protocol as p
from npu_client._settings import (
    DEFAULT_SOCKET_PATH,
    SocketOrigin,
    client_name,
    connect_failure_message,
    priority_class,
    socket_origin,
    socket_path,
)
from tests.client.peer import Peer


def test_the_default_socket_is_the_daemons_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NPUD_SOCKET", raising=False)
    assert socket_path() == DEFAULT_SOCKET_PATH == "/run/npud/npud.sock"
    assert npu_client.DEFAULT_SOCKET_PATH == DEFAULT_SOCKET_PATH
    assert npu_client.SOCKET_ENV == "NPUD_SOCKET"


def test_npud_socket_overrides_the_default_and_an_argument_overrides_both(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("NPUD_SOCKET", "/tmp/elsewhere.sock")
    assert socket_path() == "/tmp/elsewhere.sock"
    assert socket_path("/tmp/given.sock") == "/tmp/given.sock"
    assert socket_path(pathlib.Path("/tmp/path.sock")) == "/tmp/path.sock"
    monkeypatch.setenv("NPUD_SOCKET", "")
    assert socket_path() == DEFAULT_SOCKET_PATH  # empty counts as unset
    with pytest.raises(ValueError, match="the socket path is empty"):
        socket_path("")


@pytest.mark.parametrize(
    ("argv0", "expected"),
    [
        ("/usr/bin/voice-stt", "voice-stt"),
        ("/opt/llm daemon (v2)", "llm-daemon--v2-"),
        ("/srv/voice_stt.py", "voice_stt"),
        ("/usr/lib/python3/dist-packages/llm_decoder/__main__.py", "llm_decoder"),
        ("__main__.py", "python"),
        ("x" * 100, "x" * 64),
        ("", "python"),
        ("---", "python"),
    ],
)
def test_the_default_name_is_the_program_name_made_acceptable(
    monkeypatch: pytest.MonkeyPatch, argv0: str, expected: str
) -> None:
    monkeypatch.setattr(sys, "argv", [argv0])
    assert client_name() == expected
    # Whatever it makes, the protocol accepts.
    p.ClientConnection().send(
        p.Hello(protocol_version=p.PROTOCOL_VERSION, client_name=client_name())
    )


def test_the_default_name_reaches_the_daemon(peer: Peer, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "argv", ["/usr/lib/voice/tts-worker"])
    with npu_client.connect(peer.path):
        hello = peer.connection().server.hello
        assert hello is not None
        assert hello.client_name == "tts-worker"


@pytest.mark.parametrize("name", ["", "-leading-dash", "has space", "x" * 65, "caf\u00e9"])
def test_an_explicit_bad_name_is_refused(name: str) -> None:
    with pytest.raises(ValueError, match="is not allowed: use 1 to 64 characters"):
        client_name(name)


def test_a_name_must_be_text() -> None:
    with pytest.raises(TypeError, match="name must be a str, not bytes"):
        client_name(b"voice")  # type: ignore[arg-type]


def test_priorities() -> None:
    assert priority_class("realtime") is p.Priority.REALTIME
    assert priority_class(p.Priority.BACKGROUND) is p.Priority.BACKGROUND
    with pytest.raises(
        ValueError, match="unknown priority 'urgent': choose one of realtime, normal, background"
    ):
        priority_class("urgent")


def test_bad_arguments_to_connect_fail_before_connecting(socket_path: str) -> None:
    with pytest.raises(ValueError, match="unknown priority"):
        npu_client.connect(socket_path, priority="high")
    with pytest.raises(ValueError, match="client name"):
        npu_client.connect(socket_path, name="no spaces please")
    with pytest.raises(ValueError, match="timeout must be a positive number"):
        npu_client.connect(socket_path, timeout=0)


@pytest.mark.parametrize(
    ("error", "hint"),
    [
        (FileNotFoundError(2, "No such file or directory"), "is npud running? set NPUD_SOCKET"),
        (ConnectionRefusedError(111, "Connection refused"), "is npud running? set NPUD_SOCKET"),
        (PermissionError(13, "Permission denied"), "is your user in the socket's group"),
        (TimeoutError("timed out"), "npud is not accepting connections"),
        (OSError("AF_UNIX path too long"), "is npud running?"),
    ],
)
def test_connect_failure_messages_say_what_to_do(error: OSError, hint: str) -> None:
    message = connect_failure_message("/run/npud/npud.sock", error)
    assert message.startswith("cannot connect to npud at /run/npud/npud.sock: ")
    assert hint in message
    assert "\n" not in message


@pytest.mark.parametrize(
    ("origin", "hint"),
    [
        ("argument", "is npud running, and is that path its socket?"),
        ("environment", "is npud running? NPUD_SOCKET names that path: is it npud's socket?"),
    ],
)
def test_a_path_someone_named_is_the_one_to_check(origin: SocketOrigin, hint: str) -> None:
    refused = ConnectionRefusedError(111, "Connection refused")
    message = connect_failure_message("/srv/npud.sock", refused, origin)
    assert message == f"cannot connect to npud at /srv/npud.sock: Connection refused; {hint}"
    assert "set NPUD_SOCKET" not in message


@pytest.mark.parametrize("origin", ["argument", "environment", "default"])
def test_a_directory_is_called_a_directory(tmp_path: pathlib.Path, origin: SocketOrigin) -> None:
    refused = ConnectionRefusedError(111, "Connection refused")  # what connect() says
    message = connect_failure_message(str(tmp_path), refused, origin)
    assert message.startswith(
        f"cannot connect to npud at {tmp_path}: it is a directory, not a socket; "
        "name npud's socket itself"
    )
    assert "Connection refused" not in message
    assert ("NPUD_SOCKET" in message) == (origin == "default")


def test_a_regular_file_is_called_one(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "npud.sock"
    path.write_text("")
    message = connect_failure_message(str(path), ConnectionRefusedError(111, "x"), "argument")
    assert ": it is a regular file, not a socket; " in message


def test_who_named_the_socket(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NPUD_SOCKET", raising=False)
    assert socket_origin(None) == "default"
    assert socket_origin("/x.sock") == "argument"
    monkeypatch.setenv("NPUD_SOCKET", "/y.sock")
    assert socket_origin(None) == "environment"
    assert socket_origin("/x.sock") == "argument"
    monkeypatch.setenv("NPUD_SOCKET", "")
    assert socket_origin(None) == "default"  # empty is unset, as socket_path() reads it


def test_importing_the_package_does_not_import_trio() -> None:
    probe = (
        "import sys, npu_client, npu_client.npuctl\n"
        "print('trio' in sys.modules)\n"
        "import npu_client.trio_client\n"
        "print('trio' in sys.modules)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=60
    )
    assert result.stdout.split() == ["False", "True"]
