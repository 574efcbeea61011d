"""Ed25519 through ``cryptography``: parse a public key, check a signature.

The one place npud parses shell-signing public keys and checks signatures;
``cryptography`` is the verifier of record. It imports nothing from npud, so
it also runs on its own as the daemon's short-lived verifier process, with
nothing on ``sys.path`` but the standard library and the directory that holds
``cryptography`` (see ``npud.fastrpc.trust.shell_verifier``). The daemon runs it
that way (``npud.fastrpc.trust.shell_verifier``) so the 6 MiB
Rust binding of ``cryptography`` is never loaded into the daemon itself.

Protocol of the program: stdin carries one request, ``REQUEST_MAGIC``, then
three little-endian u32 lengths (key file, signature, message) and those
bytes; stdout gets one JSON object on one line:

* ``{"verdict": "valid" | "invalid", "public_key": <64 hex>, "message_sha256": <hex>}``
* ``{"verdict": "bad-key", "reason": <text>, "message_sha256": <hex>}``

and the exit status is 0. A malformed request exits with status 2 and a
line on stderr; any other failure leaves a traceback and a non-zero status.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import struct
import sys
from typing import Final

from cryptography.exceptions import InvalidSignature, UnsupportedAlgorithm
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import dsa, ec, ed448, rsa, x448, x25519
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

PUBLIC_KEY_SIZE: Final = 32
REQUEST_MAGIC: Final = b"NPUD-ED25519 1\n"
REQUEST_HEADER: Final = struct.Struct("<III")
MAX_KEY_FILE: Final = 16 * 1024
MAX_SIGNATURE: Final = 1024
MAX_MESSAGE: Final = 64 * 1024 * 1024

_HEX_KEY = re.compile(r"[0-9A-Fa-f]{64}")


class KeyFormatError(ValueError):
    """The public key cannot be used; ``str()`` says what was found instead."""


def parse_public_key(data: bytes) -> Ed25519PublicKey:
    """An Ed25519 public key from 64 hex digits or a PEM ``PUBLIC KEY`` block.

    Whitespace around (or inside) the hex form is ignored. Anything else
    raises KeyFormatError saying what was found instead.
    """
    text = data.strip()
    if not text:
        raise KeyFormatError("the public key is empty; expected 64 hex digits or a PEM key")
    if text.startswith(b"-----BEGIN "):
        return _parse_pem(text)
    compact = b"".join(text.split())
    try:
        hex_text = compact.decode("ascii")
    except UnicodeDecodeError:
        hex_text = ""
    if not _HEX_KEY.fullmatch(hex_text):
        if hex_text and all(c in "0123456789abcdefABCDEF" for c in hex_text):
            raise KeyFormatError(
                f"the public key has {len(hex_text)} hex digits; an Ed25519 public key is "
                f"{PUBLIC_KEY_SIZE * 2} hex digits ({PUBLIC_KEY_SIZE} bytes)"
            )
        raise KeyFormatError(
            "the public key is neither 64 hex digits nor a PEM 'PUBLIC KEY' block "
            "(npud-sign-shell genkey writes the hex form to KEY.pub)"
        )
    try:
        return Ed25519PublicKey.from_public_bytes(bytes.fromhex(hex_text))
    except ValueError as exc:
        raise KeyFormatError(f"the public key is not a valid Ed25519 key: {exc}") from None


def raw_public_key(key: Ed25519PublicKey) -> bytes:
    """The key's 32 raw bytes."""
    return key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


def signature_is_valid(key: Ed25519PublicKey, signature: bytes, message: bytes) -> bool:
    try:
        key.verify(signature, message)
    except InvalidSignature:
        return False
    return True


def _parse_pem(text: bytes) -> Ed25519PublicKey:
    first_line = text.split(b"\n", 1)[0].strip()
    if first_line != b"-----BEGIN PUBLIC KEY-----":
        label = first_line.decode("ascii", "replace")
        hint = (
            "; that is a private key, give its public half (KEY.pub from npud-sign-shell genkey)"
            if b"PRIVATE" in first_line
            else ""
        )
        raise KeyFormatError(
            f"the PEM block starts with {label!r}, expected '-----BEGIN PUBLIC KEY-----' "
            f"(SubjectPublicKeyInfo){hint}"
        )
    try:
        key = serialization.load_pem_public_key(text)
    except (ValueError, UnsupportedAlgorithm) as exc:
        raise KeyFormatError(f"the PEM public key cannot be parsed: {exc}") from None
    if not isinstance(key, Ed25519PublicKey):
        raise KeyFormatError(
            f"the PEM public key is {_key_kind(key)} key; shells are signed with Ed25519"
        )
    return key


def _key_kind(key: object) -> str:
    if isinstance(key, rsa.RSAPublicKey):
        return f"an RSA-{key.key_size}"
    if isinstance(key, ec.EllipticCurvePublicKey):
        return f"an EC ({key.curve.name})"
    kinds = (
        (dsa.DSAPublicKey, "a DSA"),
        (ed448.Ed448PublicKey, "an Ed448"),
        (x25519.X25519PublicKey, "an X25519"),
        (x448.X448PublicKey, "an X448"),
    )
    for cls, name in kinds:
        if isinstance(key, cls):
            return name
    return f"a {type(key).__name__}"


# --------------------------------------------------------------------------
# The verifier program


class RequestError(Exception):
    """The request on stdin is malformed."""


def read_request(stream: bytes) -> tuple[bytes, bytes, bytes]:
    """(key file, signature, message) from one request."""
    if not stream.startswith(REQUEST_MAGIC):
        raise RequestError("the request does not start with the protocol's magic line")
    header_end = len(REQUEST_MAGIC) + REQUEST_HEADER.size
    if len(stream) < header_end:
        raise RequestError("the request is truncated in its header")
    key_size, signature_size, message_size = REQUEST_HEADER.unpack_from(stream, len(REQUEST_MAGIC))
    if key_size > MAX_KEY_FILE or signature_size > MAX_SIGNATURE or message_size > MAX_MESSAGE:
        raise RequestError("a length in the request is beyond its bound")
    if len(stream) != header_end + key_size + signature_size + message_size:
        raise RequestError("the request's lengths do not add up to its size")
    key_end = header_end + key_size
    signature_end = key_end + signature_size
    return stream[header_end:key_end], stream[key_end:signature_end], stream[signature_end:]


def answer(key_file: bytes, signature: bytes, message: bytes) -> dict[str, str]:
    """The reply for one request (see the module docstring)."""
    digest = hashlib.sha256(message).hexdigest()
    try:
        key = parse_public_key(key_file)
    except KeyFormatError as exc:
        return {"verdict": "bad-key", "reason": str(exc), "message_sha256": digest}
    valid = signature_is_valid(key, signature, message)
    return {
        "verdict": "valid" if valid else "invalid",
        "public_key": raw_public_key(key).hex(),
        "message_sha256": digest,
    }


def main() -> int:
    limit = len(REQUEST_MAGIC) + REQUEST_HEADER.size + MAX_KEY_FILE + MAX_SIGNATURE + MAX_MESSAGE
    stream = sys.stdin.buffer.read(limit + 1)
    try:
        request = read_request(stream)
    except RequestError as exc:
        print(f"signature_check: {exc}", file=sys.stderr)
        return 2
    sys.stdout.write(json.dumps(answer(*request)) + "\n")
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    status = main()
    sys.stdout.flush()
    sys.stderr.flush()
    # The answer is out; the interpreter's teardown (about 10 ms with cryptography
    # loaded) would only keep the daemon waiting for this process to end.
    os._exit(status)
