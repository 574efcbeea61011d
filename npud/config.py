"""npud's configuration: a TOML file decoded into msgspec Structs.

Unknown keys and bad values are refused with the key's path in the message
(``Object contains unknown field `sockt` - at `$.daemon```). Every key has a
default, so an empty file (or none) is a valid configuration; ``config/npud.toml``
lists them all.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, Final, Literal

import msgspec

from npud.fastrpc import abi

DEFAULT_SOCKET: Final = "/run/npud/npud.sock"
DEFAULT_CONFIG: Final = "/etc/npud/npud.toml"
DEFAULT_KERNEL_SHELL: Final = "/usr/lib/dsp/cdsp/fastrpc_shell_unsigned_3"
DEFAULT_KERNEL_PUBLIC_KEY: Final = "/etc/npud/shell-signing.pub"
DEFAULT_KERNEL_LIBRARY_PATH: Final = ("/usr/lib/dsp/cdsp", "/usr/lib/dsp", "/usr/lib/rfsa/adsp")

Backend = Literal["auto", "kernel", "emulator"]
LogFormat = Literal["auto", "json", "console"]
LogLevel = Literal["debug", "info", "warning", "error"]

_Count = Annotated[int, msgspec.Meta(ge=0, le=1_000_000)]
_Bytes = Annotated[int, msgspec.Meta(ge=0, le=1 << 40)]
_Seconds = Annotated[float, msgspec.Meta(ge=0, le=3600)]
_Id = Annotated[int, msgspec.Meta(ge=0, le=0xFFFFFFFF)]


class DaemonConfig(msgspec.Struct, forbid_unknown_fields=True, frozen=True, kw_only=True):
    socket: str = DEFAULT_SOCKET
    socket_mode: Annotated[str, msgspec.Meta(pattern=r"^0?[0-7]{3}$")] = "0660"
    socket_group: str = ""
    """Group that owns the socket; empty keeps the daemon's own group."""
    log_format: LogFormat = "auto"
    log_level: LogLevel = "info"
    shutdown_grace: _Seconds = 10.0
    """How long calls already on the DSP may take to finish at shutdown."""

    @property
    def socket_mode_bits(self) -> int:
        return int(self.socket_mode, 8)


class BackendConfig(msgspec.Struct, forbid_unknown_fields=True, frozen=True, kw_only=True):
    kind: Backend = "auto"
    nodes: tuple[str, ...] = abi.CDSP_NODES
    library_path: tuple[str, ...] = ()
    """DSP library search path served to the DSP. Empty: the profile's default."""
    lanes: Annotated[int, msgspec.Meta(ge=1, le=16)] = 2
    """Invoke lanes for normal and background work (realtime has its own)."""


class ShellConfig(msgspec.Struct, forbid_unknown_fields=True, frozen=True, kw_only=True):
    path: str = ""
    """The DSP shell. Empty: the profile's default (the development shell on the emulator)."""
    public_key: str = ""
    """File with the Ed25519 public key (64 hex chars or PEM). Empty: the profile's default."""
    trusted_uids: tuple[_Id, ...] = (0,)
    """Owners allowed for the shell and its .sha256/.sig files."""


class AccessConfig(msgspec.Struct, forbid_unknown_fields=True, frozen=True, kw_only=True):
    allow_uids: tuple[_Id, ...] = ()
    allow_gids: tuple[_Id, ...] = ()
    """Peers allowed to connect, by SO_PEERCRED. Root and the daemon's own uid always are."""
    realtime_uids: tuple[_Id, ...] = ()
    realtime_gids: tuple[_Id, ...] = ()
    """Who may be granted the realtime class. Both empty: every allowed peer may."""


MAX_TIMEOUT_MS: Final = 600_000
"""The ``max_timeout_ms`` every Welcome announces."""


class ClientLimitsConfig(msgspec.Struct, forbid_unknown_fields=True, frozen=True, kw_only=True):
    """``[client_limits]``: what one connection may hold (announced in its Welcome)."""

    max_buffers: _Count = 256
    max_buffer_bytes: _Bytes = 1 << 30
    max_handles: _Count = 32
    max_calls_in_flight: Annotated[int, msgspec.Meta(ge=1, le=0xFFFF)] = 16
    """Requests a client may have unanswered; invokes beyond it are refused."""
    default_timeout_ms: Annotated[int, msgspec.Meta(ge=0, le=MAX_TIMEOUT_MS)] = 0
    """The timeout of invokes that carry none, announced in the Welcome; 0 waits for
    the DSP. At most the largest timeout a client may ask for (600000)."""


class DaemonLimitsConfig(msgspec.Struct, forbid_unknown_fields=True, frozen=True, kw_only=True):
    """``[limits]``: what all connections together may hold."""

    max_clients: _Count = 64
    max_buffers: _Count = 4096
    max_buffer_bytes: _Bytes = 4 << 30


class Config(msgspec.Struct, forbid_unknown_fields=True, frozen=True, kw_only=True):
    daemon: DaemonConfig = msgspec.field(default_factory=DaemonConfig)
    backend: BackendConfig = msgspec.field(default_factory=BackendConfig)
    shell: ShellConfig = msgspec.field(default_factory=ShellConfig)
    access: AccessConfig = msgspec.field(default_factory=AccessConfig)
    client_limits: ClientLimitsConfig = msgspec.field(default_factory=ClientLimitsConfig)
    limits: DaemonLimitsConfig = msgspec.field(default_factory=DaemonLimitsConfig)


class ConfigError(Exception):
    """The configuration cannot be used; the message names the file and the key."""


def parse_config(text: str, *, source: str = "<config>") -> Config:
    try:
        return msgspec.toml.decode(text, type=Config)
    except msgspec.ValidationError as exc:
        raise ConfigError(f"{source}: {exc}") from None
    except msgspec.DecodeError as exc:
        raise ConfigError(f"{source}: not valid TOML: {exc}") from None


def load_config(path: str | os.PathLike[str] | None) -> Config:
    """Read ``path``; None means the default file if it exists, else all defaults."""
    if path is None:
        default = Path(DEFAULT_CONFIG)
        if not default.exists():
            return Config()
        path = default
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{path}: not UTF-8 text") from None
    return parse_config(text, source=str(path))
