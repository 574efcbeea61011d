"""Protocol errors: ours (refused before anything was sent) and the peer's (fatal).

Both carry a stable ErrorCode and the fields of its message template, so the
daemon can turn a RemoteProtocolError into ``ErrorMessage.for_code(exc.code,
**exc.fields)`` and close, and a client can report exactly what went wrong.
"""

from __future__ import annotations

from npu_protocol.errors import CodedError


class ProtocolError(CodedError):
    """A violation of the npud wire protocol."""


class LocalProtocolError(ProtocolError):
    """This side tried something the protocol forbids.

    Raised by ``send()`` before any state changes and before any byte is
    produced, so the connection is still usable.
    """


class RemoteProtocolError(ProtocolError):
    """The peer broke the protocol. Fatal: the connection is now in its ERROR
    state, ``next_event()`` raises this again, and the caller should close."""
