"""``npuctl top``: who uses the NPU, refreshed every second, in 80 columns.

Each frame compares two status records taken ``interval`` apart: calls per
second and the share of DSP time are rates over that interval; queue waits are
the daemon's recent percentiles (the 99th in the table, both in ``--json``);
misses and late calls are totals. Each client's domain (its DSP process) is a
column, and each domain a line below the clients. The view
is plain text (a terminal's own scrolling and copy work), redrawn in place
when stdout is a terminal; ``--json`` gives the same rows as one JSON object
per frame for scripts.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Final, Literal

import msgspec

from npu_protocol import ClientRow, DaemonStatus

WIDTH: Final = 80
SortKey = Literal["dsp", "calls", "wait", "pid", "name"]
SORT_KEYS: Final[tuple[SortKey, ...]] = ("dsp", "calls", "wait", "pid", "name")
CLASS_LETTERS: Final = {"realtime": "RT", "normal": "N", "background": "BG"}


class TopRow(msgspec.Struct, frozen=True, kw_only=True):
    """One client over the last interval."""

    pid: int
    name: str
    priority: str
    domain: str = ""
    """The domain (DSP process) its calls run in."""
    calls_per_s: float
    dsp_pct: float
    """Share of the interval its calls were on the DSP, percent of one slot."""
    wait_p50_ms: float
    wait_p99_ms: float
    queued: int
    running: int
    misses: int
    late: int
    budget_ms: float
    period_ms: float


class TopDomain(msgspec.Struct, frozen=True, kw_only=True):
    """One domain (DSP process) now."""

    name: str
    isolated: bool
    state: str
    epoch: int
    restarts: int
    clients: int
    mapped_bytes: int
    models: int


class TopFrame(msgspec.Struct, frozen=True, kw_only=True):
    """What one refresh shows (``npuctl top --json`` prints these)."""

    interval_s: float
    daemon_version: str
    backend: str
    epoch: int
    mode: str
    dsp_slots: int
    utilisation_pct: int
    realtime_declared_pct: int
    queued: tuple[int, int, int]
    running: tuple[int, int, int]
    rows: tuple[TopRow, ...]
    domains: tuple[TopDomain, ...] = ()


@dataclass(frozen=True)
class Sample:
    status: DaemonStatus
    at: float
    """When it was taken, on the monotonic clock."""


def frame(
    before: Sample, after: Sample, *, sort: SortKey = "dsp", exclude: tuple[int, str] | None = None
) -> TopFrame:
    """The frame for the interval between two samples (rows of clients in both, or new)."""
    elapsed = max(after.at - before.at, 1e-6)
    previous = {(row.pid, row.name): row for row in before.status.clients}
    rows = [
        _row(row, previous.get((row.pid, row.name)), elapsed)
        for row in after.status.clients
        if (row.pid, row.name) != exclude
    ]
    rows.sort(key=_sort_key(sort))
    scheduler = after.status.scheduler
    return TopFrame(
        interval_s=round(elapsed, 3),
        daemon_version=after.status.daemon_version,
        backend=after.status.backend,
        epoch=after.status.epoch,
        mode=scheduler.mode if scheduler else "?",
        dsp_slots=scheduler.dsp_slots if scheduler else 0,
        utilisation_pct=scheduler.utilisation_pct if scheduler else 0,
        realtime_declared_pct=scheduler.realtime_declared_pct if scheduler else 0,
        queued=(
            (scheduler.queued_realtime, scheduler.queued_normal, scheduler.queued_background)
            if scheduler
            else (0, 0, 0)
        ),
        running=(
            (scheduler.running_realtime, scheduler.running_normal, scheduler.running_background)
            if scheduler
            else (0, 0, 0)
        ),
        rows=tuple(rows),
        domains=tuple(
            TopDomain(
                name=d.name,
                isolated=d.isolated,
                state=d.state,
                epoch=d.epoch,
                restarts=d.restarts,
                clients=d.clients,
                mapped_bytes=d.mapped_bytes,
                models=d.models,
            )
            for d in after.status.domains
        ),
    )


def _row(now: ClientRow, then: ClientRow | None, elapsed: float) -> TopRow:
    calls = now.calls_done - (then.calls_done if then else 0)
    dsp_us = now.dsp_us - (then.dsp_us if then else 0)
    return TopRow(
        pid=now.pid,
        name=now.name,
        priority=now.priority,
        domain=now.domain,
        calls_per_s=round(max(calls, 0) / elapsed, 1),
        dsp_pct=round(max(dsp_us, 0) / 1e6 / elapsed * 100, 1),
        wait_p50_ms=now.wait_p50_us / 1000,
        wait_p99_ms=now.wait_p99_us / 1000,
        queued=now.queued,
        running=now.running,
        misses=now.misses,
        late=now.late,
        budget_ms=now.budget_us / 1000,
        period_ms=now.budget_period_us / 1000,
    )


def _sort_key(sort: SortKey) -> Callable[[TopRow], tuple[float | int | str, ...]]:
    keys: dict[SortKey, Callable[[TopRow], tuple[float | int | str, ...]]] = {
        "dsp": lambda r: (-r.dsp_pct, -r.calls_per_s, r.pid),
        "calls": lambda r: (-r.calls_per_s, -r.dsp_pct, r.pid),
        "wait": lambda r: (-r.wait_p99_ms, r.pid),
        "pid": lambda r: (r.pid, r.name),
        "name": lambda r: (r.name, r.pid),
    }
    return keys[sort]


# --- text -----------------------------------------------------------------------------------

_HEADER: Final = (
    f"{'PID':>7} {'NAME':<11} {'DOMAIN':<8} {'CL':<2} {'CALLS/S':>7} {'DSP%':>5} "
    f"{'WAIT99':>7} {'Q/R':>5} {'MISS':>4} {'LATE':>4} {'BUDGET':>7}"
)


def render(top: TopFrame) -> str:
    """The frame as at most 80-column lines."""
    queued, running = top.queued, top.running
    # Two DSP figures, each saying what it measures: the daemon's, of all its slots over
    # its own 10 s window; the rows', each of one slot over this frame's interval.
    shown = sum(row.dsp_pct for row in top.rows)
    lines = [
        _clip(
            f"npud {top.daemon_version} ({top.backend}, epoch {top.epoch}) - {top.mode} - "
            f"realtime budgets {top.realtime_declared_pct}%"
        ),
        _clip(
            f"DSP busy {top.utilisation_pct}% of {top.dsp_slots} slots (10 s); "
            f"rows' DSP% of 1 slot, {top.interval_s:g} s: {shown:.1f}% in all"
        ),
        _clip(
            f"queued rt/n/bg {queued[0]}/{queued[1]}/{queued[2]}   "
            f"running rt/n/bg {running[0]}/{running[1]}/{running[2]}"
        ),
        "",
        _HEADER,
    ]
    for row in top.rows:
        budget = f"{row.budget_ms:g}/{row.period_ms:g}" if row.period_ms else "-"
        lines.append(
            _clip(
                f"{row.pid:>7} {row.name[:11]:<11} {(row.domain or '-')[:8]:<8} "
                f"{CLASS_LETTERS.get(row.priority, '?'):<2} "
                f"{row.calls_per_s:>7.1f} {row.dsp_pct:>5.1f} "
                f"{_ms(row.wait_p99_ms):>7} {f'{row.queued}/{row.running}':>5} "
                f"{_count(row.misses):>4} {_count(row.late):>4} {budget:>7}"
            )
        )
    if not top.rows:
        lines.append("(no clients)")
    if top.domains:
        lines.append("")
        for domain in top.domains:
            kind = "isolated" if domain.isolated else "shared"
            lines.append(
                _clip(
                    f"domain {domain.name} ({kind}): {domain.state}, epoch {domain.epoch}, "
                    f"{domain.restarts} restarts, {domain.clients} clients, "
                    f"{_bytes(domain.mapped_bytes)} mapped, {domain.models} models"
                )
            )
    return "\n".join(lines)


def _bytes(count: int) -> str:
    value, unit = float(count), "B"
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            break
        value /= 1024
    return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"


def _count(value: int) -> str:
    return str(value) if value < 10_000 else f"{value // 1000}k"


def _ms(value: float) -> str:
    if value >= 100:
        return f"{value:.0f}ms"
    return f"{value:.2f}ms" if value < 10 else f"{value:.1f}ms"


def _clip(line: str) -> str:
    return line if len(line) <= WIDTH else line[: WIDTH - 1] + "…"
