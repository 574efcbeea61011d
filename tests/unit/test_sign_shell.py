"""npud-sign-shell end to end through main(argv): genkey, sign, verify, and its failures."""

from __future__ import annotations

import hashlib
import os
import stat
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from npud.fastrpc.trust.shell import (
    DEVELOPMENT_PUBLIC_KEY_HEX,
    load_public_key,
    public_key_hex,
    verify_shell_binary,
)
from npud.ops.sign_shell import SignError, digest_line, main

REPO = Path(__file__).resolve().parents[2]
DEV_DIR = REPO / "npud" / "devshell"
SHELL_BYTES = b"\x7fELF" + b"shell image " * 100
UID = str(os.getuid())
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="chown to another uid needs root")


def mode_of(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def one_line(text: str) -> str:
    assert text.count("\n") == 1, text
    assert "Traceback" not in text
    return text


@pytest.fixture
def strict_umask() -> Iterator[None]:
    """A umask that would break the promised modes if the tool relied on it."""
    old = os.umask(0o077)
    try:
        yield
    finally:
        os.umask(old)


@pytest.fixture
def shell(tmp_path: Path) -> Path:
    path = tmp_path / "fastrpc_shell_unsigned_3"
    path.write_bytes(SHELL_BYTES)
    path.chmod(0o644)
    return path


@pytest.fixture
def keypair(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> tuple[Path, Path]:
    key = tmp_path / "signing.key"
    assert main(["genkey", str(key)]) == 0
    capsys.readouterr()
    return key, tmp_path / "signing.key.pub"


def test_genkey_writes_private_pem_and_public_hex(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], strict_umask: None
) -> None:
    key_path = tmp_path / "k"
    assert main(["genkey", str(key_path)]) == 0
    printed = capsys.readouterr().out.strip()
    private = serialization.load_pem_private_key(key_path.read_bytes(), password=None)
    assert isinstance(private, Ed25519PrivateKey)
    assert key_path.read_bytes().startswith(b"-----BEGIN PRIVATE KEY-----\n")
    assert mode_of(key_path) == 0o600
    pub = tmp_path / "k.pub"
    assert pub.read_text() == printed + "\n"
    assert mode_of(pub) == 0o644
    assert printed == public_key_hex(private.public_key())


def test_genkey_refuses_to_overwrite_a_key(
    keypair: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    key, pub = keypair
    before = (key.read_bytes(), pub.read_bytes())
    assert main(["genkey", str(key)]) == 1
    err = one_line(capsys.readouterr().err)
    assert f"{key} already exists; refusing to overwrite a key" in err
    assert (key.read_bytes(), pub.read_bytes()) == before


def test_genkey_refuses_when_only_the_pub_exists(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "k.pub").write_text("old\n")
    assert main(["genkey", str(tmp_path / "k")]) == 1
    assert "k.pub already exists" in one_line(capsys.readouterr().err)
    assert not (tmp_path / "k").exists()
    assert (tmp_path / "k.pub").read_text() == "old\n"


def test_genkey_refuses_a_dangling_symlink(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "k").symlink_to(tmp_path / "target")
    assert main(["genkey", str(tmp_path / "k")]) == 1
    assert "already exists" in one_line(capsys.readouterr().err)
    assert not (tmp_path / "target").exists()


def test_sign_writes_digest_and_signature(
    shell: Path,
    keypair: tuple[Path, Path],
    capsys: pytest.CaptureFixture[str],
    strict_umask: None,
) -> None:
    key, pub = keypair
    assert main(["sign", "--key", str(key), str(shell)]) == 0
    assert "sha256 " + hashlib.sha256(SHELL_BYTES).hexdigest() in capsys.readouterr().out
    digest = shell.with_name(shell.name + ".sha256")
    sig = shell.with_name(shell.name + ".sig")
    assert digest.read_text() == f"{hashlib.sha256(SHELL_BYTES).hexdigest()}  {shell.name}\n"
    assert len(sig.read_bytes()) == 64
    load_public_key(pub.read_bytes()).verify(sig.read_bytes(), SHELL_BYTES)
    assert mode_of(digest) == 0o644
    assert mode_of(sig) == 0o644
    assert sorted(p.name for p in shell.parent.iterdir()) == sorted(
        [shell.name, digest.name, sig.name, key.name, pub.name]
    )  # no temporary file left behind


def test_genkey_sign_verify_end_to_end(
    shell: Path, keypair: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    key, pub = keypair
    assert main(["sign", "--key", str(key), str(shell)]) == 0
    capsys.readouterr()
    verify = ["verify", "--public-key", str(pub), "--trusted-uid", UID, str(shell)]
    assert main(verify) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"OK {shell}: {len(SHELL_BYTES)} bytes")
    assert "DEVELOPMENT" not in out
    # The library agrees with the tool.
    trusted = {0, os.getuid()}
    public_key = load_public_key(pub.read_bytes())
    assert verify_shell_binary(shell, public_key=public_key, trusted_uids=trusted) == SHELL_BYTES

    shell.write_bytes(SHELL_BYTES.replace(b"shell", b"shelL", 1))
    assert main(verify) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    err = one_line(captured.err)
    assert err.startswith("npud-sign-shell: FAILED: ")
    assert "does not match" in err

    # Re-signing replaces both files and the shell verifies again.
    assert main(["sign", "--key", str(key), str(shell)]) == 0
    assert main(verify) == 0


def test_verify_with_explicit_digest_and_signature(
    shell: Path, keypair: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    key, pub = keypair
    assert main(["sign", "--key", str(key), str(shell)]) == 0
    digest = shell.with_name(shell.name + ".sha256").rename(shell.parent / "d")
    sig = shell.with_name(shell.name + ".sig").rename(shell.parent / "s")
    args = ["verify", "--public-key", str(pub), "--trusted-uid", UID, str(shell)]
    assert main(args) == 1
    assert "does not exist" in capsys.readouterr().err
    assert main([*args[:-1], "--digest", str(digest), "--signature", str(sig), str(shell)]) == 0


@needs_root
def test_verify_trusted_uid_option(
    shell: Path, keypair: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    key, pub = keypair
    assert main(["sign", "--key", str(key), str(shell)]) == 0
    os.chown(shell, 12345, 12345)
    assert main(["verify", "--public-key", str(pub), str(shell)]) == 1
    assert "owned by uid 12345, not by root" in one_line(capsys.readouterr().err)
    assert main(["verify", "--public-key", str(pub), "--trusted-uid", "12345", str(shell)]) == 0
    # Root stays trusted: the digest and signature files are root's.
    assert "OK" in capsys.readouterr().out


def test_verify_with_a_bad_public_key_file(
    shell: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "bad.pub"
    bad.write_text("not a key\n")
    assert main(["verify", "--public-key", str(bad), str(shell)]) == 1
    err = one_line(capsys.readouterr().err)
    assert f"FAILED: public key {bad}: " in err


def test_verify_with_the_private_key_by_mistake(
    shell: Path, keypair: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    key, _ = keypair
    assert main(["verify", "--public-key", str(key), str(shell)]) == 1
    assert "that is a private key" in one_line(capsys.readouterr().err)


@pytest.mark.parametrize(
    "argv",
    [
        [],
        ["frobnicate"],
        ["genkey"],
        ["genkey", "a", "b"],
        ["sign", "shell"],
        ["sign", "--key"],
        ["verify", "shell"],
        ["verify", "--public-key", "p", "--trusted-uid", "abc", "shell"],
        ["verify", "--public-key", "p", "--trusted-uid", "-1", "shell"],
        ["verify", "--public-key", "p", "--trusted-uid", str(2**32), "shell"],
        ["--bogus"],
    ],
)
def test_usage_errors_exit_64_with_one_line(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(argv) == 64  # EX_USAGE
    captured = capsys.readouterr()
    assert captured.out == ""
    err = one_line(captured.err)
    assert err.startswith("npud-sign-shell")
    assert "error:" in err


@pytest.mark.parametrize("argv", [["--help"], ["sign", "--help"], ["verify", "--help"]])
def test_help(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "usage: npud-sign-shell" in out


def test_sign_with_a_missing_key(shell: Path, capsys: pytest.CaptureFixture[str]) -> None:
    missing = shell.parent / "missing.key"
    assert main(["sign", "--key", str(missing), str(shell)]) == 1
    assert f"cannot read private key {missing}" in one_line(capsys.readouterr().err)
    assert not shell.with_name(shell.name + ".sig").exists()


def test_sign_a_missing_or_empty_shell(
    keypair: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    key, _ = keypair
    missing = tmp_path / "nothing"
    assert main(["sign", "--key", str(key), str(missing)]) == 1
    assert f"cannot read shell {missing}" in one_line(capsys.readouterr().err)
    empty = tmp_path / "empty"
    empty.write_bytes(b"")
    assert main(["sign", "--key", str(key), str(empty)]) == 1
    assert f"shell {empty} is empty" in one_line(capsys.readouterr().err)
    assert not (tmp_path / "empty.sig").exists()


def _write_key(path: Path, pem: bytes) -> Path:
    path.write_bytes(pem)
    return path


@pytest.mark.parametrize(
    ("make_pem", "expected"),
    [
        (
            lambda: (
                Ed25519PrivateKey.generate()
                .public_key()
                .public_bytes(
                    serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
                )
            ),
            "not a PEM 'PRIVATE KEY' block",
        ),
        (
            lambda: ec.generate_private_key(ec.SECP256R1()).private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.PKCS8,
                serialization.NoEncryption(),
            ),
            "shells are signed with Ed25519",
        ),
        (
            lambda: Ed25519PrivateKey.generate().private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.PKCS8,
                serialization.BestAvailableEncryption(b"secret"),
            ),
            "the private key is encrypted",
        ),
        (lambda: b"-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n", "parsed"),
        (lambda: b"", "not a PEM"),
    ],
)
def test_sign_refuses_unusable_private_keys(
    shell: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    make_pem: Callable[[], bytes],
    expected: str,
) -> None:
    key = _write_key(tmp_path / "k", make_pem())
    assert main(["sign", "--key", str(key), str(shell)]) == 1
    err = one_line(capsys.readouterr().err)
    assert f"private key {key}: " in err
    assert expected in err


@pytest.mark.parametrize("name", ["", "a\nb", "*star", " lead", "a/b"])
def test_digest_line_refuses_names_that_cannot_round_trip(name: str) -> None:
    with pytest.raises(SignError):
        digest_line(b"x", name)


def test_digest_line_is_sha256sum_format() -> None:
    assert digest_line(b"abc", "f") == (hashlib.sha256(b"abc").hexdigest() + "  f\n").encode()


def test_committed_dev_private_key_matches_the_dev_public_key(
    shell: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    private = serialization.load_pem_private_key(
        (DEV_DIR / "DEVELOPMENT-ONLY-shell-signing.key").read_bytes(), password=None
    )
    assert isinstance(private, Ed25519PrivateKey)
    assert public_key_hex(private.public_key()) == DEVELOPMENT_PUBLIC_KEY_HEX
    key = str(DEV_DIR / "DEVELOPMENT-ONLY-shell-signing.key")
    assert main(["sign", "--key", key, str(shell)]) == 0
    assert "DEVELOPMENT key" in capsys.readouterr().out
    pub = str(DEV_DIR / "shell-signing.pub")
    assert main(["verify", "--public-key", pub, "--trusted-uid", UID, str(shell)]) == 0
    assert "DEVELOPMENT key" in capsys.readouterr().out


def test_module_entry_point_exit_status(shell: Path) -> None:
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "npud.ops.sign_shell",
            "verify",
            "--public-key",
            "/nonexistent",
            str(shell),
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 1
    one_line(result.stderr)
    assert "cannot read public key /nonexistent" in result.stderr
