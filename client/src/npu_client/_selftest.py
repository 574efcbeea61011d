"""``npuctl selftest``: the hardware smoke test, run through the daemon.

Allocate 1 MiB, map it into the DSP, write a random pattern into its first
half, send it through the echo skel into the second half and compare, let
the test skel fill the second half and compare, let it checksum the pattern
and compare with zlib's CRC-32, then unmap, close and free. Each step is
reported on its own; a step whose prerequisite failed is skipped.
"""

from __future__ import annotations

import os
import struct
import zlib
from collections.abc import Callable
from typing import Final, Literal

import msgspec

from npu_client._blocking import Client, DmaBuffer, RemoteHandle
from npu_client._errors import NpuError

BUFFER_SIZE: Final = 1 << 20
HALF: Final = BUFFER_SIZE // 2
FILL_SEED: Final = 0x5A
ECHO_URI: Final = "file:///libecho_skel.so?echo_skel_handle_invoke&_modver=1.0&_dom=cdsp"
TEST_URI: Final = "file:///libnpu_test_skel.so?npu_test_skel_handle_invoke&_modver=1.0&_dom=cdsp"

# Method numbers (remote_handle64 interfaces number user methods from 2; see idl/).
ECHO_METHOD: Final = 2
FILL_METHOD: Final = 2
CHECKSUM_METHOD: Final = 3

StepStatus = Literal["ok", "failed", "skipped"]


class StepResult(msgspec.Struct, frozen=True, kw_only=True):
    """One step: ``name``, ``status`` (ok, failed, skipped) and ``detail``."""

    name: str
    status: StepStatus
    detail: str = ""


class SelftestReport(msgspec.Struct, frozen=True, kw_only=True):
    """What ``npuctl selftest --json`` prints: ``ok`` and the ``steps`` in order."""

    ok: bool
    steps: tuple[StepResult, ...]


class StepCheckError(Exception):
    """A step's check did not hold; the message says what was seen."""


class _Selftest:
    def __init__(self, client: Client) -> None:
        self.client = client
        self.results: list[StepResult] = []
        self.buffer: DmaBuffer | None = None
        self.echo: RemoteHandle | None = None
        self.test: RemoteHandle | None = None
        self.pattern = b""

    def step(self, name: str, body: Callable[[], str], *needs: str) -> None:
        """Run ``body`` (it returns a detail, raises StepCheckError or an error) unless a
        step it needs did not pass."""
        passed = {r.name for r in self.results if r.status == "ok"}
        missing = [need for need in needs if need not in passed]
        if missing:
            self.results.append(
                StepResult(name=name, status="skipped", detail=f"needs {missing[0]}")
            )
            return
        try:
            detail = body()
        except (StepCheckError, NpuError, OSError, ValueError) as exc:
            self.results.append(StepResult(name=name, status="failed", detail=_describe(exc)))
        else:
            self.results.append(StepResult(name=name, status="ok", detail=detail))

    # --- the steps ------------------------------------------------------------------------

    def alloc(self) -> str:
        self.buffer = self.client.alloc(BUFFER_SIZE)
        if self.buffer.size < BUFFER_SIZE:
            raise StepCheckError(f"asked for {BUFFER_SIZE} bytes, got {self.buffer.size}")
        return f"buffer {self.buffer.id}, {self.buffer.size} bytes"

    def map(self) -> str:
        buffer = self._buffer()
        address = buffer.map()
        if buffer.map() != address:
            raise StepCheckError("a second map() answered a different address")
        return f"DSP address {address:#x}"

    def write(self) -> str:
        self.pattern = os.urandom(HALF)
        view = self._buffer().view()
        view[:HALF] = self.pattern
        if view[:HALF] != self.pattern:
            raise StepCheckError("the pattern did not read back from the buffer")
        return f"{HALF} random bytes"

    def open_echo(self) -> str:
        self.echo = self.client.open(ECHO_URI)
        return f"handle {self.echo.id}"

    def run_echo(self) -> str:
        assert self.echo is not None
        buffer = self._buffer()
        buffer.view()[HALF:] = bytes(HALF)
        self.echo.invoke(
            ECHO_METHOD,
            [struct.pack("<II", HALF, HALF), buffer.slice(0, HALF)],
            [buffer.slice(HALF, HALF)],
        )
        _expect_bytes(buffer.view()[HALF:], self.pattern, "the echo")
        return f"{HALF} bytes through the DSP, read back equal"

    def open_test(self) -> str:
        self.test = self.client.open(TEST_URI)
        return f"handle {self.test.id}"

    def run_fill(self) -> str:
        assert self.test is not None
        buffer = self._buffer()
        self.test.invoke(
            FILL_METHOD, [struct.pack("<II", FILL_SEED, HALF)], [buffer.slice(HALF, HALF)]
        )
        expected = bytes((FILL_SEED + i) & 0xFF for i in range(256)) * (HALF // 256)
        _expect_bytes(buffer.view()[HALF:], expected, "the fill")
        return f"{HALF} bytes from seed {FILL_SEED:#x}, read back equal"

    def run_checksum(self) -> str:
        assert self.test is not None
        [crc_bytes] = self.test.invoke(
            CHECKSUM_METHOD, [struct.pack("<I", HALF), self._buffer().slice(0, HALF)], [4]
        )
        assert crc_bytes is not None  # an inline output
        (crc,) = struct.unpack("<I", crc_bytes)
        expected = zlib.crc32(self.pattern)
        if crc != expected:
            raise StepCheckError(f"the DSP computed CRC-32 {crc:#010x}, expected {expected:#010x}")
        return f"CRC-32 {crc:#010x}"

    def unmap(self) -> str:
        self._buffer().unmap()
        return "unmapped"

    def close_handles(self) -> str:
        handles = [handle for handle in (self.echo, self.test) if handle is not None]
        for handle in handles:
            handle.close()
        return f"{len(handles)} closed"

    def free(self) -> str:
        self._buffer().free()
        return "freed"

    def _buffer(self) -> DmaBuffer:
        assert self.buffer is not None  # the alloc step is a prerequisite
        return self.buffer


def run_selftest(client: Client) -> SelftestReport:
    """Run every step against ``client``'s daemon."""
    test = _Selftest(client)
    alloc, write, echo_open, test_open = (
        "alloc 1 MiB",
        "write pattern",
        "open echo",
        "open npu_test",
    )
    test.step(alloc, test.alloc)
    test.step("map into the DSP", test.map, alloc)
    test.step(write, test.write, alloc)
    test.step(echo_open, test.open_echo)
    test.step("echo through the DSP", test.run_echo, write, echo_open)
    test.step(test_open, test.open_test)
    test.step("fill on the DSP", test.run_fill, alloc, test_open)
    test.step("checksum on the DSP", test.run_checksum, write, test_open)
    test.step("unmap", test.unmap, alloc)
    test.step("close handles", test.close_handles)
    test.step("free", test.free, alloc)
    results = tuple(test.results)
    return SelftestReport(ok=all(r.status == "ok" for r in results), steps=results)


def render_report(report: SelftestReport) -> str:
    """One line per step, then the verdict."""
    width = max(len(step.name) for step in report.steps)
    lines = []
    for step in report.steps:
        if step.status == "ok":
            outcome = f"ok ({step.detail})" if step.detail else "ok"
        elif step.status == "failed":
            outcome = f"FAILED: {step.detail}"
        else:
            outcome = f"skipped ({step.detail})"
        lines.append(f"{step.name:<{width}}  {outcome}")
    failed = sum(step.status != "ok" for step in report.steps)
    if report.ok:
        lines.append(f"selftest passed: {len(report.steps)} steps")
    else:
        lines.append(f"selftest FAILED: {failed} of {len(report.steps)} steps did not pass")
    return "\n".join(lines)


def _expect_bytes(actual: memoryview, expected: bytes, what: str) -> None:
    if actual == expected:
        return
    data = bytes(actual)
    first = next(i for i, (a, b) in enumerate(zip(data, expected, strict=True)) if a != b)
    raise StepCheckError(
        f"{what} differs at byte {first}: got {data[first]:#04x}, expected {expected[first]:#04x}"
    )


def _describe(exc: BaseException) -> str:
    if isinstance(exc, NpuError):
        return f"{exc.message} ({exc.name})"
    if isinstance(exc, OSError):
        return exc.strerror or str(exc)
    return str(exc)
