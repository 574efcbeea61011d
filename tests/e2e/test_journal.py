"""npud under systemd-run-like conditions: stderr is "the journal" ($JOURNAL_STREAM matches it).

Every line must start with its syslog priority so `journalctl -p warning`
finds warnings and errors; the event text stays a stable key.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

from tests.e2e.daemon import start_npud


def journal_env(path: Path) -> dict[str, str]:
    path.touch()
    st = os.stat(path)
    return {"JOURNAL_STREAM": f"{st.st_dev}:{st.st_ino}"}


def prefixed_events(text: str) -> list[tuple[int, dict[str, object]]]:
    events = []
    for line in text.splitlines():
        assert re.match(r"<[0-7]>\{", line), f"no priority prefix: {line!r}"
        events.append((int(line[1]), json.loads(line[3:])))
    return events


def wait_for_event(log: Path, event: str, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if f'"event": "{event}"' in log.read_text():
            return
        time.sleep(0.02)
    raise AssertionError(f"no {event!r} in:\n{log.read_text()}")


def test_every_line_carries_its_level_and_a_failed_reload_is_an_error(tmp_path: Path) -> None:
    daemon = start_npud(tmp_path, env=journal_env(tmp_path / "npud.log"))
    try:
        daemon.config_path.write_text("[daemon]\nsockt = 1\n")  # a typo: the reload must fail
        os.kill(daemon.pid, signal.SIGHUP)
        wait_for_event(daemon.log_path, "reload failed; keeping the running configuration")
    finally:
        assert daemon.stop() == 0
    events = prefixed_events(daemon.log())
    by_event = {str(fields["event"]): priority for priority, fields in events}
    assert by_event["starting"] == 6
    assert by_event["ready"] == 6
    assert by_event["reload failed; keeping the running configuration"] == 3
    assert by_event["stopped"] == 6
    # The level field and the prefix always agree.
    names = {7: "debug", 6: "info", 4: "warning", 3: "error", 2: "critical"}
    assert all(names[priority] == fields["level"] for priority, fields in events)


def test_a_reload_with_an_old_key_name_applies_it_and_warns(tmp_path: Path) -> None:
    daemon = start_npud(tmp_path, env=journal_env(tmp_path / "npud.log"))
    try:
        daemon.config_path.write_text(
            daemon.config_path.read_text() + "[daemon]\nshutdown_grace = 2.0\n"
        )
        os.kill(daemon.pid, signal.SIGHUP)
        wait_for_event(daemon.log_path, "configuration reloaded")
    finally:
        assert daemon.stop() == 0
    renamed = [
        (priority, fields)
        for priority, fields in prefixed_events(daemon.log())
        if fields["event"] == "renamed configuration key"
    ]
    assert len(renamed) == 1
    priority, fields = renamed[0]
    assert priority == 4  # a warning in the journal
    assert "daemon.shutdown_grace is now daemon.shutdown_grace_s" in str(fields["detail"])


def test_a_start_up_failure_is_one_error_line(tmp_path: Path) -> None:
    log = tmp_path / "npud.log"
    config = tmp_path / "npud.toml"
    config.write_text("[daemon]\nsockt = 1\n")
    with open(log, "wb") as out:
        result = subprocess.run(
            [sys.executable, "-m", "npud.daemon.main", "--config", str(config)],
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**os.environ, **journal_env(log)},
            check=False,
            timeout=60,
        )
    assert result.returncode == 78  # EX_CONFIG
    [line] = log.read_text().splitlines()
    assert line.startswith("<3>npud: bad configuration: ")
    assert line.endswith(": unknown key daemon.sockt (did you mean socket?)")
