"""Shell verification fails closed: every way a shell, digest or signature can be wrong."""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import stat
import struct
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from npud.fastrpc.kernel.abi import INIT_FILELEN_MAX
from npud.fastrpc.kernel.errors import ShellVerifyError
from npud.fastrpc.trust.shell import (
    DEVELOPMENT_KEY_FINGERPRINT,
    DEVELOPMENT_PUBLIC_KEY_HEX,
    is_development_key,
    key_fingerprint,
    load_public_key,
    load_public_key_file,
    public_key_hex,
    verify_shell,
    verify_shell_binary,
)

REPO = Path(__file__).resolve().parents[2]
DEV_DIR = REPO / "npud" / "devshell"
DEV_SHELL = "fastrpc_shell_unsigned_3"
SHELL_BYTES = b"\x7fELF" + bytes(range(256)) * 4

# Files made by the tests belong to whoever runs them: trust that uid too.
TRUSTED = frozenset({0, os.getuid()})
IS_ROOT = os.geteuid() == 0
needs_root = pytest.mark.skipif(not IS_ROOT, reason="chown to another uid needs root")

ROLES = ("shell", "digest", "signature")


@pytest.fixture
def key() -> Ed25519PrivateKey:
    return Ed25519PrivateKey.generate()


def write(path: Path, data: bytes, mode: int = 0o644) -> Path:
    path.write_bytes(data)
    path.chmod(mode)  # independent of the umask
    return path


def sign_into(directory: Path, key: Ed25519PrivateKey, data: bytes = SHELL_BYTES) -> Path:
    """A correctly signed shell, built without the signing tool."""
    shell = write(directory / "fastrpc_shell_3", data)
    digest = hashlib.sha256(data).hexdigest()
    write(directory / "fastrpc_shell_3.sha256", f"{digest}  fastrpc_shell_3\n".encode())
    write(directory / "fastrpc_shell_3.sig", key.sign(data))
    return shell


def role_path(shell: Path, role: str) -> Path:
    return {
        "shell": shell,
        "digest": shell.with_name(shell.name + ".sha256"),
        "signature": shell.with_name(shell.name + ".sig"),
    }[role]


def verify(shell: Path, key: Ed25519PrivateKey, **kwargs: Any) -> bytes:
    kwargs.setdefault("trusted_uids", TRUSTED)
    return verify_shell_binary(shell, public_key=key.public_key(), **kwargs)


def refused(shell: Path, key: Ed25519PrivateKey, **kwargs: Any) -> str:
    with pytest.raises(ShellVerifyError) as info:
        verify(shell, key, **kwargs)
    return info.value.reason


# --------------------------------------------------------------------------
# The happy path


def test_signed_shell_returns_exactly_its_bytes(tmp_path: Path, key: Ed25519PrivateKey) -> None:
    shell = sign_into(tmp_path, key)
    assert verify(shell, key) == SHELL_BYTES


def test_verify_shell_reports_digest_and_key(tmp_path: Path, key: Ed25519PrivateKey) -> None:
    shell = sign_into(tmp_path, key)
    verified = verify_shell(shell, public_key=key.public_key(), trusted_uids=TRUSTED)
    assert verified.path == str(shell)
    assert verified.data == SHELL_BYTES
    assert verified.size == len(SHELL_BYTES)
    assert verified.sha256 == hashlib.sha256(SHELL_BYTES).hexdigest()
    assert verified.key_fingerprint == key_fingerprint(key.public_key())
    assert "data" not in repr(verified)  # status lines never dump the image


def test_explicit_digest_and_signature_paths(tmp_path: Path, key: Ed25519PrivateKey) -> None:
    shell = sign_into(tmp_path, key)
    other = tmp_path / "elsewhere"
    other.mkdir()
    digest = role_path(shell, "digest").rename(other / "d")
    signature = role_path(shell, "signature").rename(other / "s")
    assert not role_path(shell, "digest").exists()
    assert verify(shell, key, digest_path=digest, signature_path=signature) == SHELL_BYTES


@pytest.mark.parametrize(
    "line",
    [
        "{hex}",
        "{hex}\n",
        "{hex}  fastrpc_shell_3\n",
        "{hex} *fastrpc_shell_3\n",
        "{hex}\tfastrpc_shell_3",
        "{HEX}  fastrpc_shell_3\n",
    ],
)
def test_digest_file_forms_accepted(tmp_path: Path, key: Ed25519PrivateKey, line: str) -> None:
    shell = sign_into(tmp_path, key)
    digest = hashlib.sha256(SHELL_BYTES).hexdigest()
    write(role_path(shell, "digest"), line.format(hex=digest, HEX=digest.upper()).encode())
    assert verify(shell, key) == SHELL_BYTES


def test_shell_of_exactly_the_kernel_limit_is_accepted(
    tmp_path: Path, key: Ed25519PrivateKey
) -> None:
    data = b"\x7fELF" + b"\x00" * (INIT_FILELEN_MAX - 4)
    shell = sign_into(tmp_path, key, data)
    assert verify(shell, key) == data


def test_each_file_is_opened_once_without_following_links(
    tmp_path: Path, key: Ed25519PrivateKey, monkeypatch: pytest.MonkeyPatch
) -> None:
    shell = sign_into(tmp_path, key)
    opened: list[tuple[str, int]] = []
    real_open = os.open

    def recording_open(path: str, flags: int, *args: Any, **kwargs: Any) -> int:
        opened.append((os.fspath(path), flags))
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(os, "open", recording_open)
    verify(shell, key)
    assert sorted(p for p, _ in opened) == sorted(str(role_path(shell, r)) for r in ROLES)
    for _, flags in opened:
        assert flags & os.O_NOFOLLOW
        assert flags & os.O_CLOEXEC
        assert flags & os.O_ACCMODE == os.O_RDONLY


# --------------------------------------------------------------------------
# Content: hash and signature


def test_flipped_byte_in_shell_fails_the_digest(tmp_path: Path, key: Ed25519PrivateKey) -> None:
    shell = sign_into(tmp_path, key)
    data = bytearray(SHELL_BYTES)
    data[100] ^= 0x01
    write(shell, bytes(data))
    reason = refused(shell, key)
    assert f"shell {shell} does not match" in reason
    assert hashlib.sha256(data).hexdigest() in reason
    assert "npud-sign-shell sign" in reason


def test_flipped_byte_with_matching_digest_fails_the_signature(
    tmp_path: Path, key: Ed25519PrivateKey
) -> None:
    shell = sign_into(tmp_path, key)
    data = bytearray(SHELL_BYTES)
    data[-1] ^= 0x80
    write(shell, bytes(data))
    digest = hashlib.sha256(data).hexdigest()
    write(role_path(shell, "digest"), f"{digest}  {shell.name}\n".encode())
    reason = refused(shell, key)
    assert "is not a valid signature" in reason
    assert key_fingerprint(key.public_key()) in reason


@pytest.mark.parametrize("length", [0, 1, 63])
def test_truncated_signature(tmp_path: Path, key: Ed25519PrivateKey, length: int) -> None:
    shell = sign_into(tmp_path, key)
    sig = role_path(shell, "signature")
    write(sig, sig.read_bytes()[:length])
    reason = refused(shell, key)
    assert f"{sig} holds {length} bytes" in reason
    assert "exactly 64 raw bytes" in reason


def test_overlong_signature(tmp_path: Path, key: Ed25519PrivateKey) -> None:
    shell = sign_into(tmp_path, key)
    sig = role_path(shell, "signature")
    write(sig, sig.read_bytes() + b"\n")
    assert "is 65 bytes" in refused(shell, key)


def test_signature_of_other_bytes(tmp_path: Path, key: Ed25519PrivateKey) -> None:
    shell = sign_into(tmp_path, key)
    write(role_path(shell, "signature"), key.sign(SHELL_BYTES + b"x"))
    assert "is not a valid signature" in refused(shell, key)


def test_wrong_key(tmp_path: Path, key: Ed25519PrivateKey) -> None:
    shell = sign_into(tmp_path, key)
    other = Ed25519PrivateKey.generate()
    reason = refused(shell, other)
    assert "is not a valid signature" in reason
    assert key_fingerprint(other.public_key()) in reason


# --------------------------------------------------------------------------
# The digest file

HEX = hashlib.sha256(SHELL_BYTES).hexdigest()


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        (b"", "is empty"),
        (b"\n", "is empty"),
        (b"   \n", "is empty"),
        (HEX[:63].encode() + b"\n", "sha256sum format"),
        (HEX.encode() + b"0\n", "sha256sum format"),
        (b"z" * 64 + b"\n", "sha256sum format"),
        (HEX.encode() + b"  \n", "sha256sum format"),
        (HEX.encode() + b"fastrpc_shell_3\n", "sha256sum format"),
        (HEX.encode() + b"\n\n", "more than one line"),
        (HEX.encode() + b"  fastrpc_shell_3\n" + HEX.encode() + b"  x\n", "more than one line"),
        (HEX.encode() + b"  fastrpc_shell_3\r\n", "carriage return"),
        (HEX.encode() + b"\r\n", "carriage return"),
        (HEX.encode() + b"  \xff\xfe\n", "not UTF-8"),
        (b"x" * 5000, "one sha256sum line"),
    ],
)
def test_malformed_digest_file(
    tmp_path: Path, key: Ed25519PrivateKey, content: bytes, expected: str
) -> None:
    shell = sign_into(tmp_path, key)
    digest = write(role_path(shell, "digest"), content)
    reason = refused(shell, key)
    assert str(digest) in reason
    assert expected in reason


@pytest.mark.parametrize("name", ["fastrpc_shell_4", "dir/fastrpc_shell_3", "*fastrpc_shell_4"])
def test_digest_for_another_file(tmp_path: Path, key: Ed25519PrivateKey, name: str) -> None:
    shell = sign_into(tmp_path, key)
    write(role_path(shell, "digest"), f"{HEX}  {name}\n".encode())
    reason = refused(shell, key)
    assert f"is for {name.lstrip('*')!r}, not for the shell 'fastrpc_shell_3'" in reason


def test_digest_of_other_bytes(tmp_path: Path, key: Ed25519PrivateKey) -> None:
    shell = sign_into(tmp_path, key)
    other = hashlib.sha256(b"other").hexdigest()
    write(role_path(shell, "digest"), f"{other}  fastrpc_shell_3\n".encode())
    assert "does not match" in refused(shell, key)


# --------------------------------------------------------------------------
# Files: existence, type, owner, mode


@pytest.mark.parametrize("role", ROLES)
def test_missing_file(tmp_path: Path, key: Ed25519PrivateKey, role: str) -> None:
    shell = sign_into(tmp_path, key)
    path = role_path(shell, role)
    path.unlink()
    reason = refused(shell, key)
    assert f"{path} does not exist" in reason
    if role != "shell":
        assert "npud-sign-shell sign" in reason


@needs_root
@pytest.mark.parametrize("role", ROLES)
def test_file_owned_by_untrusted_uid(tmp_path: Path, key: Ed25519PrivateKey, role: str) -> None:
    shell = sign_into(tmp_path, key)
    path = role_path(shell, role)
    os.chown(path, 12345, 12345)
    reason = refused(shell, key, trusted_uids=frozenset({0}))
    assert f"{path} is owned by uid 12345, not by root" in reason
    assert f"fix: chown root: {path}" in reason
    # The same file passes once that uid is trusted: the owner was the only problem.
    assert verify(shell, key, trusted_uids=frozenset({0, 12345})) == SHELL_BYTES


def test_file_owned_by_uid_outside_a_custom_trust_set(
    tmp_path: Path, key: Ed25519PrivateKey
) -> None:
    shell = sign_into(tmp_path, key)
    untrusted = os.getuid() + 1
    reason = refused(shell, key, trusted_uids=frozenset({untrusted}))
    assert f"is owned by uid {os.getuid()}, not by a trusted uid ({untrusted})" in reason


@pytest.mark.parametrize("role", ROLES)
@pytest.mark.parametrize(
    ("mode", "who"),
    [(0o664, "group"), (0o646, "others"), (0o666, "group and others"), (0o620, "group")],
)
def test_writable_by_group_or_others(
    tmp_path: Path, key: Ed25519PrivateKey, role: str, mode: int, who: str
) -> None:
    shell = sign_into(tmp_path, key)
    path = role_path(shell, role)
    path.chmod(mode)
    reason = refused(shell, key)
    assert f"{path} is writable by {who} (mode {mode:04o})" in reason
    assert f"fix: chmod go-w {path}" in reason


def test_fix_hint_quotes_paths_for_the_shell(tmp_path: Path, key: Ed25519PrivateKey) -> None:
    directory = tmp_path / "dir with space"
    directory.mkdir()
    shell = sign_into(directory, key)
    shell.chmod(0o666)
    assert f"fix: chmod go-w '{shell}'" in refused(shell, key)


def test_read_only_for_everyone_is_fine(tmp_path: Path, key: Ed25519PrivateKey) -> None:
    shell = sign_into(tmp_path, key)
    for role in ROLES:
        role_path(shell, role).chmod(0o444)
    assert verify(shell, key) == SHELL_BYTES


@pytest.mark.parametrize("role", ROLES)
def test_symlink_is_refused(tmp_path: Path, key: Ed25519PrivateKey, role: str) -> None:
    shell = sign_into(tmp_path, key)
    path = role_path(shell, role)
    real = path.rename(tmp_path / "real")
    path.symlink_to(real)
    reason = refused(shell, key)
    assert f"{path} is a symbolic link" in reason


def test_directory_is_refused(tmp_path: Path, key: Ed25519PrivateKey) -> None:
    shell = sign_into(tmp_path, key)
    shell.unlink()
    shell.mkdir()
    assert f"shell {shell} is a directory, not a regular file" in refused(shell, key)


def test_fifo_is_refused_without_blocking(tmp_path: Path, key: Ed25519PrivateKey) -> None:
    shell = sign_into(tmp_path, key)
    sig = role_path(shell, "signature")
    sig.unlink()
    os.mkfifo(sig, 0o644)
    assert f"{sig} is a FIFO, not a regular file" in refused(shell, key)


def test_empty_shell(tmp_path: Path, key: Ed25519PrivateKey) -> None:
    shell = sign_into(tmp_path, key, b"")
    assert f"shell {shell} is empty" in refused(shell, key)


def test_oversize_shell_is_refused_without_reading_it(
    tmp_path: Path, key: Ed25519PrivateKey, monkeypatch: pytest.MonkeyPatch
) -> None:
    shell = sign_into(tmp_path, key, b"\x7fELF" * 1024)
    bytes_read = 0
    real_read = os.read

    def counting_read(fd: int, n: int) -> bytes:
        nonlocal bytes_read
        data = real_read(fd, n)
        bytes_read += len(data)
        return data

    monkeypatch.setattr(os, "read", counting_read)
    reason = refused(shell, key, max_size=64)
    assert f"shell {shell} is 4096 bytes; the limit is 64 bytes" in reason
    assert bytes_read <= 65


def test_shell_over_the_kernel_limit_by_default(tmp_path: Path, key: Ed25519PrivateKey) -> None:
    shell = sign_into(tmp_path, key)
    with shell.open("r+b") as f:
        f.truncate(INIT_FILELEN_MAX + 1)  # sparse: costs no disk
    assert f"is {INIT_FILELEN_MAX + 1} bytes; the limit is {INIT_FILELEN_MAX}" in refused(
        shell, key
    )


def test_read_is_bounded_even_when_st_size_says_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    # procfs files report st_size 0 but have content: only the bounded read
    # can catch them being over the limit.
    path = Path("/proc/self/status")
    try:
        st = path.stat()
    except OSError:
        pytest.skip("no /proc here")
    if not stat.S_ISREG(st.st_mode) or st.st_size != 0 or st.st_mode & 0o022:
        pytest.skip("/proc/self/status is not the size-0 read-only regular file expected")
    if len(path.read_bytes()) <= 17:
        pytest.skip("/proc/self/status is too short to tell a bounded read")
    reads: list[int] = []
    real_read = os.read

    def recording_read(fd: int, n: int) -> bytes:
        reads.append(n)
        return real_read(fd, n)

    monkeypatch.setattr(os, "read", recording_read)
    with pytest.raises(ShellVerifyError) as info:
        verify_shell_binary(
            path,
            public_key=Ed25519PrivateKey.generate().public_key(),
            trusted_uids={st.st_uid},
            max_size=16,
        )
    assert f"shell {path} is larger than 16 bytes" in info.value.reason
    assert sum(reads) <= 17  # asked for one byte past the limit, no more


def test_max_size_must_be_positive(tmp_path: Path, key: Ed25519PrivateKey) -> None:
    shell = sign_into(tmp_path, key)
    with pytest.raises(ValueError, match="max_size"):
        verify(shell, key, max_size=0)


def _open_fds() -> set[str]:
    return set(os.listdir("/proc/self/fd"))


@pytest.mark.parametrize(
    "spoil",
    [
        lambda shell: role_path(shell, "signature").chmod(0o666),
        lambda shell: role_path(shell, "digest").write_bytes(b"nonsense\n"),
        lambda shell: role_path(shell, "signature").write_bytes(b"short"),
        lambda shell: shell.write_bytes(b"changed"),
        lambda shell: None,
    ],
)
def test_no_fd_is_left_open(
    tmp_path: Path, key: Ed25519PrivateKey, spoil: Callable[[Path], object]
) -> None:
    if not Path("/proc/self/fd").is_dir():
        pytest.skip("no /proc/self/fd to count fds")
    shell = sign_into(tmp_path, key)
    spoil(shell)
    before = _open_fds()
    with contextlib.suppress(ShellVerifyError):
        verify(shell, key)
    assert _open_fds() == before


def test_error_carries_the_stable_code(tmp_path: Path, key: Ed25519PrivateKey) -> None:
    shell = sign_into(tmp_path, key)
    shell.unlink()
    with pytest.raises(ShellVerifyError) as info:
        verify(shell, key)
    assert info.value.code == 401
    assert str(info.value) == f"DSP shell verification failed: {info.value.reason}"


# --------------------------------------------------------------------------
# Public keys


def test_hex_public_key_forms(key: Ed25519PrivateKey) -> None:
    hex_key = public_key_hex(key.public_key())
    assert len(hex_key) == 64
    for text in (
        hex_key,
        hex_key + "\n",
        f"  {hex_key}\r\n",
        hex_key.upper(),
        hex_key[:32] + "\n" + hex_key[32:],
    ):
        loaded = load_public_key(text.encode())
        assert public_key_hex(loaded) == hex_key


def test_pem_public_key(key: Ed25519PrivateKey) -> None:
    pem = key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    assert public_key_hex(load_public_key(pem)) == public_key_hex(key.public_key())


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        (b"", "is empty"),
        (b" \n\t", "is empty"),
        (b"ab" * 31, "has 62 hex digits"),
        (b"ab" * 33, "has 66 hex digits"),
        (b"g" * 64, "neither 64 hex digits nor a PEM"),
        (bytes(range(32)), "neither 64 hex digits nor a PEM"),
        (b"\xff" * 64, "neither 64 hex digits nor a PEM"),
        (b"-----BEGIN PUBLIC KEY-----\nAAAA\n-----END PUBLIC KEY-----\n", "cannot be parsed"),
        (b"-----BEGIN CERTIFICATE-----\nAAAA\n", "expected '-----BEGIN PUBLIC KEY-----'"),
    ],
)
def test_malformed_public_keys(data: bytes, expected: str) -> None:
    with pytest.raises(ShellVerifyError) as info:
        load_public_key(data)
    assert expected in info.value.reason


def test_private_key_given_as_public_key(key: Ed25519PrivateKey) -> None:
    pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    with pytest.raises(ShellVerifyError) as info:
        load_public_key(pem)
    assert "that is a private key" in info.value.reason


def test_non_ed25519_pem_public_key() -> None:
    pem = (
        ec.generate_private_key(ec.SECP256R1())
        .public_key()
        .public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    )
    with pytest.raises(ShellVerifyError) as info:
        load_public_key(pem)
    assert "is an EC (secp256r1) key; shells are signed with Ed25519" in info.value.reason


def test_public_key_file(tmp_path: Path, key: Ed25519PrivateKey) -> None:
    path = write(tmp_path / "k.pub", public_key_hex(key.public_key()).encode() + b"\n")
    assert public_key_hex(load_public_key_file(path)) == public_key_hex(key.public_key())
    write(path, b"nope\n")
    with pytest.raises(ShellVerifyError, match=f"public key {path}: .*neither"):
        load_public_key_file(path)
    with pytest.raises(ShellVerifyError, match="cannot read public key"):
        load_public_key_file(tmp_path / "missing.pub")
    write(path, b"0" * 20000)
    with pytest.raises(ShellVerifyError, match="larger than"):
        load_public_key_file(path)


def test_fingerprint_is_sha256_of_the_raw_key(key: Ed25519PrivateKey) -> None:
    raw = key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    assert key_fingerprint(key.public_key()) == hashlib.sha256(raw).hexdigest()


# --------------------------------------------------------------------------
# The committed development shell and key


def dev_public_key_text() -> bytes:
    return (DEV_DIR / "shell-signing.pub").read_bytes()


def test_development_key_is_recognised(key: Ed25519PrivateKey) -> None:
    dev_key = load_public_key(dev_public_key_text())
    assert dev_public_key_text() == DEVELOPMENT_PUBLIC_KEY_HEX.encode() + b"\n"
    assert is_development_key(dev_key)
    assert key_fingerprint(dev_key) == DEVELOPMENT_KEY_FINGERPRINT
    assert not is_development_key(key.public_key())


def test_committed_dev_shell_verifies_with_the_dev_key(tmp_path: Path) -> None:
    # Copied with mode 0644: a checkout's modes follow the cloner's umask, the
    # content is what this test is about.
    for suffix in ("", ".sha256", ".sig"):
        write(tmp_path / (DEV_SHELL + suffix), (DEV_DIR / (DEV_SHELL + suffix)).read_bytes())
    verified = verify_shell(
        tmp_path / DEV_SHELL,
        public_key=load_public_key(dev_public_key_text()),
        trusted_uids=TRUSTED,
    )
    assert verified.data == (DEV_DIR / DEV_SHELL).read_bytes()
    assert verified.key_fingerprint == DEVELOPMENT_KEY_FINGERPRINT


def test_dev_shell_is_an_elf32_qdsp6_file_that_says_what_it_is() -> None:
    data = (DEV_DIR / DEV_SHELL).read_bytes()
    ident = data[:16]
    assert ident[:4] == b"\x7fELF"
    assert ident[4] == 1  # ELFCLASS32
    assert ident[5] == 1  # ELFDATA2LSB
    assert ident[6] == 1  # EV_CURRENT
    (
        e_type, e_machine, e_version, _entry, e_phoff, e_shoff, _flags,
        e_ehsize, e_phentsize, e_phnum, e_shentsize, e_shnum, _shstrndx,
    ) = struct.unpack_from("<HHIIIIIHHHHHH", data, 16)  # fmt: skip
    assert (e_type, e_machine, e_version) == (2, 164, 1)  # ET_EXEC, EM_QDSP6
    assert (e_ehsize, e_phentsize, e_shentsize) == (52, 32, 40)
    assert e_shoff == 0
    assert e_shnum == 0
    assert e_phnum >= 1
    assert e_phoff + e_phnum * e_phentsize <= len(data)
    p_type, p_offset, _vaddr, _paddr, p_filesz, _memsz, _flags, _align = struct.unpack_from(
        "<IIIIIIII", data, e_phoff
    )
    assert p_type == 4  # PT_NOTE
    assert p_offset + p_filesz == len(data)
    namesz, descsz, _note_type = struct.unpack_from("<III", data, p_offset)
    name_end = p_offset + 12 + namesz
    assert data[p_offset + 12 : name_end] == b"npud\0"
    desc_start = p_offset + 12 + (namesz + 3) // 4 * 4
    note = data[desc_start : desc_start + descsz].decode("ascii")
    assert "DEVELOPMENT shell for the emulator" in note
    assert "NOT a Hexagon DSP image" in note
    assert len(data) <= INIT_FILELEN_MAX


def test_make_dev_shell_reproduces_the_committed_files(tmp_path: Path) -> None:
    script = REPO / "scripts" / "make_dev_shell.py"
    result = subprocess.run(
        [sys.executable, str(script), "--output-dir", str(tmp_path)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    for suffix in ("", ".sha256", ".sig"):
        name = DEV_SHELL + suffix
        assert (tmp_path / name).read_bytes() == (DEV_DIR / name).read_bytes(), name
        assert stat.S_IMODE((tmp_path / name).stat().st_mode) == 0o644


def test_make_dev_shell_check_notices_a_stale_file(tmp_path: Path) -> None:
    script = REPO / "scripts" / "make_dev_shell.py"
    for name in os.listdir(DEV_DIR):
        shutil.copy(DEV_DIR / name, tmp_path / name)
    check = [sys.executable, str(script), "--check", "--output-dir", str(tmp_path)]
    assert subprocess.run(check, capture_output=True, check=False).returncode == 0
    sig = tmp_path / (DEV_SHELL + ".sig")
    sig.write_bytes(bytes(64))
    result = subprocess.run(check, capture_output=True, text=True, check=False)
    assert result.returncode == 1
    assert f"stale: {sig}" in result.stderr


def test_public_key_file_checked_like_the_shell(tmp_path: Path, key: Ed25519PrivateKey) -> None:
    path = write(tmp_path / "k.pub", public_key_hex(key.public_key()).encode() + b"\n")
    me = os.getuid()
    assert public_key_hex(load_public_key_file(path, trusted_uids={me})) == public_key_hex(
        key.public_key()
    )
    os.chmod(path, 0o666)  # noqa: S103 - the refusal is the point
    with pytest.raises(ShellVerifyError, match="chmod go-w"):
        load_public_key_file(path, trusted_uids={me})
    os.chmod(path, 0o644)
    with pytest.raises(ShellVerifyError, match="chown"):
        load_public_key_file(path, trusted_uids={me + 1})


def test_a_missing_trusted_key_file_is_a_clear_refusal(tmp_path: Path) -> None:
    with pytest.raises(
        ShellVerifyError, match="does not exist; install the shell-signing public key"
    ):
        load_public_key_file(tmp_path / "missing.pub", trusted_uids={os.getuid()})
