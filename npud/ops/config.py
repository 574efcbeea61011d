"""npud's configuration: a TOML file decoded into msgspec Structs.

Unknown keys and bad values are refused with the key's path in the message
(``unknown key daemon.sockt (did you mean socket?)``: config_errors). Keys
renamed since the last release are still accepted with a warning
(config_renames). Every key has a default, so an empty file (or none) is a valid
configuration; ``config/npud.toml`` lists them all.

The sections' Structs live by concern (config_daemon, config_limits,
config_scheduler, config_emulator, config_domains, on the value types of
config_values); this module assembles them into :class:`Config`, reads and
checks the file, and re-exports their names.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Final

import msgspec

from npud.ops.config_daemon import (
    DEFAULT_KERNEL_LIBRARY_PATH,
    DEFAULT_KERNEL_PUBLIC_KEY,
    DEFAULT_KERNEL_SHELL,
    DEFAULT_SOCKET,
    AccessConfig,
    Backend,
    BackendConfig,
    DaemonConfig,
    LogFormat,
    LogLevel,
    ShellConfig,
)
from npud.ops.config_domains import (
    DEFAULT_DOMAIN,
    DEFAULT_REOPEN_AT_INTERRUPTED_CONTEXTS,
    X1E_COMPUTE_CONTEXT_BANKS,
    DomainName,
    DomainRuleConfig,
    DomainsConfig,
    DomainShare,
)
from npud.ops.config_emulator import EmulatorConfig
from npud.ops.config_errors import explain
from npud.ops.config_limits import (
    MAX_BUFFER_SIZE,
    MAX_TIMEOUT_MS,
    ClientLimitsConfig,
    DaemonLimitsConfig,
    PoolConfig,
    PoolShare,
    UidLimitsConfig,
)
from npud.ops.config_renames import RenameConflictError, apply_renames
from npud.ops.config_scheduler import SchedulerConfig

__all__ = [
    "DEFAULT_CONFIG",
    "DEFAULT_DOMAIN",
    "DEFAULT_KERNEL_LIBRARY_PATH",
    "DEFAULT_KERNEL_PUBLIC_KEY",
    "DEFAULT_KERNEL_SHELL",
    "DEFAULT_REOPEN_AT_INTERRUPTED_CONTEXTS",
    "DEFAULT_SOCKET",
    "MAX_BUFFER_SIZE",
    "MAX_TIMEOUT_MS",
    "X1E_COMPUTE_CONTEXT_BANKS",
    "AccessConfig",
    "Backend",
    "BackendConfig",
    "ClientLimitsConfig",
    "Config",
    "ConfigError",
    "DaemonConfig",
    "DaemonLimitsConfig",
    "DomainName",
    "DomainRuleConfig",
    "DomainShare",
    "DomainsConfig",
    "EmulatorConfig",
    "LogFormat",
    "LogLevel",
    "PoolConfig",
    "PoolShare",
    "SchedulerConfig",
    "ShellConfig",
    "UidLimitsConfig",
    "Warn",
    "load_config",
    "parse_config",
    "warn_on_stderr",
]

DEFAULT_CONFIG: Final = "/etc/npud/npud.toml"


class Config(msgspec.Struct, forbid_unknown_fields=True, frozen=True, kw_only=True):
    """npud's configuration: one TOML table per section below."""

    daemon: DaemonConfig = msgspec.field(default_factory=DaemonConfig)
    backend: BackendConfig = msgspec.field(default_factory=BackendConfig)
    shell: ShellConfig = msgspec.field(default_factory=ShellConfig)
    access: AccessConfig = msgspec.field(default_factory=AccessConfig)
    client_limits: ClientLimitsConfig = msgspec.field(default_factory=ClientLimitsConfig)
    limits: DaemonLimitsConfig = msgspec.field(default_factory=DaemonLimitsConfig)
    uid_limits: UidLimitsConfig = msgspec.field(default_factory=UidLimitsConfig)
    scheduler: SchedulerConfig = msgspec.field(default_factory=SchedulerConfig)
    emulator: EmulatorConfig = msgspec.field(default_factory=EmulatorConfig)
    pool: PoolConfig = msgspec.field(default_factory=PoolConfig)
    domains: DomainsConfig = msgspec.field(default_factory=DomainsConfig)


class ConfigError(Exception):
    """The configuration cannot be used; the message names the file and the key."""


Warn = Callable[[str], None]
"""Where the lines about renamed keys go (config_renames): each names the new key."""


def warn_on_stderr(line: str) -> None:
    print(f"npud: warning: {line}", file=sys.stderr)


def parse_config(text: str, *, source: str = "<config>", warn: Warn = warn_on_stderr) -> Config:
    """``text`` as a Config; old key names are moved to their new ones, with a ``warn``
    line each (prefixed with ``source``)."""
    try:
        raw = msgspec.toml.decode(text)
    except msgspec.DecodeError as exc:
        raise ConfigError(f"{source}: not valid TOML: {exc}") from None
    try:
        apply_renames(raw, lambda line: warn(f"{source}: {line}"))
        return msgspec.convert(raw, type=Config)
    except RenameConflictError as exc:
        raise ConfigError(f"{source}: {exc}") from None
    except msgspec.ValidationError as exc:
        raise ConfigError(f"{source}: {explain(exc, Config)}") from None


def load_config(path: str | os.PathLike[str] | None, *, warn: Warn = warn_on_stderr) -> Config:
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
    return parse_config(text, source=str(path), warn=warn)
