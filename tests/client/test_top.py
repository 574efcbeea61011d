"""npuctl top's frames: rates between two samples, sorting, widths, counts that agree."""

from __future__ import annotations

from typing import Any

import msgspec

import npu_protocol as p
from npu_client._top import WIDTH, Sample, frame, render


def status(*rows: p.ClientRow, scheduler: p.SchedulerRow | None = None) -> p.DaemonStatus:
    return p.DaemonStatus(
        daemon_version="0.1.0",
        uptime_ms=1,
        backend="emulator",
        device="/dev/x",
        dsp=p.DspCapabilities(),
        shell=p.ShellStatus(verified=True),
        epoch=1,
        clients=rows,
        scheduler=scheduler,
    )


def row(pid: int, name: str, calls: int, dsp_us: int, **more: Any) -> p.ClientRow:
    return p.ClientRow(
        pid=pid, uid=0, name=name, priority="normal", calls_done=calls, dsp_us=dsp_us, **more
    )


def test_rates_are_over_the_interval_and_rows_sort() -> None:
    before = Sample(status(row(1, "a", 10, 100_000), row(2, "b", 0, 0)), at=10.0)
    after = Sample(
        status(row(1, "a", 30, 300_000), row(2, "b", 100, 500_000), row(3, "new", 5, 0)),
        at=12.0,
    )
    view = frame(before, after)
    assert [r.name for r in view.rows] == ["b", "a", "new"]  # most DSP time first
    b, a, new = view.rows
    assert (b.calls_per_s, b.dsp_pct) == (50.0, 25.0)
    assert (a.calls_per_s, a.dsp_pct) == (10.0, 10.0)
    assert new.calls_per_s == 2.5  # a client that appeared counts from zero
    assert [r.name for r in frame(before, after, sort="name").rows] == ["a", "b", "new"]
    assert [r.name for r in frame(before, after, exclude=(2, "b")).rows] == ["a", "new"]


def test_a_frame_fits_80_columns_whatever_the_names() -> None:
    wide = row(4_194_304, "x" * 64, 10**9, 10**12, misses=123_456, late=99_999, wait_p99_us=10**9)
    scheduler = p.SchedulerRow(mode="fair", dsp_slots=64, queued_normal=10**6)
    text = render(frame(Sample(status(), 0), Sample(status(wide, scheduler=scheduler), 1)))
    assert max(len(line) for line in text.splitlines()) <= WIDTH
    assert "123k" in text


def test_no_clients_and_no_scheduler_row_still_render() -> None:
    text = render(frame(Sample(status(), 0), Sample(status(), 1)))
    assert "(no clients)" in text
    assert " ? " in text  # an older daemon without a scheduler row


def test_each_clients_domain_and_each_domain_are_shown() -> None:
    domains = (
        p.DomainRow(name="default", epoch=1, clients=1, mapped_bytes=4 << 20, models=1),
        p.DomainRow(name="llm#1", isolated=True, state="restarting", epoch=3, restarts=2),
    )
    after = p.DaemonStatus(
        daemon_version="0.1.0",
        uptime_ms=1,
        backend="emulator",
        device="/dev/x",
        dsp=p.DspCapabilities(),
        shell=p.ShellStatus(verified=True),
        epoch=1,
        clients=(row(7, "llama-cli", 1, 0, domain="llm#1"),),
        domains=domains,
    )
    view = frame(Sample(status(), 0), Sample(after, 1))
    assert view.rows[0].domain == "llm#1"
    assert [d.name for d in view.domains] == ["default", "llm#1"]
    text = render(view)
    assert "llama-cli   llm#1" in text
    assert "domain default (shared): up, epoch 1, 0 restarts, 1 client, 4.0 MiB mapped" in text
    assert "domain llm#1 (isolated): restarting, epoch 3, 2 restarts" in text
    assert max(len(line) for line in text.splitlines()) <= WIDTH


def test_the_header_says_what_each_dsp_figure_measures() -> None:
    """The daemon's busy share (all slots, its 10 s window) and the rows' (one slot, this
    interval) are labelled as such, and the rows are summed, so they cannot be read as
    contradicting each other (3 % of 4 slots beside rows of 38.2 % and 5.4 %)."""
    before = status(row(1, "a", 0, 0), row(2, "b", 0, 0))
    after = status(
        row(1, "a", 10, 382_000),
        row(2, "b", 10, 54_000),
        scheduler=p.SchedulerRow(mode="fair", dsp_slots=4, utilisation_pct=3),
    )
    text = render(frame(Sample(before, 0), Sample(after, 1)))
    assert "DSP busy 3% of 4 slots (10 s); rows' DSP% of 1 slot, 1 s: 43.6% in all" in text


def test_without_a_width_nothing_is_cut() -> None:
    """Into a pipe or a file (no terminal) each line is whole: long names widen their
    columns, and the domain lines are not cut at 80 columns."""
    long = row(12, "voice-pipeline-speech-to-text", 5, 1000, domain="voice-isolated#12")
    domains = (p.DomainRow(name="voice-isolated#12", isolated=True, clients=1, models=3,
                           mapped_bytes=123 << 30, restarts=12_345, epoch=12_346),)  # fmt: skip
    after = msgspec.structs.replace(status(long), domains=domains)
    view = frame(Sample(status(), 0), Sample(after, 1))
    whole = render(view, width=None)
    assert "voice-pipeline-speech-to-text voice-isolated#12 N" in whole
    assert "…" not in whole
    assert whole.rstrip().endswith("123.0 GiB mapped, 3 models")
    header, line = (text for text in whole.splitlines() if "PID" in text or "voice-p" in text)
    assert header.index("DOMAIN") == line.index("voice-isolated#12")  # the columns still align
    cut = render(view)  # a terminal of 80 columns
    assert max(len(text) for text in cut.splitlines()) <= WIDTH
    assert "…" in cut


def test_npuctls_own_connection_is_counted_nowhere() -> None:
    """The rows leave npuctl out, so its domain's count does too: never "(no clients)"
    beside "1 clients"."""
    me = row(99, "npuctl", 1, 0, domain="default")
    after = msgspec.structs.replace(
        status(me),
        totals=p.Totals(clients=1),
        domains=(p.DomainRow(name="default", clients=1),),
    )
    view = frame(Sample(status(), 0), Sample(after, 1), exclude=(99, "npuctl"))
    assert view.rows == ()
    assert view.domains[0].clients == 0
    text = render(view)
    assert "(no clients)" in text
    assert "0 clients" in text


def test_clients_of_other_users_are_said_not_shown() -> None:
    me = row(99, "npuctl", 1, 0, domain="default")
    after = msgspec.structs.replace(
        status(me),
        totals=p.Totals(clients=3),  # npuctl and two clients of other users
        domains=(p.DomainRow(name="default", clients=3),),
    )
    view = frame(Sample(status(), 0), Sample(after, 1), exclude=(99, "npuctl"))
    assert (view.hidden, view.domains[0].clients) == (2, 2)
    text = render(view)
    assert "(2 clients of other users not shown)" in text
    assert "(no clients)" not in text
