"""The value types npud.toml's keys share, and the description every key carries
(npud.toml(5) is generated from them: scripts/generate_docs.py)."""

from __future__ import annotations

from typing import Annotated

import msgspec

Count = Annotated[int, msgspec.Meta(ge=0, le=1_000_000)]
Bytes = Annotated[int, msgspec.Meta(ge=0, le=1 << 40)]
Seconds = Annotated[float, msgspec.Meta(ge=0, le=3600)]
Id = Annotated[int, msgspec.Meta(ge=0, le=0xFFFFFFFF)]


def doc(text: str) -> msgspec.Meta:
    """A key's description: npud.toml(5) is generated from these (scripts/generate_docs.py)."""
    return msgspec.Meta(description=text)
