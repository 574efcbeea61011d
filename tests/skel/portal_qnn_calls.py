"""The portal_qnn RPC methods marshalled by the qaic rules (idl/portal_qnn.idl), over real remote_args."""

from __future__ import annotations

import dataclasses
from typing import Final

from tests.skel.remote_args import Out, Result, SkelLibrary, sc, u32s, unpack_u32s

MODEL_LOAD: Final = 2
SET_INPUT: Final = 3
EXECUTE: Final = 4
GET_OUTPUT: Final = 5
MODEL_UNLOAD: Final = 6

NO_MODEL: Final = 0xFFFFFFFF
UNTOUCHED_U32: Final = 0xA5A5A5A5
"""What a primROut slot reads when the skel did not write it (see remote_args.OUTPUT_FILL)."""


@dataclasses.dataclass(frozen=True)
class Loaded:
    rc: int
    model_index: int
    num_graphs: int
    qnn_status: int


@dataclasses.dataclass(frozen=True)
class Executed:
    rc: int
    qnn_status: int


@dataclasses.dataclass(frozen=True)
class Output:
    rc: int
    data_len: int
    data: bytes


class PortalQnn:
    """One open portal_qnn handle, driven through ``portal_qnn_skel_handle_invoke``."""

    def __init__(self, skel: SkelLibrary, handle: int) -> None:
        self.skel = skel
        self.handle = handle

    def invoke(self, scalars: int, slots: list[bytes | Out]) -> Result:
        return self.skel.invoke(self.handle, scalars, list(slots))

    def model_load(self, uri: str | bytes) -> Loaded:
        text = (uri.encode() if isinstance(uri, str) else uri) + b"\0"
        result = self.invoke(sc(MODEL_LOAD, 2, 1), [u32s(len(text)), text, Out(12)])
        index, graphs, status = unpack_u32s(result.buffers[2])
        return Loaded(result.rc, index, graphs, status)

    def set_input(self, model: int, graph: int, tensor: int, data: bytes) -> int:
        slots: list[bytes | Out] = [u32s(model, graph, tensor, len(data)), data]
        return self.invoke(sc(SET_INPUT, 2, 0), slots).rc

    def execute(self, model: int, graph: int) -> Executed:
        result = self.invoke(sc(EXECUTE, 1, 1), [u32s(model, graph), Out(4)])
        (status,) = unpack_u32s(result.buffers[1])
        return Executed(result.rc, status)

    def get_output(self, model: int, graph: int, tensor: int, capacity: int) -> Output:
        slots: list[bytes | Out] = [u32s(model, graph, tensor, capacity), Out(4), Out(capacity)]
        result = self.invoke(sc(GET_OUTPUT, 1, 2), slots)
        (data_len,) = unpack_u32s(result.buffers[1])
        data = result.buffers[2]
        assert data is not None
        return Output(result.rc, data_len, data)

    def model_unload(self, model: int) -> int:
        return self.invoke(sc(MODEL_UNLOAD, 1, 0), [u32s(model)]).rc
