"""What a session reports of itself (FastRpcSession.statistics)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class SessionStatistics:
    device: str
    shell_loaded: bool
    dead: bool
    buffers: int
    buffer_bytes: int
    mapped_buffers: int
    remote_handles: int
    invokes_in_flight: int
    invokes_done: int
    listener_running: bool
    listener_requests: int
    listener_stopped_because: str
    stale_fds: int = 0
    """DMA-BUF fds kept open because their MEM_UNMAP failed (see the module docstring)."""
    remotectl: str = ""
    """The remotectl interface the DSP answered on (remotectl1 or remotectl), once known."""
    listener: str = ""
    """The listener interface the DSP answered on (adsp_listener1 or adsp_listener)."""
    refused_paths: int = 0
    """Files the DSP asked for outside the library directories (apps_std refused them)."""
    listener_retries: int = 0
    """next2 calls the listener sent again after a failure (libcdsprpc's one retry)."""
    interrupted_contexts: int = 0
    """INVOKEs of this fd that a system suspend interrupted while they waited for the DSP:
    mainline keeps each one's context (one of the channel's 255) until the fd closes."""
