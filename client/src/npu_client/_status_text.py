"""``npuctl status`` for people: the DaemonStatus record as aligned text."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

from npu_protocol import (
    ClientRow,
    DaemonStatus,
    DomainRow,
    DspCapabilities,
    MemoryRow,
    PoolRow,
    ShellStatus,
    Totals,
)

_LABEL: Final = 12
_COLUMNS: Final = (
    "PID",
    "UID",
    "NAME",
    "PRIORITY",
    "DOMAIN",
    "BUFFERS",
    "BYTES",
    "MAPPINGS",
    "HANDLES",
    "IN FLIGHT",
    "DONE",
)


def render_status(status: DaemonStatus) -> str:
    """Every field of ``status``, one section per line, then a table of clients."""
    lines = [
        _line("daemon", f"npud {status.daemon_version}"),
        _line("uptime", format_duration(status.uptime_ms)),
        _line("backend", status.backend),
        _line("device", status.device),
        _line("shell", _shell(status.shell)),
        _line("session", f"epoch {status.epoch}, {_count(status.restarts, 'restart')}"),
        _line("totals", _totals(status.totals)),
        *([_line("memory", _memory(status.memory))] if status.memory is not None else []),
        *([_line("pool", _pool(status.pool))] if status.pool is not None else []),
        _line("dsp", status.dsp.domain),
        *_capabilities(status.dsp),
        "",
    ]
    if status.domains:
        lines += [_line("domains:", ""), *_domains(status.domains), *_suspended(status.domains), ""]
    if status.clients:
        lines.extend(_table(status.clients))
    else:
        lines.append(_line("clients", "none"))
    others = status.totals.clients - len(status.clients)
    if others > 0:  # npud shows a user only its own clients (root sees all)
        lines.append(f"(and {_count(others, 'client')} of other users, not shown)")
    models = _models(status.clients)
    if models:
        lines += ["", *models]
    return "\n".join(lines)


_MODEL_COLUMNS: Final = ("PID", "CLIENT", "MODEL", "NAME", "SIZE", "RUNS", "DSP")


def _models(clients: Sequence[ClientRow]) -> list[str]:
    """One line per loaded model: whose, its id and name, its bytes, runs and DSP time."""
    rows = [
        (
            str(row.pid),
            row.name,
            str(model.id),
            model.name or "-",
            format_bytes(model.bytes),
            str(model.runs),
            f"{model.dsp_us / 1e6:.3f} s",
        )
        for row in clients
        for model in row.models
    ]
    if not rows:
        return []
    widths = [max(len(c[i]) for c in [_MODEL_COLUMNS, *rows]) for i in range(len(_MODEL_COLUMNS))]
    return [
        "  ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)).rstrip()
        for cells in [_MODEL_COLUMNS, *rows]
    ]


def _line(label: str, value: str) -> str:
    return f"{label:<{_LABEL}}{value}"


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def _shell(shell: ShellStatus) -> str:
    text = "verified" if shell.verified else "NOT VERIFIED"
    if shell.path:
        text += f" {shell.path}"
    about = [f"sha256 {shell.sha256}"] if shell.sha256 else []
    if shell.detail:
        about.append(shell.detail)
    if not about:
        return text
    return f"{text} ({'; '.join(about)})" if shell.verified else f"{text}: {'; '.join(about)}"


def _totals(totals: Totals) -> str:
    return ", ".join(
        [
            _count(totals.clients, "client"),
            f"{_count(totals.buffers, 'buffer')} ({format_bytes(totals.bytes)})",
            _count(totals.mappings, "mapping"),
            _count(totals.handles, "handle"),
            f"{_count(totals.models, 'model')} ({format_bytes(totals.model_bytes)})",
            f"{totals.calls_in_flight} calls in flight",
            f"{totals.calls_done} calls done",
        ]
    )


def _pool(pool: PoolRow) -> str:
    if not pool.enabled:
        return "off"
    kept = f"{_count(pool.buffers, 'buffer')} kept ({format_bytes(pool.bytes)} of "
    return ", ".join(
        [
            kept + f"{format_bytes(pool.max_bytes)})",
            f"shared per {pool.share}",
            f"{pool.hits} hits",
            f"{pool.misses} misses",
        ]
    )


def _memory(memory: MemoryRow) -> str:
    source = "system DMA-BUF heap" if memory.source == "heap" else f"{memory.source} driver"
    return f"{_count(memory.buffers, 'buffer')} ({format_bytes(memory.bytes)}) from the {source}"


_DOMAIN_COLUMNS: Final = (
    "DOMAIN",
    "KIND",
    "STATE",
    "EPOCH",
    "RESTARTS",
    "HUNG",
    "CLIENTS",
    "MAPPED",
    "HANDLES",
    "MODELS",
    "IN FLIGHT",
    "UP",
)


def domain_kind(name: str, isolated: bool) -> str:
    """isolated (one connection's), user (the connections of the uid after its @), or
    shared (several users', or root's and npud's own user's)."""
    if isolated:
        return "isolated"
    return "user" if "@" in name else "shared"


def _domains(domains: Sequence[DomainRow]) -> list[str]:
    """One line per domain (DSP process): its name, its state and what it holds."""
    rows = [
        (
            row.name,
            domain_kind(row.name, row.isolated),
            row.state,
            str(row.epoch),
            str(row.restarts),
            str(row.hung_calls),
            str(row.clients),
            f"{row.mappings} ({format_bytes(row.mapped_bytes)})",
            str(row.remote_handles),
            str(row.models),
            str(row.invokes_in_flight),
            format_duration(row.uptime_ms),
        )
        for row in domains
    ]
    return _aligned(_DOMAIN_COLUMNS, rows)


def _suspended(domains: Sequence[DomainRow]) -> list[str]:
    """Domains whose calls system suspends interrupted: the kernel keeps a context for each
    until the session's fd closes, and npud reopens sessions before the CDSP runs out."""
    return [
        f"{row.name}: {_count(row.interrupted_contexts, 'call')} interrupted by suspends hold "
        f"contexts until the session closes; reopened {_count(row.suspend_reopens, 'time')} "
        "to free them"
        for row in domains
        if row.interrupted_contexts or row.suspend_reopens
    ]


def _aligned(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    widths = [max(len(cells[i]) for cells in [header, *rows]) for i in range(len(header))]
    return [
        "  ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)).rstrip()
        for cells in [header, *rows]
    ]


def _capabilities(dsp: DspCapabilities) -> list[str]:
    """Each capability the DSP reported, by its FastRPC attribute name."""
    lines = []
    for name in dsp.__struct_fields__:
        if name == "domain":
            continue
        value = getattr(dsp, name)
        shown = f"{value:#x} (v{value:x})" if name == "arch_ver" and value else str(value)
        lines.append(f"{'':<{_LABEL}}{name:<28}{shown}")
    return lines


def _table(clients: Sequence[ClientRow]) -> list[str]:
    rows = [
        (
            str(row.pid),
            str(row.uid),
            row.name,
            row.priority + (" (throttled)" if row.throttled else ""),
            row.domain or "-",
            str(row.buffers),
            format_bytes(row.bytes),
            str(row.mappings),
            str(row.handles),
            str(row.calls_in_flight),
            str(row.calls_done),
        )
        for row in clients
    ]
    widths = [max(len(cells[i]) for cells in [_COLUMNS, *rows]) for i in range(len(_COLUMNS))]
    return [
        "  ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)).rstrip()
        for cells in [_COLUMNS, *rows]
    ]


def format_bytes(count: int) -> str:
    """``1.5 MiB``; plain bytes below 1 KiB."""
    if count < 1024:
        return f"{count} B"
    units = ("KiB", "MiB", "GiB", "TiB")
    value, index = count / 1024, 0
    while value >= 1024 and index < len(units) - 1:
        value, index = value / 1024, index + 1
    return f"{value:.1f} {units[index]}"


def format_duration(milliseconds: int) -> str:
    """``2d 3h 04m 05s``, leaving out leading zero units."""
    seconds = milliseconds // 1000
    days, seconds = divmod(seconds, 86400)
    hours, seconds = divmod(seconds, 3600)
    minutes, seconds = divmod(seconds, 60)
    if days:
        return f"{days}d {hours}h {minutes:02d}m {seconds:02d}s"
    if hours:
        return f"{hours}h {minutes:02d}m {seconds:02d}s"
    if minutes:
        return f"{minutes}m {seconds:02d}s"
    return f"{seconds}s"
