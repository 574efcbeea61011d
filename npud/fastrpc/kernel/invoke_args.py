"""The arguments of one INVOKE, as callers of FastRpcSession describe them.

Inputs are inline bytes or a slice of a session-owned DMA-BUF; outputs are
an inline capacity or a slice. Inline data travels with fd -1 (the kernel
copies it); slices pass the buffer's fd and a pointer inside its host
mapping (the DSP shares the memory).
"""

from __future__ import annotations

from dataclasses import dataclass

from npud.fastrpc.kernel.dma import DmaBuffer


@dataclass(frozen=True, slots=True)
class Inline:
    data: bytes


@dataclass(frozen=True, slots=True)
class Capacity:
    size: int


@dataclass(frozen=True, slots=True)
class Slice:
    buffer: DmaBuffer
    offset: int
    length: int


InArg = Inline | Slice
OutArg = Capacity | Slice


@dataclass(frozen=True, slots=True)
class InvokeResult:
    """The DSP's result code and, per output argument, its bytes (None for slices);
    ``dsp_seconds``: the DSP time the DSP reported with its answer (``Driver.dsp_report``;
    None, as always on a device, when it reported none)."""

    rc: int
    outputs: tuple[bytes | None, ...]
    dsp_seconds: float | None = None

    def output(self, index: int) -> bytes:
        data = self.outputs[index]
        if data is None:
            raise TypeError(f"output {index} is a buffer slice; read the buffer")
        return data
