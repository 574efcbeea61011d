"""The FastRPC scalars word, as far as the wire protocol needs it.

Layout (kernel FASTRPC_BUILD_SCALARS / userspace REMOTE_SCALARS_MAKEX): method
attributes in bits 29-31, method index 24-28, input buffers 16-23, output
buffers 8-15, input handles 4-7, output handles 0-3. The daemon builds the word
in one place, npud.idl.make_scalars (npud.fastrpc.kernel.abi and npud.sim call it); this
package keeps its own copy because it is pure and installs without the daemon, so
it cannot import npud. tests/protocol/test_messages.py and
tests/unit/test_idl_services.py check the copy against npud.idl's.
"""

from __future__ import annotations

from typing import NamedTuple


class Scalars(NamedTuple):
    attr: int
    method: int
    inbufs: int
    outbufs: int
    inhandles: int
    outhandles: int


def make_scalars(method: int, inbufs: int, outbufs: int) -> int:
    """REMOTE_SCALARS_MAKE: attributes and handle counts zero."""
    if not 0 <= method <= 0x1F or not 0 <= inbufs <= 0xFF or not 0 <= outbufs <= 0xFF:
        raise ValueError(f"scalars out of range: method {method}, in {inbufs}, out {outbufs}")
    return (method << 24) | (inbufs << 16) | (outbufs << 8)


def split_scalars(sc: int) -> Scalars:
    """Every field of a 32-bit scalars word."""
    return Scalars(
        attr=(sc >> 29) & 0x7,
        method=(sc >> 24) & 0x1F,
        inbufs=(sc >> 16) & 0xFF,
        outbufs=(sc >> 8) & 0xFF,
        inhandles=(sc >> 4) & 0xF,
        outhandles=sc & 0xF,
    )
