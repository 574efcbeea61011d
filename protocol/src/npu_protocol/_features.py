"""What each protocol version brought, by name: the one table both sides consult.

A peer asks ``speaks(version, Feature.GRAPHS)`` instead of comparing version
numbers, so the rule "a feature is used only when both sides speak its version"
(PROTOCOL.md section 12) is written once, and a reader sees which feature a
check is about. Several features can come with one version.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from typing import Final


class Feature(enum.Enum):
    """A protocol feature; its value is its name (the version is in :data:`SINCE`)."""

    DEADLINES = "deadlines"
    """``invoke.deadline_ms`` and ``hello.budget`` (PROTOCOL.md section 8)."""
    MODELS = "models"
    """The ``model_*`` and ``debug`` messages (section 7.9)."""
    FREED_MEMORY_REUSED = "freed_memory_reused"
    """A client closes its fd and mapping once ``free`` is answered, so what it frees
    may go to the buffer pool and its next holder (section 7.2, Reuse)."""
    BUFFERS_OUTLIVE_RESTARTS = "buffers_outlive_restarts"
    """A restart of the DSP process leaves the connection's buffers; only their DSP
    mappings end."""
    LIBCDSPRPC = "libcdsprpc"
    """What a libcdsprpc-compatible client needs: ``hello.isolate``,
    ``alloc_reply.dsp_fd``, ``map.flags``, ``invoke.wait`` and the Welcome's own pool."""
    GRAPHS = "graphs"
    """A model's graphs: ``ModelInfo.graphs`` and ``model_run.graph``."""
    DOMAIN_LANES = "domain_lanes"
    """Each domain's lanes in its ``DomainRow.lanes``; the status's ``lanes`` holds the
    daemon's own (section 7.5, Lanes)."""
    CHAIN = "chain"
    """The ``model_chain`` request (section 7.10)."""


SINCE: Final[Mapping[Feature, int]] = {
    Feature.DEADLINES: 2,
    Feature.MODELS: 2,
    Feature.FREED_MEMORY_REUSED: 2,
    Feature.BUFFERS_OUTLIVE_RESTARTS: 3,
    Feature.LIBCDSPRPC: 4,
    Feature.GRAPHS: 5,
    Feature.DOMAIN_LANES: 6,
    Feature.CHAIN: 7,
}
"""The protocol version that brought each feature (PROTOCOL.md section 12)."""


def speaks(version: int, feature: Feature) -> bool:
    """Whether a connection at protocol ``version`` may use ``feature``."""
    return version >= SINCE[feature]
