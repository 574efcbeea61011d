"""The daemon's shell check: cryptography in a child process, and every way the child can fail.

The file checks are shared with ``verify_shell`` (tests/unit/test_shell.py);
here: the key read from its file, the child's answer held to exactly these
bytes and this key, and fail-closed refusals when the child dies, hangs,
lies or talks nonsense. Fake children are small Python programs.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from npud.fastrpc.kernel.errors import ShellVerifyError
from npud.fastrpc.trust import shell_verifier
from npud.fastrpc.trust.shell import DEVELOPMENT_KEY_FINGERPRINT, verify_shell_isolated
from npud.fastrpc.trust.shell_verifier import ShellVerifier, ed25519_key_in
from npud.fastrpc.trust.signature_check import (
    MAX_KEY_FILE,
    REQUEST_HEADER,
    REQUEST_MAGIC,
    RequestError,
    read_request,
)

SHELL_BYTES = b"\x7fELF" + bytes(range(256)) * 4
TRUSTED = frozenset({0, os.getuid()})
DEV_DIR = Path(__file__).resolve().parents[2] / "npud" / "devshell"


@pytest.fixture
def key() -> Ed25519PrivateKey:
    return Ed25519PrivateKey.generate()


def write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    path.chmod(0o644)
    return path


def signed(directory: Path, key: Ed25519PrivateKey, data: bytes = SHELL_BYTES) -> Path:
    shell = write(directory / "fastrpc_shell_3", data)
    digest = hashlib.sha256(data).hexdigest()
    write(directory / "fastrpc_shell_3.sha256", f"{digest}  fastrpc_shell_3\n".encode())
    write(directory / "fastrpc_shell_3.sig", key.sign(data))
    return shell


def hex_key_file(directory: Path, key: Ed25519PrivateKey) -> Path:
    raw = key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return write(directory / "key.pub", raw.hex().encode() + b"\n")


def isolated(shell: Path, key_file: Path, **kwargs: object) -> object:
    return verify_shell_isolated(
        shell,
        public_key_path=key_file,
        trusted_uids=TRUSTED,
        **kwargs,  # type: ignore[arg-type]
    )


def refused(shell: Path, key_file: Path, **kwargs: object) -> str:
    with pytest.raises(ShellVerifyError) as info:
        isolated(shell, key_file, **kwargs)
    return info.value.reason


# --------------------------------------------------------------------------
# The real child


def test_a_signed_shell_verifies_in_the_child(tmp_path: Path, key: Ed25519PrivateKey) -> None:
    shell = signed(tmp_path, key)
    verified = verify_shell_isolated(
        shell, public_key_path=hex_key_file(tmp_path, key), trusted_uids=TRUSTED
    )
    raw = key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    assert verified.data == SHELL_BYTES
    assert verified.sha256 == hashlib.sha256(SHELL_BYTES).hexdigest()
    assert verified.key_fingerprint == hashlib.sha256(raw).hexdigest()


def test_a_pem_key_file_works_too(tmp_path: Path, key: Ed25519PrivateKey) -> None:
    pem = key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    shell = signed(tmp_path, key)
    assert isolated(shell, write(tmp_path / "key.pem", pem)).data == SHELL_BYTES  # type: ignore[attr-defined]


def test_a_started_verifier_is_used_up(tmp_path: Path, key: Ed25519PrivateKey) -> None:
    verifier = ShellVerifier()
    verifier.start()
    shell = signed(tmp_path, key)
    isolated(shell, hex_key_file(tmp_path, key), verifier=verifier)
    with pytest.raises(RuntimeError, match="one signature only"):
        verifier.check(b"", b"", b"", "")


def test_another_keys_signature_is_refused(tmp_path: Path, key: Ed25519PrivateKey) -> None:
    shell = signed(tmp_path, Ed25519PrivateKey.generate())
    assert "is not a valid signature of shell" in refused(shell, hex_key_file(tmp_path, key))


def test_a_changed_shell_is_refused_before_the_child_runs(
    tmp_path: Path, key: Ed25519PrivateKey
) -> None:
    shell = signed(tmp_path, key)
    write(shell, SHELL_BYTES[:-1] + b"x")
    verifier = ShellVerifier(command=["/nonexistent/verifier"])  # would fail if it ran
    reason = refused(shell, hex_key_file(tmp_path, key), verifier=verifier)
    assert "does not match" in reason


@pytest.mark.parametrize(
    ("key_data", "expected"),
    [
        (b"ab" * 31, "has 62 hex digits"),
        (b"not a key", "neither 64 hex digits nor a PEM"),
        (b"-----BEGIN PUBLIC KEY-----\nAAAA\n-----END PUBLIC KEY-----\n", "cannot be parsed"),
    ],
)
def test_a_bad_key_file_is_explained_by_cryptography(
    tmp_path: Path, key: Ed25519PrivateKey, key_data: bytes, expected: str
) -> None:
    key_file = write(tmp_path / "key.pub", key_data)
    reason = refused(signed(tmp_path, key), key_file)
    assert reason.startswith(f"public key {key_file}: ")
    assert expected in reason


def test_a_non_ed25519_pem_key_is_named(tmp_path: Path, key: Ed25519PrivateKey) -> None:
    pem = (
        ec.generate_private_key(ec.SECP256R1())
        .public_key()
        .public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    )
    reason = refused(signed(tmp_path, key), write(tmp_path / "key.pem", pem))
    assert "is an EC (secp256r1) key; shells are signed with Ed25519" in reason


def test_the_development_key_is_refused_first_when_asked(tmp_path: Path) -> None:
    key_file = write(tmp_path / "key.pub", (DEV_DIR / "shell-signing.pub").read_bytes())
    missing = tmp_path / "no-shell"
    reason = refused(missing, key_file, refuse_development_key=True)
    assert "is the development key" in reason
    assert "does not exist" in refused(missing, key_file)  # not refused: the shell is next


def test_the_committed_dev_shell_verifies_in_the_child(tmp_path: Path) -> None:
    for suffix in ("", ".sha256", ".sig"):
        name = "fastrpc_shell_unsigned_3" + suffix
        write(tmp_path / name, (DEV_DIR / name).read_bytes())
    key_file = write(tmp_path / "key.pub", (DEV_DIR / "shell-signing.pub").read_bytes())
    verified = isolated(tmp_path / "fastrpc_shell_unsigned_3", key_file)
    assert verified.key_fingerprint == DEVELOPMENT_KEY_FINGERPRINT  # type: ignore[attr-defined]


def test_the_key_file_is_checked_like_the_shell(tmp_path: Path, key: Ed25519PrivateKey) -> None:
    key_file = hex_key_file(tmp_path, key)
    key_file.chmod(0o666)
    assert "is writable by group and others" in refused(signed(tmp_path, key), key_file)
    assert "does not exist" in refused(signed(tmp_path, key), tmp_path / "missing.pub")


def test_the_daemon_process_never_loads_cryptography(
    tmp_path: Path, key: Ed25519PrivateKey
) -> None:
    shell = signed(tmp_path, key)
    key_file = hex_key_file(tmp_path, key)
    program = textwrap.dedent(
        f"""
        import sys
        from npud.fastrpc.trust.shell import verify_shell_isolated
        verified = verify_shell_isolated(
            {str(shell)!r}, public_key_path={str(key_file)!r}, trusted_uids={set(TRUSTED)!r}
        )
        assert verified.data == {SHELL_BYTES!r}
        loaded = sorted(name for name in sys.modules if name.startswith("cryptography"))
        assert not loaded, loaded
        """
    )
    subprocess.run([sys.executable, "-c", program], check=True, timeout=60)


# --------------------------------------------------------------------------
# Children that fail, hang or lie


def fake(program: str) -> ShellVerifier:
    """A verifier whose child is ``program`` (it gets the request on stdin)."""
    return ShellVerifier(command=[sys.executable, "-c", textwrap.dedent(program)], timeout=10)


def answer_program(answer: dict[str, str] | str, *, after: str = "") -> str:
    """A child that reads the request and prints ``answer`` (a dict becomes JSON)."""
    text = answer if isinstance(answer, str) else json.dumps(answer) + "\n"
    return f"""
        import sys
        sys.stdin.buffer.read()
        sys.stdout.write({text!r})
        sys.stdout.flush()
        {after}
        """


def real_answer(key: Ed25519PrivateKey, **changes: str) -> dict[str, str]:
    raw = key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    answer = {
        "verdict": "valid",
        "public_key": raw.hex(),
        "message_sha256": hashlib.sha256(SHELL_BYTES).hexdigest(),
    }
    answer.update(changes)
    return answer


def test_an_honest_fake_is_believed(tmp_path: Path, key: Ed25519PrivateKey) -> None:
    """The checks below refuse for what they say, not for being fakes."""
    verifier = fake(answer_program(real_answer(key)))
    verified = isolated(signed(tmp_path, key), hex_key_file(tmp_path, key), verifier=verifier)
    assert verified.data == SHELL_BYTES  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("program", "expected"),
    [
        ("import os, signal; os.kill(os.getpid(), signal.SIGKILL)", "was killed by SIGKILL"),
        ("import sys; sys.stderr.write('boom\\n'); sys.exit(3)", "exited with status 3 (boom)"),
        ("raise SystemExit(1)", "exited with status 1"),
    ],
    ids=["killed", "exit-status", "silent-exit"],
)
def test_a_child_that_dies_refuses_the_shell(
    tmp_path: Path, key: Ed25519PrivateKey, program: str, expected: str
) -> None:
    reason = refused(signed(tmp_path, key), hex_key_file(tmp_path, key), verifier=fake(program))
    assert expected in reason
    assert reason.endswith("the shell's signature cannot be checked")


def test_a_child_that_dies_after_a_valid_answer_is_not_believed(
    tmp_path: Path, key: Ed25519PrivateKey
) -> None:
    program = answer_program(real_answer(key), after="import os; os._exit(4)")
    reason = refused(signed(tmp_path, key), hex_key_file(tmp_path, key), verifier=fake(program))
    assert "exited with status 4" in reason


@pytest.mark.parametrize(
    ("changes", "expected"),
    [
        ({"message_sha256": "0" * 64}, "answered about other bytes"),
        ({"public_key": "11" * 32}, "which the key file does not hold"),
        ({"verdict": "maybe"}, "malformed"),
        ({"public_key": "zz" * 32}, "malformed"),
        ({"extra": "field"}, "malformed"),
    ],
    ids=["other-bytes", "other-key", "odd-verdict", "bad-hex", "extra-field"],
)
def test_a_child_that_lies_is_not_believed(
    tmp_path: Path, key: Ed25519PrivateKey, changes: dict[str, str], expected: str
) -> None:
    verifier = fake(answer_program(real_answer(key, **changes)))
    assert expected in refused(
        signed(tmp_path, key), hex_key_file(tmp_path, key), verifier=verifier
    )


@pytest.mark.parametrize(
    "output",
    [
        "valid\n",
        "",
        json.dumps({"verdict": "valid"}) + "\n" + json.dumps({"verdict": "valid"}) + "\n",
        json.dumps(["valid"]) + "\n",
        json.dumps({"verdict": 1}) + "\n",
        "{}",
    ],
    ids=["not-json", "nothing", "two-lines", "a-list", "a-number", "no-newline"],
)
def test_a_child_that_talks_nonsense_is_not_believed(
    tmp_path: Path, key: Ed25519PrivateKey, output: str
) -> None:
    verifier = fake(answer_program(output))
    assert "malformed" in refused(
        signed(tmp_path, key), hex_key_file(tmp_path, key), verifier=verifier
    )


def test_a_child_that_talks_too_much_is_cut_off(tmp_path: Path, key: Ed25519PrivateKey) -> None:
    program = "import sys; sys.stdout.write('x' * 1_000_000); sys.stdin.buffer.read()"
    reason = refused(signed(tmp_path, key), hex_key_file(tmp_path, key), verifier=fake(program))
    assert "wrote more than 4096 bytes" in reason


def test_a_child_that_hangs_is_given_up_on(tmp_path: Path, key: Ed25519PrivateKey) -> None:
    verifier = ShellVerifier(
        command=[sys.executable, "-c", "import time; time.sleep(60)"], timeout=0.5
    )
    reason = refused(signed(tmp_path, key), hex_key_file(tmp_path, key), verifier=verifier)
    assert "did not answer within 0.5 s" in reason


def test_a_child_that_answers_but_never_exits_is_not_believed(
    tmp_path: Path, key: Ed25519PrivateKey
) -> None:
    program = answer_program(
        real_answer(key), after="import os, time; os.close(1); os.close(2); time.sleep(60)"
    )
    verifier = ShellVerifier(command=[sys.executable, "-c", textwrap.dedent(program)], timeout=1)
    reason = refused(signed(tmp_path, key), hex_key_file(tmp_path, key), verifier=verifier)
    assert "did not exit within 1 s" in reason


def test_a_verifier_that_cannot_start_refuses(tmp_path: Path, key: Ed25519PrivateKey) -> None:
    verifier = ShellVerifier(command=[str(tmp_path / "no-such-program")])
    reason = refused(signed(tmp_path, key), hex_key_file(tmp_path, key), verifier=verifier)
    assert "cannot start the signature verifier" in reason


def test_without_cryptography_installed_the_verifier_cannot_start(
    tmp_path: Path, key: Ed25519PrivateKey, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    reason = refused(signed(tmp_path, key), hex_key_file(tmp_path, key))
    assert "cryptography is not installed" in reason


def test_no_child_and_no_fd_is_left_behind(tmp_path: Path, key: Ed25519PrivateKey) -> None:
    shell, key_file = signed(tmp_path, key), hex_key_file(tmp_path, key)
    pid_file = tmp_path / "pid"
    fds_before = len(os.listdir("/proc/self/fd"))
    for program in (
        f"import os; open({str(pid_file)!r}, 'w').write(str(os.getpid())); os.kill(os.getpid(), 9)",
        f"import os, time; open({str(pid_file)!r}, 'w').write(str(os.getpid())); time.sleep(60)",
    ):
        verifier = ShellVerifier(command=[sys.executable, "-c", program], timeout=1)
        with pytest.raises(ShellVerifyError):
            isolated(shell, key_file, verifier=verifier)
        with pytest.raises(ChildProcessError):
            os.waitpid(int(pid_file.read_text()), os.WNOHANG)  # reaped already
    unused = ShellVerifier()
    unused.start()
    unused.close()
    assert len(os.listdir("/proc/self/fd")) == fds_before


# --------------------------------------------------------------------------
# The pieces


def test_the_real_child_refuses_a_malformed_request() -> None:
    result = subprocess.run(
        shell_verifier.verifier_command(),
        input=b"hello",
        capture_output=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 2
    assert b"magic" in result.stderr


@pytest.mark.parametrize(
    ("stream", "expected"),
    [
        (b"nonsense", "magic"),
        (REQUEST_MAGIC + b"\0\0", "truncated"),
        (REQUEST_MAGIC + REQUEST_HEADER.pack(MAX_KEY_FILE + 1, 0, 0), "beyond its bound"),
        (REQUEST_MAGIC + REQUEST_HEADER.pack(1, 1, 1) + b"ab", "do not add up"),
    ],
)
def test_malformed_requests(stream: bytes, expected: str) -> None:
    with pytest.raises(RequestError, match=expected):
        read_request(stream)


def test_a_request_round_trips() -> None:
    stream = REQUEST_MAGIC + REQUEST_HEADER.pack(1, 2, 3) + b"k" + b"ss" + b"mmm"
    assert read_request(stream) == (b"k", b"ss", b"mmm")


def test_keys_are_read_without_cryptography_in_both_forms(key: Ed25519PrivateKey) -> None:
    public = key.public_key()
    raw = public.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    pem = public.public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    assert ed25519_key_in(raw.hex().encode()) == raw
    assert (
        ed25519_key_in(b"  " + raw.hex().upper().encode()[:30] + b"\n" + raw.hex()[30:].encode())
        == raw
    )
    assert ed25519_key_in(pem) == raw
    ec_pem = (
        ec.generate_private_key(ec.SECP256R1())
        .public_key()
        .public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    )
    for other in (ec_pem, b"ab" * 31, b"", pem.replace(b"END", b"FIN"), pem[:40] + b"!" + pem[41:]):
        assert ed25519_key_in(other) is None
