"""Every op the emulated htp runs, by op code (:mod:`npud.sim.htp.layout` ``Op``).

What is not here answers NO_SUPPORT (status 3) with a log line naming it:
SSM_CONV, SOLVE_TRI, GATED_DELTA_NET, IM2COL, ALLREDUCE, ALLREDUCE_ADD, and any code
past the enum; so does an op on a type the emulator does not decode (the K-quants
q4_K, q5_K, q6_K, repacked or not).
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Final

from npud.sim.htp import (
    ops_attention,
    ops_elementwise,
    ops_matmul,
    ops_norm,
    ops_rope,
    ops_rows,
    ops_sync,
)
from npud.sim.htp.layout import Op
from npud.sim.htp.opcall import OpFunction

OPS: Final[Mapping[Op, OpFunction]] = MappingProxyType(
    {
        **ops_elementwise.FUNCTIONS,
        **ops_norm.FUNCTIONS,
        **ops_attention.FUNCTIONS,
        **ops_rope.FUNCTIONS,
        **ops_rows.FUNCTIONS,
        **ops_matmul.FUNCTIONS,
        **ops_sync.FUNCTIONS,
    }
)

NOT_EMULATED: Final = frozenset(op for op in Op if op not in OPS and op is not Op.INVALID)
"""Op codes that answer NO_SUPPORT."""
