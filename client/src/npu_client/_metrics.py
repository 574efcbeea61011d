"""npud's status as Prometheus metrics (text exposition format 0.0.4), for ``npuctl metrics``.

``npuctl status --json`` is the contract; this is a view of the same record,
for laptops managed in a fleet (node_exporter's textfile collector, or any
scraper that runs ``npuctl metrics``). Nothing here talks to the daemon.

Adding a metric is one line in :data:`DAEMON_METRICS` (a field of the status
record or of its ``totals``) or :data:`CLIENT_METRICS` (a field of each
client's row): the metric's name, its type, the field, and its help text.

A counter is read only from a field that never goes back while its series
lives: the daemon's totals count since npud started (clients that left
included), a client's since it connected, a domain's since it opened (every
session of it). A count that starts again (a domain's current session's
calls) is a gauge.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Final, Literal

import msgspec

from npu_protocol import DaemonStatus

Kind = Literal["counter", "gauge"]
COUNTER: Final[Kind] = "counter"
GAUGE: Final[Kind] = "gauge"


@dataclass(frozen=True)
class Metric:
    """One metric from one numeric field; ``field`` may name a nested one (``totals.bytes``).

    A field whose name ends in ``_ms`` or ``_us`` is exported in seconds, as
    Prometheus expects; name the metric ``..._seconds`` (or ``..._seconds_total``).
    """

    name: str
    kind: Kind
    field: str
    help: str


# fmt: off
DAEMON_METRICS: Final = (
    Metric("npud_uptime_seconds", GAUGE, "uptime_ms", "Seconds since npud started."),
    Metric("npud_session_epoch", GAUGE, "epoch", "DSP session epoch: 1 at start, +1 per restart."),
    Metric("npud_dsp_restarts_total", COUNTER, "restarts", "DSP session restarts since start."),
    Metric("npud_clients", GAUGE, "totals.clients", "Connected clients (the scraper included)."),
    Metric("npud_buffers", GAUGE, "totals.buffers", "DMA-BUFs held for all clients."),
    Metric("npud_buffer_bytes", GAUGE, "totals.bytes", "Bytes of DMA-BUFs held for all clients."),
    Metric("npud_mappings", GAUGE, "totals.mappings", "Buffers mapped into the DSP."),
    Metric("npud_handles", GAUGE, "totals.handles", "Remote handles open on the DSP."),
    Metric("npud_calls_in_flight", GAUGE, "totals.calls_in_flight", "Requests not yet answered."),
    Metric("npud_calls_total", COUNTER, "totals.calls_done", "Requests answered, all clients."),
    Metric("npud_models", GAUGE, "totals.models", "Models loaded for all clients."),
    Metric("npud_model_bytes", GAUGE, "totals.model_bytes", "Bytes of models: files and arenas."),
    Metric("npud_dsp_slots", GAUGE, "scheduler.dsp_slots", "Calls npud keeps on the DSP at once."),
    Metric("npud_queued_realtime", GAUGE, "scheduler.queued_realtime", "Realtime calls waiting."),
    Metric("npud_queued_normal", GAUGE, "scheduler.queued_normal", "Normal calls waiting."),
    Metric("npud_queued_background", GAUGE, "scheduler.queued_background", "Background waiting."),
    Metric("npud_running_realtime", GAUGE, "scheduler.running_realtime", "Realtime calls running."),
    Metric("npud_running_normal", GAUGE, "scheduler.running_normal", "Normal calls on the DSP."),
    Metric("npud_running_background", GAUGE, "scheduler.running_background", "Background running."),
    Metric("npud_dsp_utilisation_percent", GAUGE, "scheduler.utilisation_pct", "Busy slots."),
    Metric("npud_realtime_budget_percent", GAUGE, "scheduler.realtime_declared_pct", "Budgets."),
    Metric("npud_dispatched_total", COUNTER, "scheduler.dispatched", "Calls dispatched."),
    Metric("npud_late_total", COUNTER, "scheduler.late", "Calls refused: too late."),
    Metric("npud_pool_buffers", GAUGE, "pool.buffers", "Freed DMA-BUFs kept for reuse."),
    Metric("npud_pool_bytes", GAUGE, "pool.bytes", "Bytes of DMA-BUFs kept for reuse."),
    Metric("npud_pool_max_bytes", GAUGE, "pool.max_bytes", "Bytes the pool keeps at most."),
    Metric("npud_pool_mapped", GAUGE, "pool.mapped", "Kept buffers still mapped into the DSP."),
    Metric("npud_pool_scrubbing", GAUGE, "pool.scrubbing", "Kept buffers not zeroed yet."),
    Metric("npud_pool_hits_total", COUNTER, "pool.hits", "Allocations served from the pool."),
    Metric("npud_pool_misses_total", COUNTER, "pool.misses", "Allocations it could not serve."),
    Metric("npud_pool_kept_total", COUNTER, "pool.kept", "Freed buffers the pool took in."),
    Metric("npud_pool_passed_total", COUNTER, "pool.passed", "Freed buffers released at once."),
    Metric("npud_pool_evicted_total", COUNTER, "pool.evicted", "Kept buffers released for room."),
    Metric("npud_pool_trimmed_total", COUNTER, "pool.trimmed", "Kept buffers released when idle."),
    Metric("npud_pool_dropped_total", COUNTER, "pool.dropped", "Kept buffers whose owner went."),
    Metric("npud_pool_scrubbed_bytes_total", COUNTER, "pool.scrubbed_bytes", "Bytes zeroed."),
    Metric("npud_pool_scrub_seconds_total", COUNTER, "pool.scrub_us", "Time spent zeroing."),
    Metric("npud_memory_buffers", GAUGE, "memory.buffers", "DMA-BUFs held for clients, pool too."),
    Metric("npud_memory_bytes", GAUGE, "memory.bytes", "Bytes of those DMA-BUFs."),
)
"""Daemon-wide metrics: fields of :class:`~npu_protocol.DaemonStatus` and its totals."""

CLIENT_METRICS: Final = (
    Metric("npud_client_calls_total", COUNTER, "calls_done", "Requests answered for the client."),
    Metric("npud_client_calls_in_flight", GAUGE, "calls_in_flight", "Client requests unanswered."),
    Metric("npud_client_buffers", GAUGE, "buffers", "DMA-BUFs the client holds."),
    Metric("npud_client_buffer_bytes", GAUGE, "bytes", "Bytes of DMA-BUFs the client holds."),
    Metric("npud_client_mappings", GAUGE, "mappings", "The client's buffers mapped into the DSP."),
    Metric("npud_client_handles", GAUGE, "handles", "Remote handles the client has open."),
    Metric(
        "npud_client_dsp_seconds_total",
        COUNTER,
        "dsp_us",
        "DSP time the client's calls and op batches used.",
    ),
    Metric("npud_client_queued", GAUGE, "queued", "Client calls waiting for a DSP slot."),
    Metric("npud_client_running", GAUGE, "running", "Client calls on the DSP."),
    Metric("npud_client_wait_p50_seconds", GAUGE, "wait_p50_us", "Median recent queue wait."),
    Metric("npud_client_wait_p99_seconds", GAUGE, "wait_p99_us", "99th pct queue wait."),
    Metric("npud_client_deadline_misses_total", COUNTER, "misses", "Calls finished late."),
    Metric("npud_client_late_total", COUNTER, "late", "Calls refused: too late."),
    Metric("npud_client_budget_overruns_total", COUNTER, "overruns", "Times past budget."),
    Metric("npud_client_budget_period_seconds", GAUGE, "budget_period_us", "Declared period."),
    Metric("npud_client_budget_seconds", GAUGE, "budget_us", "Declared DSP budget per period."),
    Metric("npud_client_hung_calls_total", COUNTER, "hung_calls", "Calls the watchdog caught."),
)
"""Per-client metrics, labelled pid, uid, name, priority and domain: fields of each client row."""

DOMAIN_METRICS: Final = (
    Metric("npud_domain_epoch", GAUGE, "epoch", "The domain's session epoch."),
    Metric("npud_domain_restarts_total", COUNTER, "restarts", "Restarts of its DSP process."),
    Metric("npud_domain_hung_calls_total", COUNTER, "hung_calls", "Calls the watchdog caught."),
    Metric("npud_domain_clients", GAUGE, "clients", "Clients whose calls run in the domain."),
    Metric("npud_domain_mappings", GAUGE, "mappings", "Buffers mapped into its DSP process."),
    Metric("npud_domain_mapped_bytes", GAUGE, "mapped_bytes", "Bytes of those buffers."),
    Metric("npud_domain_handles", GAUGE, "remote_handles", "Skel handles open in it."),
    Metric("npud_domain_models", GAUGE, "models", "Model loads it holds (shared ones once)."),
    Metric("npud_domain_invokes_in_flight", GAUGE, "invokes_in_flight", "Its calls on the DSP."),
    Metric("npud_domain_invokes_total", COUNTER, "invokes_total", "Calls since it opened."),
    Metric("npud_domain_session_invokes", GAUGE, "invokes_done", "Calls of its current session."),
    Metric("npud_domain_uptime_seconds", GAUGE, "uptime_ms", "Seconds since it opened."),
    Metric(
        "npud_domain_interrupted_contexts",
        GAUGE,
        "interrupted_contexts",
        "Calls suspends interrupted; the kernel keeps their contexts until the session closes.",
    ),
    Metric(
        "npud_domain_suspend_reopens_total",
        COUNTER,
        "suspend_reopens",
        "Sessions reopened to free the contexts suspends left.",
    ),
    Metric(
        "npud_domain_dsp_seconds_total",
        COUNTER,
        "dsp_us",
        "DSP time its clients' calls and op batches used since it opened.",
    ),
)
"""Per-domain metrics, labelled domain, isolated and state: fields of each domain row."""
# fmt: on

HELD_METRICS: Final = (
    Metric(
        "npud_client_batches_held_total",
        COUNTER,
        "batches",
        "Op batches the gate held for realtime work.",
    ),
    Metric(
        "npud_client_batch_held_seconds_total",
        COUNTER,
        "held_us",
        "Time those op batches were held.",
    ),
)
"""Per client and reason (the client's labels and ``reason``): fields of each of its
``held`` rows (version 7; none from an older npud, or before a batch was held)."""

CLIENT_LABELS: Final = ("pid", "uid", "name", "priority", "domain")
DOMAIN_LABELS: Final = (("domain", "name"), ("isolated", "isolated"), ("state", "state"))
"""(label, field) of each domain row."""
UP: Final = Metric("npud_up", GAUGE, "", "1 when npud answered the status request, else 0.")
INFO_NAME: Final = "npud_info"
CONTENT_TYPE: Final = "text/plain; version=0.0.4; charset=utf-8"

_SCALES: Final = {"_ms": 1_000, "_us": 1_000_000}
"""Divisors to seconds. Dividing, not multiplying by 1e-6: 349 / 1e6 prints 0.000349,
349 * 1e-6 prints 0.00034899999999999997."""


def render(status: DaemonStatus, *, exclude: tuple[int, str] | None = None) -> str:
    """The exposition of ``status``, without the client row whose (pid, name) is ``exclude``.

    That is the scraper's own connection: a timer that ran ``npuctl metrics``
    every 15 s would otherwise add a series with a new pid label each time.
    """
    record = msgspec.to_builtins(status)
    lines = [*_family(UP, [((), 1)])]
    info = {
        "version": status.daemon_version,
        "backend": status.backend,
        "device": status.device,
        "shell_verified": "true" if status.shell.verified else "false",
    }
    lines += _family(
        Metric(INFO_NAME, GAUGE, "", "npud's version, backend, device and shell verification."),
        [(tuple(info.items()), 1)],
    )
    for metric in DAEMON_METRICS:
        section = metric.field.partition(".")[0] if "." in metric.field else ""
        if section and record.get(section) is None:
            continue  # a part of the record that this daemon does not report
        lines += _family(metric, [((), _value(record, metric.field))])
    rows = [row for row in record["clients"] if (row["pid"], row["name"]) != exclude]
    for metric in CLIENT_METRICS:
        samples = [(_client_labels(row), _value(row, metric.field)) for row in rows]
        lines += _family(metric, samples)
    for metric in HELD_METRICS:
        samples = [
            ((*_client_labels(row), ("reason", held["reason"])), _value(held, metric.field))
            for row in rows
            for held in row.get("held", [])
        ]
        lines += _family(metric, samples)
    for metric in DOMAIN_METRICS:
        samples = [
            (
                tuple((label, _label_text(row[key])) for label, key in DOMAIN_LABELS),
                _value(row, metric.field),
            )
            for row in record.get("domains", [])
        ]
        lines += _family(metric, samples)
    return "\n".join(lines) + "\n"


def _client_labels(row: dict[str, Any]) -> tuple[tuple[str, str], ...]:
    return tuple((label, str(row[label])) for label in CLIENT_LABELS)


def _label_text(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def render_down() -> str:
    """The exposition when npud did not answer: only ``npud_up 0``."""
    return "\n".join(_family(UP, [((), 0)])) + "\n"


def _family(
    metric: Metric, samples: Sequence[tuple[tuple[tuple[str, str], ...], float]]
) -> Iterable[str]:
    yield f"# HELP {metric.name} {_escape_help(metric.help)}"
    yield f"# TYPE {metric.name} {metric.kind}"
    for labels, value in samples:
        rendered = ",".join(f'{key}="{_escape_label(text)}"' for key, text in labels)
        yield (
            f"{metric.name}{{{rendered}}} {_number(value)}"
            if labels
            else (f"{metric.name} {_number(value)}")
        )


def _value(record: dict[str, object], path: str) -> float:
    value: object = record
    for key in path.split("."):
        if not isinstance(value, dict) or key not in value:
            raise KeyError(f"the status record has no field {path!r}")
        value = value[key]
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"status field {path!r} is {type(value).__name__}, not a number")
    per_second = _SCALES.get(path[-3:], 1)
    return value / per_second if per_second != 1 else value


def _number(value: float) -> str:
    if isinstance(value, int):
        return str(value)
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(value)


def _escape_help(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n")


def _escape_label(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')
