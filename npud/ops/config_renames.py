"""Settings that were renamed, still accepted under their old names for one release.

Every duration is now in seconds with an ``_s`` suffix (``shutdown_grace_s``,
``background_wait_s``). Before, some keys had no unit in the name (seconds), one
ended in ``_seconds``, and some were milliseconds (``_ms``) or microseconds
(``_us``). A file that still uses an old name works: the value is moved to the new
key, converted to seconds, and a warning names the new key.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

REFUSED_FROM: Final = "0.3"
"""The release that stops accepting the old names."""


@dataclass(frozen=True)
class Rename:
    section: str
    old: str
    new: str
    scale: float = 1.0
    """What the old value is multiplied by to give the new one (1e-3 for milliseconds)."""


RENAMES: Final = (
    Rename("daemon", "shutdown_grace", "shutdown_grace_s"),
    Rename("daemon", "hello_timeout", "hello_timeout_s"),
    Rename("daemon", "frame_timeout", "frame_timeout_s"),
    Rename("daemon", "call_watchdog", "call_watchdog_s"),
    Rename("daemon", "hung_call_throttle_seconds", "hung_call_throttle_s"),
    Rename("daemon", "log_summary_interval", "log_summary_interval_s"),
    Rename("client_limits", "default_timeout_ms", "default_timeout_s", 1e-3),
    Rename("scheduler", "background_wait_ms", "background_wait_s", 1e-3),
    Rename("scheduler", "realtime_default_budget_us", "realtime_default_budget_s", 1e-6),
    Rename("scheduler", "realtime_default_period_us", "realtime_default_period_s", 1e-6),
    Rename("pool", "idle_seconds", "idle_s"),
)


class RenameConflictError(ValueError):
    """A file sets a key under both its old and its new name."""


def apply_renames(raw: dict[str, Any], warn: Callable[[str], None]) -> None:
    """Move old keys of ``raw`` (a decoded TOML document) to their new names, in place,
    calling ``warn`` once for each with a line that names the new key."""
    for rename in RENAMES:
        section = raw.get(rename.section)
        if not isinstance(section, dict) or rename.old not in section:
            continue
        old, new = f"{rename.section}.{rename.old}", f"{rename.section}.{rename.new}"
        if rename.new in section:
            raise RenameConflictError(f"{old} and {new} are the same setting: keep only {new}")
        value = section.pop(rename.old)
        unit = ""
        if rename.scale != 1.0 and isinstance(value, (int, float)) and not isinstance(value, bool):
            value = _scaled(value, rename.scale)
            unit = f", in seconds ({rename.new} = {value!r})"
        section[rename.new] = value
        warn(f"{old} is now {new}{unit}: rename it; npud {REFUSED_FROM} will refuse the old name")


def _scaled(value: float, scale: float) -> float:
    # round(): 500 ms is 0.5 s, not 0.5000000000000001.
    return round(value * scale, 9)
