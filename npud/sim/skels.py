"""Skels of the simulated DSP, written in Python and marshalled by the qaic rules.

A skel is what a ``lib<name>_skel.so`` would contain on the device. The
simulated DSP binds one when a remotectl open names a library whose descriptor
(see :mod:`npud.sim.loader`) says ``skel=<name>``. Method numbering follows the
entry symbol: ``<name>_skel_handle_invoke`` is a remote_handle64 ("domain")
interface whose user methods start at 2 (0 and 1 are open/close, run by
remotectl itself); ``<name>_skel_invoke`` is a plain interface numbered from 0.

Interfaces (idl/echo.idl, idl/npu_test.idl), domain method numbers and sc:

* echo.echo(in sequence<octet> in_buf, rout sequence<octet> out_buf)
  method 2, sc 0x02020100; primIn {u32 len(in_buf), u32 capacity(out_buf)}.
  Copies min(len, capacity) bytes and zero-fills the rest.
* npu_test.fill(in uint32 seed, rout sequence<octet> buf)
  method 2, sc 0x02010100; primIn {u32 seed, u32 capacity}; buf[i] = (seed + i) & 0xFF.
* npu_test.checksum(in sequence<octet> buf, rout uint32 crc)
  method 3, sc 0x03020100; primIn {u32 len(buf)}; primROut {u32 zlib.crc32(buf)}.
* npu_test.busy(in uint32 microseconds)
  method 4, sc 0x04010000; primIn {u32 us}; blocks that long; a subsystem
  restart interrupts it and the invoke fails with EPIPE.

Every method checks the counts in ``sc`` and that the lengths announced in
primIn equal the buffers it got; any mismatch is AEE_EBADPARM. An unknown
method is AEE_EUNSUPPORTED.
"""

from __future__ import annotations

import abc
import dataclasses
import struct
import zlib
from collections.abc import Callable, Mapping, Sequence
from types import MappingProxyType
from typing import ClassVar, Final

from npu_protocol.aee import AEE
from npud.sim.layout import decode_scalars

DOMAIN_METHOD_OFFSET: Final = 2
"""remote_handle64 interfaces number user methods from 2 (0 = open, 1 = close)."""

ESCAPE_METHOD: Final = 31
"""qaic's escape for interfaces with more than 31 methods (the id is then in primIn)."""


class BadParameterError(Exception):
    """Marshalled arguments that do not match the method: AEE_EBADPARM."""


class SkelCall:
    """One invocation as a skel sees it: buffers in qaic order and a way to wait."""

    __slots__ = ("_sleep", "inputs", "outputs", "sc")

    def __init__(
        self,
        sc: int,
        inputs: Sequence[memoryview],
        outputs: Sequence[memoryview],
        sleep: Callable[[float], None],
    ) -> None:
        self.sc = sc
        self.inputs = inputs
        self.outputs = outputs
        self._sleep = sleep

    def sleep(self, seconds: float) -> None:
        """Block; a subsystem restart interrupts it (the invoke then fails with EPIPE)."""
        self._sleep(seconds)

    def prim_in(self, layout: struct.Struct) -> tuple[int, ...]:
        """Unpack primIn (input buffer 0), which must have exactly ``layout.size`` bytes."""
        return _unpack_exact(self.inputs[0], layout, "primIn")


def _unpack_exact(view: memoryview, layout: struct.Struct, what: str) -> tuple[int, ...]:
    if len(view) != layout.size:
        raise BadParameterError(f"{what} has {len(view)} bytes, expected {layout.size}")
    return layout.unpack(view)


def _expect_length(view: memoryview, announced: int, what: str) -> None:
    if len(view) != announced:
        raise BadParameterError(
            f"{what}: primIn announces {announced} bytes, buffer has {len(view)}"
        )


SkelMethodHandler = Callable[[SkelCall], int]


@dataclasses.dataclass(frozen=True)
class SkelMethod:
    """One user method: its buffer counts (primIn/primROut included) and its body."""

    name: str
    inbufs: int
    outbufs: int
    handler: SkelMethodHandler


class Skel(abc.ABC):
    """Base of the Python skels; one instance per open remote handle."""

    name: ClassVar[str]

    @abc.abstractmethod
    def methods(self) -> Mapping[int, SkelMethod]:
        """User methods numbered from 0 (the domain offset is added by the caller)."""

    def close(self) -> None:  # noqa: B027 - an optional hook; stateless skels keep it empty
        """The handle is being closed (remotectl close, process exit or teardown)."""


SkelFactory = Callable[[], Skel]

_U32: Final = struct.Struct("<I")
_U32_PAIR: Final = struct.Struct("<II")


class EchoSkel(Skel):
    """``interface echo : remote_handle64``: one method, echo (see idl/echo.idl)."""

    name = "echo"

    def methods(self) -> Mapping[int, SkelMethod]:
        return {0: SkelMethod("echo", inbufs=2, outbufs=1, handler=self._echo)}

    @staticmethod
    def _echo(call: SkelCall) -> int:
        in_len, capacity = call.prim_in(_U32_PAIR)
        source, target = call.inputs[1], call.outputs[0]
        _expect_length(source, in_len, "in_buf")
        _expect_length(target, capacity, "out_buf")
        count = min(in_len, capacity)
        target[:count] = source[:count]
        target[count:] = bytes(capacity - count)
        return 0


class NpuTestSkel(Skel):
    """Test methods for the daemon: fill, checksum and busy (see the module docstring)."""

    name = "npu_test"

    def methods(self) -> Mapping[int, SkelMethod]:
        return {
            0: SkelMethod("fill", inbufs=1, outbufs=1, handler=self._fill),
            1: SkelMethod("checksum", inbufs=2, outbufs=1, handler=self._checksum),
            2: SkelMethod("busy", inbufs=1, outbufs=0, handler=self._busy),
        }

    @staticmethod
    def _fill(call: SkelCall) -> int:
        seed, capacity = call.prim_in(_U32_PAIR)
        target = call.outputs[0]
        _expect_length(target, capacity, "buf")
        start = seed & 0xFF
        cycle = bytes(range(start, 256)) + bytes(range(start))
        target[:] = (cycle * (capacity // 256 + 1))[:capacity]
        return 0

    @staticmethod
    def _checksum(call: SkelCall) -> int:
        (length,) = call.prim_in(_U32)
        source = call.inputs[1]
        _expect_length(source, length, "buf")
        if len(call.outputs[0]) != _U32.size:
            raise BadParameterError("primROut must hold one u32")
        call.outputs[0][:] = _U32.pack(zlib.crc32(source))
        return 0

    @staticmethod
    def _busy(call: SkelCall) -> int:
        (microseconds,) = call.prim_in(_U32)
        call.sleep(microseconds / 1_000_000)
        return 0


BUILTIN_SKELS: Final[Mapping[str, SkelFactory]] = MappingProxyType(
    {EchoSkel.name: EchoSkel, NpuTestSkel.name: NpuTestSkel}
)


def run_method(skel: Skel, method_offset: int, call: SkelCall) -> int:
    """Dispatch ``call`` to ``skel`` like a qaic ``*_skel_invoke`` would; returns the AEE result."""
    scalars = decode_scalars(call.sc)
    if scalars.method == ESCAPE_METHOD:
        return AEE.EUNSUPPORTED.dsp  # no simulated interface has more than 31 methods
    method = skel.methods().get(scalars.method - method_offset)
    if method is None:
        return AEE.EUNSUPPORTED.dsp
    if scalars.counts != (method.inbufs, method.outbufs, 0, 0):
        return AEE.EBADPARM.dsp
    try:
        return method.handler(call)
    except BadParameterError:
        return AEE.EBADPARM.dsp
