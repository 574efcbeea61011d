"""What npud does for each request: one handler class per request type, a module per
kind of object (buffers, skels, models, the daemon itself), and the table that maps
each request type to its handler, next to the protocol's ``REPLY_TYPES``.

The requests' own state lives beside them: the clients and their ids (``clients``),
what an id holds and how it is let go (``holdings``), models (``models``,
``model_check``, ``chains``).
"""

from __future__ import annotations

from typing import Any, Final

import npu_protocol as p
from npud.requests.buffer_requests import Alloc, Free, Map, Unmap
from npud.requests.daemon_requests import Debug, Ping, Status
from npud.requests.handler import Answer, Handler, Route
from npud.requests.model_requests import LoadModel, ModelInfo, RunChain, RunModel, UnloadModel
from npud.requests.skel_requests import Close, Invoke, Open

__all__ = ["HANDLERS", "Answer", "Handler", "Route"]

HANDLERS: Final[dict[type[p.Request], type[Handler[Any]]]] = {
    p.AllocRequest: Alloc,
    p.FreeRequest: Free,
    p.MapRequest: Map,
    p.UnmapRequest: Unmap,
    p.OpenRequest: Open,
    p.CloseRequest: Close,
    p.InvokeRequest: Invoke,
    p.ModelLoadRequest: LoadModel,
    p.ModelInfoRequest: ModelInfo,
    p.ModelRunRequest: RunModel,
    p.ModelUnloadRequest: UnloadModel,
    p.ModelChainRequest: RunChain,
    p.StatusRequest: Status,
    p.PingRequest: Ping,
    p.DebugRequest: Debug,
}
"""The handler of each request type; every type in ``p.REPLY_TYPES`` has one."""
