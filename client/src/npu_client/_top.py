"""``npuctl top``: who uses the NPU, refreshed every second.

Each frame compares two status records taken ``interval`` apart: calls per
second and the share of DSP time are rates over that interval; queue waits are
the daemon's recent percentiles (the 99th in the table, both in ``--json``);
misses and late calls are totals. Each client's domain (its DSP process) is a
column, and each domain a line below the clients. The view
is plain text (a terminal's own scrolling and copy work), redrawn in place
and fitted to the terminal's width when stdout is a terminal; otherwise whole
lines, nothing cut, the name columns as wide as the longest name. ``--json``
gives the same rows as one JSON object per frame for scripts.

Counts agree with each other: npuctl's own connection is left out of the rows
and of its domain's client count, and the clients npud counts but does not
show this user (other users' rows) are said as such.
"""

from __future__ import annotations

import collections
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final, Literal

import msgspec

from npu_client._status_text import domain_kind
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
    hidden: int = 0
    """Clients npud counts whose rows it does not show this user (other users')."""


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
    me = [row for row in after.status.clients if (row.pid, row.name) == exclude]
    mine = collections.Counter(row.domain for row in me)
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
                clients=max(d.clients - mine[d.name], 0),
                mapped_bytes=d.mapped_bytes,
                models=d.models,
            )
            for d in after.status.domains
        ),
        hidden=max(after.status.totals.clients - len(after.status.clients), 0),
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


def _header(name: int, domain: int) -> str:
    return (
        f"{'PID':>7} {'NAME':<{name}} {'DOMAIN':<{domain}} {'CL':<2} {'CALLS/S':>7} {'DSP%':>5} "
        f"{'WAIT99':>7} {'Q/R':>5} {'MISS':>4} {'LATE':>4} {'BUDGET':>7}"
    )


NAME_WIDTH: Final = 11
DOMAIN_WIDTH: Final = 8


def render(top: TopFrame, *, width: int | None = WIDTH) -> str:
    """The frame as text: lines of at most ``width`` columns (names shortened to fit the
    table, longer lines cut with "…"), or whole lines when ``width`` is None (the name
    columns then as wide as the longest name: nothing is cut)."""
    queued, running = top.queued, top.running
    if width is None:
        name_width = max([NAME_WIDTH, *(len(row.name) for row in top.rows)])
        domain_width = max([DOMAIN_WIDTH, *(len(row.domain) for row in top.rows)])
    else:
        name_width, domain_width = NAME_WIDTH, DOMAIN_WIDTH

    def fit(line: str) -> str:
        return line if width is None else _clip(line, width)

    # Two DSP figures, each saying what it measures: the daemon's, of all its slots over
    # its own 10 s window; the rows', each of one slot over this frame's interval.
    shown = sum(row.dsp_pct for row in top.rows)
    lines = [
        fit(
            f"npud {top.daemon_version} ({top.backend}, epoch {top.epoch}) - {top.mode} - "
            f"realtime budgets {top.realtime_declared_pct}%"
        ),
        fit(
            f"DSP busy {top.utilisation_pct}% of {top.dsp_slots} slots (10 s); "
            f"rows' DSP% of 1 slot, {top.interval_s:g} s: {shown:.1f}% in all"
        ),
        fit(
            f"queued rt/n/bg {queued[0]}/{queued[1]}/{queued[2]}   "
            f"running rt/n/bg {running[0]}/{running[1]}/{running[2]}"
        ),
        "",
        fit(_header(name_width, domain_width)),
    ]
    for row in top.rows:
        budget = f"{row.budget_ms:g}/{row.period_ms:g}" if row.period_ms else "-"
        lines.append(
            fit(
                f"{row.pid:>7} {row.name[:name_width]:<{name_width}} "
                f"{(row.domain or '-')[:domain_width]:<{domain_width}} "
                f"{CLASS_LETTERS.get(row.priority, '?'):<2} "
                f"{row.calls_per_s:>7.1f} {row.dsp_pct:>5.1f} "
                f"{_ms(row.wait_p99_ms):>7} {f'{row.queued}/{row.running}':>5} "
                f"{_count(row.misses):>4} {_count(row.late):>4} {budget:>7}"
            )
        )
    if top.hidden:
        lines.append(fit(f"({_plural(top.hidden, 'client')} of other users not shown)"))
    elif not top.rows:
        lines.append("(no clients)")
    if top.domains:
        lines.append("")
        for domain in top.domains:
            kind = domain_kind(domain.name, domain.isolated)
            lines.append(
                fit(
                    f"domain {domain.name} ({kind}): {domain.state}, epoch {domain.epoch}, "
                    f"{_plural(domain.restarts, 'restart')}, "
                    f"{_plural(domain.clients, 'client')}, "
                    f"{_bytes(domain.mapped_bytes)} mapped, {_plural(domain.models, 'model')}"
                )
            )
    return "\n".join(lines)


def _plural(count: int, word: str) -> str:
    return f"{count} {word}" if count == 1 else f"{count} {word}s"


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


def _clip(line: str, width: int) -> str:
    return line if len(line) <= width else line[: width - 1] + "…"
