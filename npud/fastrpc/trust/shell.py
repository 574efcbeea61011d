"""Verify the DSP shell image before it goes to the DSP, and fail closed.

The shell (``fastrpc_shell_3``, ``fastrpc_shell_unsigned_3``) is the loader
ELF that INIT_CREATE hands to the DSP, so it decides what runs there. Before
npud loads one it checks three files:

* the shell itself,
* ``<shell>.sha256``: its SHA-256 in ``sha256sum`` format, one line,
* ``<shell>.sig``: a 64-byte Ed25519 signature over the shell's bytes by the
  configured public key.

Each file must be a regular file owned by root (or a uid in ``trusted_uids``)
and not writable by group or others. Each is opened once with ``O_NOFOLLOW``;
type, owner and mode are checked with ``fstat`` on that fd and the content is
read through the same fd, so nothing can be swapped between check and read.
The shell is read once, with a bound, and the hash and the signature are both
checked over that one ``bytes`` object, which is what the caller hands to the
DSP. Any failure raises :class:`~npud.fastrpc.kernel.errors.ShellVerifyError` whose
reason names the file, what is wrong and how to fix it.

``O_NOFOLLOW`` covers the last path component only: the directories on the
way are trusted to be root's (``/usr/lib/dsp``, ``/etc/npud``). Swapping files
in a writable directory still cannot get unsigned bytes past the signature.

The repository ships a development key (``npud/devshell/``) so the emulator
profile can exercise this path; it is public. :func:`is_development_key`
lets the kernel profile refuse it.

Two ways to check the signature, with the same file checks and messages:
:func:`verify_shell` takes a parsed key and checks in this process (tools and
tests); :func:`verify_shell_isolated`, the daemon's way, reads the key file
and has ``cryptography`` parse it and check the signature in a short-lived
child process (:mod:`npud.fastrpc.trust.shell_verifier`), so the daemon never
loads ``cryptography``. Importing this module does not load it either:
functions that need it import :mod:`npud.fastrpc.trust.signature_check` when called.
"""

from __future__ import annotations

import errno
import hashlib
import hmac
import os
import re
import shlex
import stat
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Final

from npud.fastrpc.kernel.abi import INIT_FILELEN_MAX
from npud.fastrpc.kernel.errors import ShellVerifyError
from npud.fastrpc.trust.shell_verifier import ShellVerifier, ed25519_key_in

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

StrPath = str | os.PathLike[str]

DIGEST_SUFFIX: Final = ".sha256"
SIGNATURE_SUFFIX: Final = ".sig"
SIGNATURE_SIZE: Final = 64
PUBLIC_KEY_SIZE: Final = 32
DEFAULT_TRUSTED_UIDS: Final = frozenset({0})

DEVELOPMENT_PUBLIC_KEY_HEX: Final = (
    "e058d490c7ade196e48affcb26c314c9b7f069ab0ae2d8ed0f31fafb2b4e62cb"
)
"""The development key of ``npud/devshell/shell-signing.pub``. Its private half
is committed too, so anyone can sign with it: emulator only, never a device."""

DEVELOPMENT_KEY_FINGERPRINT: Final = hashlib.sha256(
    bytes.fromhex(DEVELOPMENT_PUBLIC_KEY_HEX)
).hexdigest()
"""The development key's :func:`key_fingerprint`, as status reports show it."""

# A digest line is 64 hex digits, a separator and a file name; no shell file
# name comes near this, and the bound keeps a wrong file from being read whole.
_DIGEST_FILE_MAX: Final = 4096
_PUBLIC_KEY_FILE_MAX: Final = 16 * 1024
_READ_CHUNK: Final = 1024 * 1024

# O_NONBLOCK: opening a FIFO planted under the shell's name must not hang the
# daemon; fstat then refuses it. It changes nothing for a regular file.
_OPEN_FLAGS: Final = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK | os.O_NOCTTY

# sha256sum: "<hex>  <name>" (text mode) or "<hex> *<name>" (binary mode).
_DIGEST_LINE = re.compile(r"(?P<hex>[0-9A-Fa-f]{64})(?:[ \t]+\*?(?P<name>\S.*))?")


@dataclass(frozen=True)
class VerifiedShell:
    """A shell image that passed verification, for loading and status reports.

    ``data`` is exactly the bytes that were hashed and whose signature was
    checked; load those and nothing else. ``sha256`` is the lower-case hex
    digest and ``key_fingerprint`` identifies the key that signed it.
    """

    path: str
    data: bytes = field(repr=False)
    sha256: str
    key_fingerprint: str

    @property
    def size(self) -> int:
        return len(self.data)


def verify_shell(
    shell_path: StrPath,
    *,
    public_key: Ed25519PublicKey,
    digest_path: StrPath | None = None,
    signature_path: StrPath | None = None,
    trusted_uids: Iterable[int] = DEFAULT_TRUSTED_UIDS,
    max_size: int = INIT_FILELEN_MAX,
) -> VerifiedShell:
    """Verify ``shell_path`` and return it with its digest; see the module doc.

    ``digest_path`` defaults to ``<shell>.sha256`` and ``signature_path`` to
    ``<shell>.sig``. ``trusted_uids`` replaces the default ``{0}`` (tests pass
    their own uid). ``max_size`` defaults to the kernel's INIT_CREATE filelen
    cap; a larger shell is refused without being read whole.
    Raises ShellVerifyError on any failure.
    """
    from npud.fastrpc.trust import signature_check  # noqa: PLC0415  (loads cryptography)

    shell, data, actual, signature, signature_file = _read_and_check_files(
        shell_path, digest_path, signature_path, trusted_uids, max_size
    )
    fingerprint = key_fingerprint(public_key)
    if not signature_check.signature_is_valid(public_key, signature, data):
        raise _bad_signature(shell, signature_file, fingerprint)
    return VerifiedShell(path=shell, data=data, sha256=actual, key_fingerprint=fingerprint)


def verify_shell_isolated(
    shell_path: StrPath,
    *,
    public_key_path: StrPath,
    trusted_uids: Iterable[int] = DEFAULT_TRUSTED_UIDS,
    refuse_development_key: bool = False,
    verifier: ShellVerifier | None = None,
    max_size: int = INIT_FILELEN_MAX,
) -> VerifiedShell:
    """Like :func:`verify_shell`, with the key read from ``public_key_path`` and the
    signature checked by ``cryptography`` in a child process; this process never
    loads it.

    The key file passes the same owner and mode checks as the shell. With
    ``refuse_development_key`` the repository's public development key is
    refused before anything else is read. ``verifier`` is a child started
    earlier (:meth:`ShellVerifier.start`), or None to start one now; either
    way it is used up. Raises ShellVerifyError on any failure (fail closed).
    """
    uids = frozenset(trusted_uids)
    key_name = os.fspath(public_key_path)
    verifier = verifier if verifier is not None else ShellVerifier()
    try:
        key_file = _read_trusted(
            key_name,
            "public key",
            uids,
            _PUBLIC_KEY_FILE_MAX,
            limit_note="a public key file is 64 hex digits or a PEM block",
        )
        key = ed25519_key_in(key_file)
        if refuse_development_key and key is not None and _is_development_raw(key):
            raise development_key_refused(key_name)
        shell, data, actual, signature, signature_file = _read_and_check_files(
            shell_path, None, None, uids, max_size
        )
        verdict = verifier.check(key_file, signature, data, actual)
    finally:
        verifier.close()
    if verdict.key_problem is not None:
        raise ShellVerifyError(f"public key {key_name}: {verdict.key_problem}")
    fingerprint = hashlib.sha256(verdict.public_key).hexdigest()
    if not verdict.valid:
        raise _bad_signature(shell, signature_file, fingerprint)
    return VerifiedShell(path=shell, data=data, sha256=actual, key_fingerprint=fingerprint)


def development_key_refused(key_path: str) -> ShellVerifyError:
    """The kernel profile's refusal of the development key."""
    return ShellVerifyError(
        f"{key_path} is the development key, whose private half is public; "
        "the kernel backend refuses it: install the real shell-signing key"
    )


def _read_and_check_files(
    shell_path: StrPath,
    digest_path: StrPath | None,
    signature_path: StrPath | None,
    trusted_uids: Iterable[int],
    max_size: int,
) -> tuple[str, bytes, str, bytes, str]:
    """Read the shell, its digest and signature files; check the digest and the
    signature's size. Returns (shell path, shell bytes, their SHA-256, signature,
    signature path)."""
    if max_size < 1:
        raise ValueError(f"max_size must be positive, got {max_size}")
    shell = os.fspath(shell_path)
    digest_file = os.fspath(digest_path) if digest_path is not None else shell + DIGEST_SUFFIX
    signature_file = (
        os.fspath(signature_path) if signature_path is not None else shell + SIGNATURE_SUFFIX
    )
    uids = frozenset(trusted_uids)

    data = _read_trusted(
        shell,
        "shell",
        uids,
        max_size,
        limit_note=f"the limit is {max_size} bytes; is this really a DSP shell image?",
    )
    if not data:
        raise ShellVerifyError(f"shell {shell} is empty; install the real shell image")
    digest_text = _read_trusted(
        digest_file,
        "digest file",
        uids,
        _DIGEST_FILE_MAX,
        limit_note="a digest file is one sha256sum line",
    )
    signature = _read_trusted(
        signature_file,
        "signature file",
        uids,
        SIGNATURE_SIZE,
        limit_note=_SIGNATURE_FIX,
    )

    expected = _parse_digest_file(digest_text, digest_file, os.path.basename(shell))
    actual = hashlib.sha256(data).hexdigest()
    if not hmac.compare_digest(expected, actual):
        raise ShellVerifyError(
            f"shell {shell} does not match {digest_file}: its SHA-256 is {actual}, the file "
            f"records {expected}; the shell was changed or the digest is for another build "
            "(re-sign it with npud-sign-shell sign)"
        )

    if len(signature) != SIGNATURE_SIZE:
        raise ShellVerifyError(
            f"signature file {signature_file} holds {len(signature)} bytes; {_SIGNATURE_FIX}"
        )
    return shell, data, actual, signature, signature_file


def _bad_signature(shell: str, signature_file: str, fingerprint: str) -> ShellVerifyError:
    return ShellVerifyError(
        f"{signature_file} is not a valid signature of shell {shell} by the configured "
        f"public key (fingerprint {fingerprint}); the shell was signed with another key "
        "or altered, or the signature belongs to other bytes"
    )


def verify_shell_binary(
    shell_path: StrPath,
    *,
    public_key: Ed25519PublicKey,
    digest_path: StrPath | None = None,
    signature_path: StrPath | None = None,
    trusted_uids: Iterable[int] = DEFAULT_TRUSTED_UIDS,
    max_size: int = INIT_FILELEN_MAX,
) -> bytes:
    """Verify the shell like :func:`verify_shell`; return the verified bytes only."""
    return verify_shell(
        shell_path,
        public_key=public_key,
        digest_path=digest_path,
        signature_path=signature_path,
        trusted_uids=trusted_uids,
        max_size=max_size,
    ).data


# --------------------------------------------------------------------------
# Public keys


def load_public_key(data: bytes) -> Ed25519PublicKey:
    """Parse an Ed25519 public key: 64 hex digits, or a PEM ``PUBLIC KEY`` block.

    Whitespace around (or inside) the hex form is ignored. Anything else
    raises ShellVerifyError saying what was found instead.
    """
    from npud.fastrpc.trust import signature_check  # noqa: PLC0415  (loads cryptography)

    try:
        return signature_check.parse_public_key(data)
    except signature_check.KeyFormatError as exc:
        raise ShellVerifyError(str(exc)) from None


def load_public_key_file(
    path: StrPath, *, trusted_uids: Iterable[int] | None = None
) -> Ed25519PublicKey:
    """Read and parse a public key file (see :func:`load_public_key`).

    With ``trusted_uids`` the file must pass the same owner and mode checks as
    the shell: whoever can write the key chooses what the DSP runs. The daemon
    passes them; the signing tool, run by hand on a key being checked, does not.
    """
    name = os.fspath(path)
    if trusted_uids is not None:
        data = _read_trusted(
            name,
            "public key",
            frozenset(trusted_uids),
            _PUBLIC_KEY_FILE_MAX,
            limit_note="a public key file is 64 hex digits or a PEM block",
        )
    else:
        try:
            with open(name, "rb") as f:
                data = f.read(_PUBLIC_KEY_FILE_MAX + 1)
        except OSError as exc:
            raise ShellVerifyError(f"cannot read public key {name}: {exc.strerror}") from None
        if len(data) > _PUBLIC_KEY_FILE_MAX:
            raise ShellVerifyError(f"public key {name} is larger than {_PUBLIC_KEY_FILE_MAX} bytes")
    try:
        return load_public_key(data)
    except ShellVerifyError as exc:
        raise ShellVerifyError(f"public key {name}: {exc.reason}") from None


def public_key_hex(public_key: Ed25519PublicKey) -> str:
    """The key's 32 raw bytes as 64 lower-case hex digits (the ``.pub`` format)."""
    from npud.fastrpc.trust import signature_check  # noqa: PLC0415  (loads cryptography)

    return signature_check.raw_public_key(public_key).hex()


def key_fingerprint(public_key: Ed25519PublicKey) -> str:
    """SHA-256 of the key's raw bytes, in hex: a stable name for logs and status."""
    return hashlib.sha256(bytes.fromhex(public_key_hex(public_key))).hexdigest()


def is_development_key(public_key: Ed25519PublicKey) -> bool:
    """True for the repository's public development key (the kernel profile refuses it)."""
    return hmac.compare_digest(public_key_hex(public_key), DEVELOPMENT_PUBLIC_KEY_HEX)


def _is_development_raw(raw: bytes) -> bool:
    return hmac.compare_digest(raw.hex(), DEVELOPMENT_PUBLIC_KEY_HEX)


# --------------------------------------------------------------------------
# Files

_SIGNATURE_FIX: Final = (
    f"an Ed25519 signature is exactly {SIGNATURE_SIZE} raw bytes "
    "(re-sign the shell with npud-sign-shell sign)"
)


def _read_trusted(
    path: str, role: str, trusted_uids: frozenset[int], limit: int, *, limit_note: str
) -> bytes:
    """Open ``path`` once, check it with fstat, read at most ``limit`` bytes through it."""
    try:
        fd = os.open(path, _OPEN_FLAGS)
    except OSError as exc:
        raise ShellVerifyError(_open_failure(path, role, exc)) from None
    try:
        st = os.fstat(fd)
        _check_trusted(path, role, st, trusted_uids)
        if st.st_size > limit:
            raise ShellVerifyError(f"{role} {path} is {st.st_size} bytes; {limit_note}")
        # st_size is only a hint (procfs reports 0, a file can grow): the read
        # itself stops one byte past the limit.
        data = _read_at_most(fd, limit + 1)
        if len(data) > limit:
            raise ShellVerifyError(f"{role} {path} is larger than {limit} bytes; {limit_note}")
        return data
    finally:
        os.close(fd)


def _read_at_most(fd: int, count: int) -> bytes:
    chunks: list[bytes] = []
    remaining = count
    while remaining > 0:
        chunk = os.read(fd, min(remaining, _READ_CHUNK))
        if not chunk:
            break
        chunks.append(chunk)
        remaining -= len(chunk)
    return b"".join(chunks)


def _open_failure(path: str, role: str, exc: OSError) -> str:
    if exc.errno == errno.ENOENT:
        what = {
            "shell": "install the shell image there or fix the configured path",
            "digest file": "create it with npud-sign-shell sign",
            "signature file": "create it with npud-sign-shell sign",
            "public key": "install the shell-signing public key there (install.sh --signing-dir)",
        }[role]
        return f"{role} {path} does not exist; {what}"
    if exc.errno == errno.ELOOP:
        return f"{role} {path} is a symbolic link; symlinks are refused, use the real file's path"
    if exc.errno == errno.EACCES:
        return f"{role} {path} cannot be read by npud (permission denied)"
    return f"cannot open {role} {path}: {exc.strerror or errno.errorcode.get(exc.errno or 0)}"


def _check_trusted(path: str, role: str, st: os.stat_result, trusted_uids: frozenset[int]) -> None:
    quoted = shlex.quote(path)
    if not stat.S_ISREG(st.st_mode):
        raise ShellVerifyError(f"{role} {path} is {_file_kind(st.st_mode)}, not a regular file")
    if st.st_uid not in trusted_uids:
        owners = (
            "root"
            if trusted_uids == DEFAULT_TRUSTED_UIDS
            else "a trusted uid (" + ", ".join(str(u) for u in sorted(trusted_uids)) + ")"
        )
        fix = f"chown root: {quoted}" if 0 in trusted_uids else "chown it to a trusted uid"
        raise ShellVerifyError(
            f"{role} {path} is owned by uid {st.st_uid}, not by {owners}; fix: {fix}"
        )
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        who = " and ".join(
            name
            for bit, name in ((stat.S_IWGRP, "group"), (stat.S_IWOTH, "others"))
            if st.st_mode & bit
        )
        raise ShellVerifyError(
            f"{role} {path} is writable by {who} (mode {stat.S_IMODE(st.st_mode):04o}); "
            f"fix: chmod go-w {quoted}"
        )


def _file_kind(mode: int) -> str:
    kinds = (
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
    )
    for test, name in kinds:
        if test(mode):
            return name
    return "not a regular file"


def _parse_digest_file(data: bytes, path: str, shell_name: str) -> str:
    """Return the lower-case hex digest recorded in a one-line sha256sum file."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise ShellVerifyError(f"digest file {path} is not UTF-8 text") from None
    line = text.removesuffix("\n")
    if not line.strip():
        raise ShellVerifyError(f"digest file {path} is empty; recreate it with npud-sign-shell")
    if "\n" in line:
        raise ShellVerifyError(
            f"digest file {path} has more than one line; it must hold only the shell's digest"
        )
    if "\r" in line:
        raise ShellVerifyError(
            f"digest file {path} has a carriage return (DOS line ending); "
            "write it with a plain '\\n'"
        )
    match = _DIGEST_LINE.fullmatch(line)
    if match is None:
        raise ShellVerifyError(
            f"digest file {path} is not '<64 hex digits>  {shell_name}' (sha256sum format)"
        )
    name = match.group("name")
    if name is not None and name != shell_name:
        raise ShellVerifyError(
            f"digest file {path} is for {name!r}, not for the shell {shell_name!r}"
        )
    return match.group("hex").lower()
