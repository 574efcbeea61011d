"""``npud-sign-shell``: make a signing key, sign a DSP shell image, check a signed shell.

Signing writes the two files that :mod:`npud.fastrpc.trust.shell` checks before a
shell goes to the DSP: ``SHELL.sha256`` (``"<hex>  <name>\\n"``, the format of
``sha256sum``) and ``SHELL.sig`` (the 64-byte Ed25519 signature over the
shell's bytes), both mode 0644. Exit status: 0 success, 1 failure (one line on
stderr says why), 2 usage error.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import os
import sys
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Final, NoReturn

from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from npud.fastrpc.kernel.abi import INIT_FILELEN_MAX
from npud.fastrpc.kernel.errors import ShellVerifyError
from npud.fastrpc.trust.shell import (
    DEFAULT_TRUSTED_UIDS,
    DIGEST_SUFFIX,
    SIGNATURE_SUFFIX,
    StrPath,
    is_development_key,
    key_fingerprint,
    load_public_key_file,
    public_key_hex,
    verify_shell,
)
from npud.ops import cli

PROG: Final = "npud-sign-shell"
PUBLIC_KEY_SUFFIX: Final = ".pub"
_PRIVATE_KEY_FILE_MAX: Final = 16 * 1024


class SignError(Exception):
    """An expected failure of the signing tool; ``str()`` is the one-line reason."""


@dataclass(frozen=True)
class SignedShell:
    """What :func:`sign_shell_file` wrote."""

    digest_path: str
    signature_path: str
    sha256: str


# --------------------------------------------------------------------------
# Keys


def generate_key(private_key_path: StrPath) -> Ed25519PrivateKey:
    """Write a new Ed25519 key: PEM PKCS8 at ``path`` (0600) and its hex public key at ``path.pub``.

    Refuses to overwrite either file; on failure neither file is left behind.
    """
    key_path = os.fspath(private_key_path)
    pub_path = key_path + PUBLIC_KEY_SUFFIX
    for path in (key_path, pub_path):
        if os.path.lexists(path):
            raise SignError(f"{path} already exists; refusing to overwrite a key")
    key = Ed25519PrivateKey.generate()
    pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    _write_new_file(key_path, pem, 0o600)
    try:
        _write_new_file(pub_path, (public_key_hex(key.public_key()) + "\n").encode(), 0o644)
    except BaseException:
        os.unlink(key_path)
        raise
    return key


def load_private_key(data: bytes) -> Ed25519PrivateKey:
    """Parse an unencrypted PEM (PKCS8) Ed25519 private key, as ``genkey`` writes it."""
    if data.lstrip().startswith(b"-----BEGIN ENCRYPTED PRIVATE KEY-----"):
        raise SignError("the private key is encrypted; give an unencrypted PKCS8 key")
    if not data.lstrip().startswith(b"-----BEGIN PRIVATE KEY-----"):
        raise SignError(
            "not a PEM 'PRIVATE KEY' block (PKCS8); use a key written by npud-sign-shell genkey"
        )
    try:
        key = serialization.load_pem_private_key(data, password=None)
    except (ValueError, UnsupportedAlgorithm) as exc:
        raise SignError(f"the private key cannot be parsed: {exc}") from None
    if not isinstance(key, Ed25519PrivateKey):
        raise SignError(
            f"the private key is a {type(key).__name__}; shells are signed with Ed25519"
        )
    return key


def load_private_key_file(path: StrPath) -> Ed25519PrivateKey:
    name = os.fspath(path)
    data = _read_file(name, "private key", _PRIVATE_KEY_FILE_MAX)
    try:
        return load_private_key(data)
    except SignError as exc:
        raise SignError(f"private key {name}: {exc}") from None


# --------------------------------------------------------------------------
# Signing


def digest_line(data: bytes, name: str) -> bytes:
    """The ``sha256sum`` line for ``data`` stored under the base name ``name``."""
    # sha256sum escapes such names and the verifier reads a leading '*' as
    # the binary-mode marker: refuse what cannot round-trip.
    if not name or "\n" in name or "\r" in name or name[0] in "* \t" or "/" in name:
        raise SignError(f"cannot record the file name {name!r} in a digest line")
    return f"{hashlib.sha256(data).hexdigest()}  {name}\n".encode()


def sign_shell_file(shell_path: StrPath, private_key: Ed25519PrivateKey) -> SignedShell:
    """Sign the shell: write ``SHELL.sha256`` and ``SHELL.sig`` (0644, replaced atomically).

    The shell is read once; digest and signature are made from the same bytes.
    """
    shell = os.fspath(shell_path)
    data = _read_file(shell, "shell", INIT_FILELEN_MAX)
    if not data:
        raise SignError(f"shell {shell} is empty")
    line = digest_line(data, os.path.basename(shell))
    signature = private_key.sign(data)
    digest_path = shell + DIGEST_SUFFIX
    signature_path = shell + SIGNATURE_SUFFIX
    for path, content in ((digest_path, line), (signature_path, signature)):
        try:
            write_file_atomic(path, content, 0o644)
        except OSError as exc:
            raise SignError(f"cannot write {path}: {exc.strerror}") from None
    return SignedShell(
        digest_path=digest_path,
        signature_path=signature_path,
        sha256=hashlib.sha256(data).hexdigest(),
    )


def write_file_atomic(path: StrPath, data: bytes, mode: int) -> None:
    """Replace ``path`` with ``data`` at ``mode`` (umask does not apply) via a rename.

    Readers see the old file or the new one, never a partial write.
    """
    target = os.fspath(path)
    directory = os.path.dirname(target) or "."
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=f".{os.path.basename(target)}.", suffix=".tmp")
    try:
        try:
            os.fchmod(fd, mode)
            _write_all(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def _write_new_file(path: str, data: bytes, mode: int) -> None:
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        fd = os.open(path, flags, mode)
    except FileExistsError:
        raise SignError(f"{path} already exists; refusing to overwrite a key") from None
    except OSError as exc:
        raise SignError(f"cannot create {path}: {exc.strerror}") from None
    try:
        try:
            os.fchmod(fd, mode)
            _write_all(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError as exc:
        os.unlink(path)
        raise SignError(f"cannot write {path}: {exc.strerror}") from None


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]


def _read_file(path: str, role: str, limit: int) -> bytes:
    try:
        with open(path, "rb") as f:
            data = f.read(limit + 1)
    except OSError as exc:
        raise SignError(f"cannot read {role} {path}: {exc.strerror}") from None
    if len(data) > limit:
        raise SignError(f"{role} {path} is larger than {limit} bytes")
    return data


# --------------------------------------------------------------------------
# Command line


class _Parser(argparse.ArgumentParser):
    """Usage errors as one line on stderr, exit status 64 (EX_USAGE)."""

    def error(self, message: str) -> NoReturn:
        self.exit(cli.EX_USAGE, f"{self.prog}: error: {message} (see --help)\n")


def _uid(text: str) -> int:
    try:
        uid = int(text, 10)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a numeric uid: {text!r}") from None
    if not 0 <= uid < 2**32:
        raise argparse.ArgumentTypeError(f"uid out of range: {text}")
    return uid


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog=PROG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description=(
            "Sign DSP shell images for npud and check signed shells.\n\n"
            f"npud loads a shell only if SHELL{DIGEST_SUFFIX} holds its SHA-256, "
            f"SHELL{SIGNATURE_SUFFIX} holds an\n"
            "Ed25519 signature of it by the configured public key, and all three files\n"
            "are owned by root and not writable by group or others."
        ),
        epilog=(
            "example:\n"
            "  npud-sign-shell genkey /secure/shell-signing.key\n"
            "  npud-sign-shell sign --key /secure/shell-signing.key SHELL\n"
            "  npud-sign-shell verify --public-key /secure/shell-signing.key.pub SHELL\n\n"
            "exit status: 0 ok, 1 failure (the shell would be refused, a key or file "
            "cannot be used), 64 usage error, 141 stdout closed early"
        ),
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    genkey = commands.add_parser(
        "genkey",
        help="create a new signing key",
        description=(
            "Write a new Ed25519 private key (PEM PKCS8, mode 0600) to PRIVATE_KEY and its "
            f"public key as 64 hex digits to PRIVATE_KEY{PUBLIC_KEY_SUFFIX}; print the public "
            "key. Never overwrites an existing file."
        ),
    )
    genkey.add_argument("private_key", metavar="PRIVATE_KEY", help="where to write the key")

    sign = commands.add_parser(
        "sign",
        help="sign a shell image",
        description=(
            f"Write SHELL{DIGEST_SUFFIX} ('<hex>  <name>', sha256sum format) and "
            f"SHELL{SIGNATURE_SUFFIX} (64-byte Ed25519 signature), both mode 0644, replacing "
            "earlier ones."
        ),
    )
    sign.add_argument(
        "--key", required=True, metavar="PRIVATE_KEY", help="PEM private key from genkey"
    )
    sign.add_argument("shell", metavar="SHELL", help="the shell image to sign")

    verify = commands.add_parser(
        "verify",
        help="check a signed shell as npud does",
        description=(
            "Run npud's shell verification: ownership and modes of the three files, the "
            "SHA-256 against the digest file, the signature against the public key. Prints OK "
            "or the reason it would be refused."
        ),
    )
    verify.add_argument(
        "--public-key",
        required=True,
        metavar="PUBLIC_KEY",
        help="public key file: 64 hex digits (KEY.pub from genkey) or PEM 'PUBLIC KEY'",
    )
    verify.add_argument(
        "--trusted-uid",
        type=_uid,
        action="append",
        default=[],
        metavar="UID",
        help="also accept files owned by this uid (repeatable; root is always accepted)",
    )
    verify.add_argument(
        "--digest", metavar="FILE", help=f"digest file (default SHELL{DIGEST_SUFFIX})"
    )
    verify.add_argument(
        "--signature", metavar="FILE", help=f"signature file (default SHELL{SIGNATURE_SUFFIX})"
    )
    verify.add_argument("shell", metavar="SHELL", help="the shell image to check")
    return parser


def _cmd_genkey(args: argparse.Namespace) -> int:
    key = generate_key(str(args.private_key))
    print(public_key_hex(key.public_key()))
    return 0


def _cmd_sign(args: argparse.Namespace) -> int:
    key = load_private_key_file(str(args.key))
    signed = sign_shell_file(str(args.shell), key)
    note = " (DEVELOPMENT key: emulator only)" if is_development_key(key.public_key()) else ""
    print(
        f"signed {args.shell}: sha256 {signed.sha256}; wrote {signed.digest_path} and "
        f"{signed.signature_path}; key {key_fingerprint(key.public_key())}{note}"
    )
    return 0


def _cmd_verify(args: argparse.Namespace) -> int:
    public_key = load_public_key_file(str(args.public_key))
    verified = verify_shell(
        str(args.shell),
        public_key=public_key,
        digest_path=args.digest,
        signature_path=args.signature,
        trusted_uids=DEFAULT_TRUSTED_UIDS | frozenset(args.trusted_uid),
    )
    note = " (DEVELOPMENT key: emulator only)" if is_development_key(public_key) else ""
    print(
        f"OK {verified.path}: {verified.size} bytes, sha256 {verified.sha256}, "
        f"key {verified.key_fingerprint}{note}"
    )
    return 0


_COMMANDS: Final[dict[str, Callable[[argparse.Namespace], int]]] = {
    "genkey": _cmd_genkey,
    "sign": _cmd_sign,
    "verify": _cmd_verify,
}


def main(argv: Sequence[str] | None = None) -> int:
    """Run npud-sign-shell with ``argv``; returns the exit status (the epilog)."""
    return cli.run(lambda: _main(argv))


def _main(argv: Sequence[str] | None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help (0) or a usage error (64), already printed
        return cli.parse_status(exc)
    try:
        return _COMMANDS[args.command](args)
    except ShellVerifyError as exc:
        print(f"{PROG}: FAILED: {exc.reason}", file=sys.stderr)
    except SignError as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
