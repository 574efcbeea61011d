"""`npuctl metrics`: the status record as Prometheus text, checked by prometheus_client's parser."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import msgspec
import pytest
from prometheus_client.parser import text_string_to_metric_families

import npu_client
import npu_protocol as p
from npu_client import _metrics, npuctl
from tests.client.peer import Peer

CLIENT_ROWS = (
    p.ClientRow(pid=100, uid=1000, name="voice-stt", priority="realtime", buffers=2, bytes=8192,
                mappings=1, handles=3, calls_in_flight=1, calls_done=40),
    p.ClientRow(pid=200, uid=1001, name="llm", priority="background", calls_done=7),
    p.ClientRow(pid=300, uid=0, name="npuctl", priority="normal", calls_done=1),
)  # fmt: skip

STATUS = p.DaemonStatus(
    daemon_version="0.1.0",
    uptime_ms=93_500,
    backend="emulator",
    device='/dev/fastrpc-cdsp-secure (emulated) "q" \\ x',
    dsp=p.DspCapabilities(),
    shell=p.ShellStatus(verified=True),
    epoch=2,
    restarts=1,
    totals=p.Totals(clients=3, buffers=2, bytes=8192, mappings=1, handles=3, calls_in_flight=1,
                    calls_done=48),
    clients=CLIENT_ROWS,
)  # fmt: skip

NOT_EXPORTED = frozenset({"pid", "uid"})
"""Numeric fields that are labels, not values."""


def value(text: str, metric: str, /, **labels: str) -> float:
    """The value of the one sample of ``metric`` whose labels include ``labels``."""
    found = [
        sample
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == metric and all(sample.labels.get(k) == v for k, v in labels.items())
    ]
    assert len(found) == 1, f"{len(found)} samples {metric}{labels} in:\n{text}"
    return float(found[0].value)


def test_the_status_as_metrics() -> None:
    text = _metrics.render(STATUS, exclude=(300, "npuctl"))
    assert value(text, "npud_up") == 1
    assert value(text, "npud_uptime_seconds") == 93.5
    assert value(text, "npud_session_epoch") == 2
    assert value(text, "npud_dsp_restarts_total") == 1
    assert value(text, "npud_calls_total") == 48
    assert value(text, "npud_buffer_bytes") == 8192
    info = value(text, "npud_info", backend="emulator", version="0.1.0", shell_verified="true")
    assert info == 1
    assert value(text, "npud_info", device=STATUS.device) == 1  # quotes, backslash escaped
    voice = {"pid": "100", "uid": "1000", "name": "voice-stt", "priority": "realtime"}
    assert value(text, "npud_client_calls_total", **voice) == 40
    assert value(text, "npud_client_buffer_bytes", **voice) == 8192
    assert value(text, "npud_client_handles", **voice) == 3
    assert value(text, "npud_client_calls_total", name="llm", priority="background") == 7
    # The scraper's own row would be a new series on every scrape: left out.
    assert 'name="npuctl"' not in text


def test_the_pool_as_metrics() -> None:
    pool = p.PoolRow(enabled=True, buffers=2, bytes=1 << 20, max_bytes=1 << 28, hits=9, misses=3,
                     scrubbed_bytes=5 << 20, scrub_us=1_500)  # fmt: skip
    text = _metrics.render(msgspec.structs.replace(STATUS, pool=pool))
    assert value(text, "npud_pool_bytes") == 1 << 20
    assert value(text, "npud_pool_hits_total") == 9
    assert value(text, "npud_pool_misses_total") == 3
    assert value(text, "npud_pool_scrub_seconds_total") == 0.0015
    assert "npud_pool_" not in _metrics.render(STATUS)  # a daemon that does not report it


def test_every_family_has_help_and_type_and_parses() -> None:
    text = _metrics.render(STATUS)
    families = list(text_string_to_metric_families(text))
    names = [family.name for family in families]
    assert len(names) == len(set(names))
    for family in families:
        assert family.documentation, family.name
        assert family.type in ("counter", "gauge"), family.name
    assert text.endswith("\n")
    assert "# TYPE npud_calls_total counter" in text  # the exposition keeps _total


def test_no_clients_leaves_the_client_families_empty() -> None:
    quiet = msgspec.structs.replace(STATUS, clients=())
    text = _metrics.render(quiet)
    assert "# TYPE npud_client_calls_total counter" in text
    assert "npud_client_calls_total{" not in text


def test_down() -> None:
    text = _metrics.render_down()
    assert value(text, "npud_up") == 0
    assert [family.name for family in text_string_to_metric_families(text)] == ["npud_up"]


def test_metric_names_follow_the_conventions() -> None:
    for metric in (*_metrics.DAEMON_METRICS, *_metrics.CLIENT_METRICS):
        assert metric.name.startswith("npud_"), metric
        assert metric.name.endswith("_total") == (metric.kind == "counter"), metric
        assert metric.help.endswith("."), metric
    client_names = {metric.name for metric in _metrics.CLIENT_METRICS}
    assert all(name.startswith("npud_client_") for name in client_names)
    for metric in _metrics.DOMAIN_METRICS:
        assert metric.name.startswith("npud_domain_"), metric
        assert metric.name.endswith("_total") == (metric.kind == "counter"), metric
        assert metric.help.endswith("."), metric


def test_domains_and_memory_as_metrics() -> None:
    domains = (
        p.DomainRow(name="default", epoch=2, restarts=1, clients=3),
        p.DomainRow(name="llm#1", isolated=True, hung_calls=1, state="restarting"),
    )
    status = msgspec.structs.replace(
        STATUS, domains=domains, memory=p.MemoryRow(source="heap", buffers=4, bytes=65536)
    )
    text = _metrics.render(status)
    assert value(text, "npud_domain_epoch", domain="default") == 2
    assert value(text, "npud_domain_restarts_total", domain="default") == 1
    assert value(text, "npud_domain_hung_calls_total", domain="llm#1", isolated="true") == 1
    assert value(text, "npud_domain_clients", domain="llm#1", state="restarting") == 0
    assert value(text, "npud_memory_bytes") == 65536
    assert "npud_memory_" not in _metrics.render(STATUS)  # a daemon that does not report it


def test_counters_are_the_fields_that_never_go_back() -> None:
    """A domain's current session's calls start again at a restart: its counter is the
    domain's total over every session, the session's count a gauge."""
    restarted = p.DomainRow(name="default", restarts=1, invokes_done=3, invokes_total=120)
    text = _metrics.render(msgspec.structs.replace(STATUS, domains=(restarted,)))
    assert value(text, "npud_domain_invokes_total", domain="default") == 120
    assert value(text, "npud_domain_session_invokes", domain="default") == 3
    assert "# TYPE npud_domain_session_invokes gauge" in text
    counted = {
        metric.field
        for metric in (*_metrics.DAEMON_METRICS, *_metrics.DOMAIN_METRICS)
        if metric.kind == "counter"
    }
    assert "invokes_done" not in counted


def _numeric_fields(record: type[msgspec.Struct], prefix: str = "") -> set[str]:
    found = set()
    for field in msgspec.structs.fields(record):
        if field.type in (int, float) or str(field.type).startswith(
            ("typing.Annotated[int", "typing.Annotated[float")
        ):
            found.add(prefix + field.name)
    return found


def test_every_numeric_status_field_is_a_metric() -> None:
    """A field added to the status record needs its one line in a metrics table."""
    daemon = {metric.field for metric in _metrics.DAEMON_METRICS}
    client = {metric.field for metric in _metrics.CLIENT_METRICS}
    wanted_daemon = (
        _numeric_fields(p.DaemonStatus)
        | _numeric_fields(p.Totals, "totals.")
        | _numeric_fields(p.PoolRow, "pool.")
        | _numeric_fields(p.MemoryRow, "memory.")
    )
    domain = {metric.field for metric in _metrics.DOMAIN_METRICS}
    assert _numeric_fields(p.DomainRow) <= domain, "add one line to DOMAIN_METRICS"
    held = {metric.field for metric in _metrics.HELD_METRICS}
    assert _numeric_fields(p.HoldRow) <= held, "add one line to HELD_METRICS"
    wanted_client = _numeric_fields(p.ClientRow) - NOT_EXPORTED
    where = "add one line to {} in client/src/npu_client/_metrics.py"
    assert wanted_daemon <= daemon, (wanted_daemon - daemon, where.format("DAEMON_METRICS"))
    assert wanted_client <= client, (wanted_client - client, where.format("CLIENT_METRICS"))
    assert {"uptime_ms", "totals.calls_done"} <= wanted_daemon  # the scan sees Annotated ints


def test_a_misspelt_field_is_an_error_not_a_zero() -> None:
    bad = _metrics.Metric("npud_nope", "gauge", "totals.nope", "Nothing.")
    with pytest.raises(KeyError, match=r"totals\.nope"):
        _metrics._value(msgspec.to_builtins(STATUS), bad.field)
    with pytest.raises(TypeError, match="not a number"):
        _metrics._value(msgspec.to_builtins(STATUS), "backend")


def test_milliseconds_become_seconds() -> None:
    assert _metrics._value({"dsp_time_ms": 1500}, "dsp_time_ms") == 1.5
    assert _metrics._value({"wait_us": 250}, "wait_us") == 0.00025


@pytest.mark.parametrize(
    ("field", "value", "printed"),
    [("wait_us", 349, "0.000349"), ("dsp_time_ms", 1, "0.001"), ("wait_us", 3, "3e-06")],
)
def test_scaled_values_print_as_short_as_they_were_given(
    field: str, value: int, printed: str
) -> None:
    assert _metrics._number(_metrics._value({field: value}, field)) == printed


# --- npuctl metrics -----------------------------------------------------------------------


def test_npuctl_metrics(peer: Peer, capsys: pytest.CaptureFixture[str]) -> None:
    with npu_client.connect(peer.path, name="voice-stt", priority="realtime") as voice:
        voice.alloc(4096)
        code = npuctl.main(["--socket", peer.path, "metrics"])
    out, err = capsys.readouterr()
    assert (code, err) == (0, "")
    assert value(out, "npud_up") == 1
    assert value(out, "npud_client_buffer_bytes", name="voice-stt", pid=str(os.getpid())) == 4096
    assert 'name="npuctl"' not in out


def test_npuctl_metrics_output_file(peer: Peer, tmp_path: Path) -> None:
    collector = tmp_path / "textfile"
    collector.mkdir()
    target = collector / "npud.prom"
    target.write_text("stale\n")
    assert npuctl.main(["--socket", peer.path, "metrics", "--output", str(target)]) == 0
    assert value(target.read_text(), "npud_up") == 1
    assert stat.S_IMODE(target.stat().st_mode) == 0o644
    assert [path.name for path in collector.iterdir()] == ["npud.prom"]  # no temporary left


def test_npuctl_metrics_when_npud_is_down(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    target = tmp_path / "npud.prom"
    code = npuctl.main(
        ["--socket", str(tmp_path / "none.sock"), "metrics", "--output", str(target)]
    )
    assert code == npuctl.EXIT_UNAVAILABLE == 69
    assert "cannot connect to npud" in capsys.readouterr().err
    assert value(target.read_text(), "npud_up") == 0


def test_npuctl_metrics_to_a_directory_that_does_not_exist(
    peer: Peer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    target = tmp_path / "missing" / "npud.prom"
    code = npuctl.main(["--socket", peer.path, "metrics", "--output", str(target)])
    assert code == npuctl.EXIT_CANTCREAT == 73
    assert f"npuctl: cannot write {target}: No such file or directory" in capsys.readouterr().err


def test_held_batches_are_counted_per_client_and_reason() -> None:
    llm = msgspec.structs.replace(
        CLIENT_ROWS[1],
        held=(
            p.HoldRow(reason="realtime_due", batches=12, held_us=34_500),
            p.HoldRow(reason="realtime_on_dsp", batches=3, held_us=9_000),
        ),
    )
    text = _metrics.render(msgspec.structs.replace(STATUS, clients=(CLIENT_ROWS[0], llm)))
    labels = {"name": "llm", "priority": "background"}
    assert value(text, "npud_client_batches_held_total", reason="realtime_due", **labels) == 12
    assert (
        value(text, "npud_client_batch_held_seconds_total", reason="realtime_on_dsp", **labels)
        == 0.009
    )
    assert (
        "voice-stt"
        not in text.split("# HELP npud_client_batches_held_total")[1].split("# HELP npud_domain")[0]
    )  # nothing held: no series
