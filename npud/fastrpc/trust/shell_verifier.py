"""The daemon's shell-signature check, run in a short-lived child process.

``cryptography`` checks the signature (it is the verifier of record), but its
Rust binding costs the daemon about 6 MiB of resident memory for its whole
life for a check made once at start-up. So the daemon never imports it: a
child interpreter runs ``npud/fastrpc/trust/signature_check.py`` with nothing on
its path but the standard library and ``cryptography``, gets the key file,
the signature and the shell's bytes on stdin, answers on stdout and exits.

The child can be started early (:meth:`ShellVerifier.start`), so its
interpreter start and the import of ``cryptography`` overlap the daemon's
own start-up; :meth:`ShellVerifier.check` then costs about a millisecond.
This module imports only the standard library until it must report a
failure, so ``npud`` can start the child before it loads anything else.

Fail closed: anything but a well-formed answer about exactly these bytes and
exactly this key is a :class:`ShellVerifyError`. The child failing to start,
dying, hanging past the timeout, writing too much or something malformed,
or answering about other bytes (a different SHA-256) or another key (one
the key file does not hold) all refuse the shell. The bytes that go to the
DSP are the parent's own, never anything the child sends back.
"""

from __future__ import annotations

import binascii
import importlib.util
import json
import os
import re
import selectors
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:
    from npud.fastrpc.kernel.errors import ShellVerifyError

VERIFY_TIMEOUT: Final = 30.0
MAX_REPLY: Final = 4096
MAX_DIAGNOSTIC: Final = 4096
PROGRAM: Final = Path(__file__).with_name("signature_check.py")

# Keep in step with signature_check (which cannot import npud).
REQUEST_MAGIC: Final = b"NPUD-ED25519 1\n"
ED25519_SPKI_PREFIX: Final = bytes.fromhex("302a300506032b6570032100")
"""DER of SubjectPublicKeyInfo for Ed25519 (RFC 8410) up to the 32 key bytes."""

_HEX_KEY = re.compile(rb"[0-9A-Fa-f]{64}")
_HEX_DIGEST = re.compile(r"[0-9a-f]{64}")
_RUNNER: Final = (
    "import runpy, sys; sys.path.insert(0, sys.argv[1]); "
    "runpy.run_path(sys.argv[2], run_name='__main__')"
)


@dataclass(frozen=True)
class Verdict:
    """The child's answer, checked.

    Either ``key_problem`` says why the key file holds no usable Ed25519 key
    (cryptography's account), or ``public_key`` is the key it parsed and
    ``valid`` whether the signature holds.
    """

    public_key: bytes = b""
    valid: bool = False
    key_problem: str | None = None


def _refusal(reason: str) -> ShellVerifyError:
    from npud.fastrpc.kernel.errors import ShellVerifyError  # noqa: PLC0415  (npu_protocol, on failure)

    return ShellVerifyError(reason)


def verifier_command() -> list[str]:
    """The child's command line: this interpreter, isolated, without site-packages,
    writing no bytecode. OSError when cryptography is not installed."""
    spec = importlib.util.find_spec("cryptography")  # finds it without importing it
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    if not locations:
        raise FileNotFoundError(
            "the Python package cryptography is not installed (pip install cryptography)"
        )
    directory = Path(locations[0]).parent
    return [sys.executable, "-I", "-S", "-B", "-c", _RUNNER, str(directory), str(PROGRAM)]


def ed25519_key_in(key_file: bytes) -> bytes | None:
    """The raw key of a key file in one of npud's two forms, read without cryptography.

    64 hex digits (whitespace ignored) or a PEM ``PUBLIC KEY`` block holding
    an Ed25519 SubjectPublicKeyInfo; None for anything else (the verifier
    then says what is wrong). Used to hold the verifier to the configured key
    and to refuse the development key before anything runs.
    """
    text = key_file.strip()
    if text.startswith(b"-----BEGIN PUBLIC KEY-----"):
        lines = text.splitlines()
        if len(lines) < 3 or lines[-1].strip() != b"-----END PUBLIC KEY-----":
            return None
        try:
            body = b"".join(line.strip() for line in lines[1:-1])
            der = binascii.a2b_base64(body, strict_mode=True)
        except binascii.Error:
            return None
        if len(der) != len(ED25519_SPKI_PREFIX) + 32 or not der.startswith(ED25519_SPKI_PREFIX):
            return None
        return der[len(ED25519_SPKI_PREFIX) :]
    compact = b"".join(text.split())
    return bytes.fromhex(compact.decode("ascii")) if _HEX_KEY.fullmatch(compact) else None


class ShellVerifier:
    """One verifier child: :meth:`start` it early, :meth:`check` once, :meth:`close` always.

    Owns the child process and its three pipes; :meth:`check` and
    :meth:`close` reap it. Thread-safe: it may be started on one thread and
    used or closed on another.
    """

    def __init__(self, command: list[str] | None = None, *, timeout: float = VERIFY_TIMEOUT):
        self._command = command
        self._timeout = timeout
        self._lock = threading.Lock()
        self._process: subprocess.Popen[bytes] | None = None
        self._start_error: ShellVerifyError | None = None
        self._used = False

    def start(self) -> None:
        """Start the child now; a failure is kept and reported by :meth:`check`."""
        with self._lock:
            if self._process is not None or self._start_error is not None or self._used:
                return
            try:
                command = self._command if self._command is not None else verifier_command()
                self._process = subprocess.Popen(
                    command,
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    close_fds=True,
                )
            except OSError as exc:
                self._start_error = _refusal(
                    f"cannot start the signature verifier ({exc.strerror or exc}); "
                    "the shell's signature cannot be checked"
                )

    def check(
        self, key_file: bytes, signature: bytes, message: bytes, message_sha256: str
    ) -> Verdict:
        """Have the child check ``signature`` over ``message`` by the key in ``key_file``.

        ``message_sha256`` is the caller's own digest of ``message``; the
        answer must be about exactly those bytes. Raises ShellVerifyError when
        the child fails or its answer is not trusted.
        """
        self.start()
        with self._lock:
            if self._used:
                raise RuntimeError("a ShellVerifier checks one signature only")
            self._used = True
            process, error = self._process, self._start_error
        if process is None:
            assert error is not None
            raise error
        header = b"".join(n.to_bytes(4, "little") for n in map(len, (key_file, signature, message)))
        try:
            out, diagnostic = _exchange(
                process, REQUEST_MAGIC + header + key_file + signature + message, self._timeout
            )
        finally:
            self.close()
        return _verdict(process, out, diagnostic, key_file, message_sha256)

    def close(self) -> None:
        """Stop the child if it still runs, reap it and close its pipes (idempotent)."""
        with self._lock:
            process, self._process = self._process, None
            self._used = True
        if process is None:
            return
        if process.poll() is None:
            process.kill()
        process.wait()
        for pipe in (process.stdin, process.stdout, process.stderr):
            if pipe is not None:
                pipe.close()


def _exchange(
    process: subprocess.Popen[bytes], request: bytes, timeout: float
) -> tuple[bytes, bytes]:
    """Write ``request``, read stdout and stderr (each bounded) until both close."""
    assert process.stdin is not None
    assert process.stdout is not None
    assert process.stderr is not None
    deadline = time.monotonic() + timeout
    out, diagnostic = bytearray(), bytearray()
    limits = {process.stdout: (out, MAX_REPLY), process.stderr: (diagnostic, MAX_DIAGNOSTIC)}
    pending = memoryview(request)
    with selectors.DefaultSelector() as selector:
        os.set_blocking(process.stdin.fileno(), False)
        selector.register(process.stdin, selectors.EVENT_WRITE)
        for stream in limits:
            selector.register(stream, selectors.EVENT_READ)
        while selector.get_map():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise _refusal(
                    f"the signature verifier did not answer within {timeout:g} s; "
                    "the shell's signature cannot be checked"
                )
            for key, _ in selector.select(remaining):
                if key.fileobj is process.stdin:
                    try:
                        pending = pending[os.write(process.stdin.fileno(), pending[:65536]) :]
                    except BrokenPipeError:
                        pending = pending[:0]  # it stopped reading: its answer says why
                    if not pending:
                        selector.unregister(process.stdin)
                        process.stdin.close()
                    continue
                buffer, limit = limits[key.fileobj]  # type: ignore[index]
                chunk = os.read(key.fd, 65536)
                if not chunk:
                    selector.unregister(key.fileobj)
                    continue
                buffer += chunk
                if len(buffer) > limit and buffer is out:
                    raise _refusal(
                        f"the signature verifier wrote more than {MAX_REPLY} bytes; "
                        "its answer is not trusted"
                    )
                del buffer[limit:]
    try:
        process.wait(max(deadline - time.monotonic(), 0))
    except subprocess.TimeoutExpired:
        raise _refusal(
            f"the signature verifier did not exit within {timeout:g} s; its answer is not trusted"
        ) from None
    return bytes(out), bytes(diagnostic)


def _verdict(
    process: subprocess.Popen[bytes],
    out: bytes,
    diagnostic: bytes,
    key_file: bytes,
    message_sha256: str,
) -> Verdict:
    status = process.returncode
    if status != 0:
        if status is not None and status < 0:
            how = f"was killed by {_signal_name(-status)}"
        else:
            how = f"exited with status {status}"
        detail = diagnostic.decode("utf-8", "replace").strip().splitlines()
        raise _refusal(
            f"the signature verifier {how}"
            + (f" ({detail[-1]})" if detail else "")
            + "; the shell's signature cannot be checked"
        )
    answer = _parse_answer(out)
    if answer.get("message_sha256") != message_sha256:
        raise _refusal(
            "the signature verifier answered about other bytes than the shell's "
            f"(SHA-256 {answer.get('message_sha256')!r}, the shell's is {message_sha256}); "
            "its answer is not trusted"
        )
    verdict = answer.get("verdict")
    if verdict == "bad-key" and set(answer) == {"verdict", "reason", "message_sha256"}:
        return Verdict(key_problem=answer["reason"])
    if verdict not in ("valid", "invalid") or set(answer) != {
        "verdict",
        "public_key",
        "message_sha256",
    }:
        raise _malformed(out)
    public_key = answer["public_key"]
    if not _HEX_DIGEST.fullmatch(public_key):
        raise _malformed(out)
    raw = bytes.fromhex(public_key)
    if ed25519_key_in(key_file) != raw:
        raise _refusal(
            f"the signature verifier answered for key {public_key}, which the key file does "
            "not hold; its answer is not trusted"
        )
    return Verdict(public_key=raw, valid=verdict == "valid")


def _parse_answer(out: bytes) -> dict[str, str]:
    if not out.endswith(b"\n") or out.count(b"\n") != 1:
        raise _malformed(out)
    try:
        answer = json.loads(out)
    except ValueError:
        raise _malformed(out) from None
    if not isinstance(answer, dict) or not all(
        isinstance(key, str) and isinstance(value, str) for key, value in answer.items()
    ):
        raise _malformed(out)
    return answer


def _malformed(out: bytes) -> ShellVerifyError:
    shown = out[:200].decode("utf-8", "replace")
    return _refusal(
        f"the signature verifier's answer is malformed ({shown!r}); the shell's signature "
        "cannot be checked"
    )


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"
