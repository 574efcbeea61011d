"""Configuration: the shipped example is complete and correct; bad input names its key."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest

import npu_protocol as p
from npud.ops import config as npud_config
from npud.ops.config import Config, ConfigError, load_config, parse_config

EXAMPLE = Path(__file__).resolve().parents[2] / "config" / "npud.toml"


def test_the_example_config_lists_every_key_with_its_default() -> None:
    example = load_config(EXAMPLE)
    assert example == Config()
    # Every key of every section appears in the example.
    text = EXAMPLE.read_text()
    for section_name, section in msgspec.structs.asdict(Config()).items():
        assert f"[{section_name}]" in text
        for key in msgspec.structs.asdict(section):
            assert f"\n{key} = " in text, f"{section_name}.{key} missing from the example"


def test_empty_config_is_all_defaults() -> None:
    assert parse_config("") == Config()


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[daemon]\nsockt = 1", "unknown key daemon.sockt (did you mean socket?)"),
        ("[daemon]\nlog_levl = 'info'", "unknown key daemon.log_levl (did you mean log_level?)"),
        ("[nope]\n", "unknown key nope"),
        ("[deamon]\n", "unknown key deamon (did you mean daemon?)"),
        ("[client_limits]\nmax_buffers = -1", "client_limits.max_buffers: expected `int` >= 0"),
        ("[daemon]\nsocket_mode = '999'", "daemon.socket_mode: expected `str` matching"),
        ("[backend]\nkind = 'gpu'", "backend.kind: 'gpu' is not one of auto, emulator, kernel"),
        ("[backend]\nlanes = 2", "unknown key backend.lanes"),
        ("[scheduler]\ndsp_slots = 0", "scheduler.dsp_slots: expected `int` >= 1"),
        ("[scheduler]\nmode = 'lifo'", "scheduler.mode: 'lifo' is not one of fair, fifo"),
        (
            "[scheduler]\nbatch_yield = 'background'",
            "scheduler.batch_yield: 'background' is not one of normal, realtime",
        ),
        ("[daemon]\nlog_level = 'verbose'", "'verbose' is not one of debug, error, info, warning"),
        (
            "[scheduler]\ndsp_slots = 2\nrealtime_reserve = 2",
            "scheduler: realtime_reserve 2 leaves",
        ),
        (
            "[client_limits]\nmax_calls_in_flight = 70000",
            "client_limits.max_calls_in_flight: expected `int` <= 65535",
        ),
        ("[access]\nallow_uids = ['root']", "access.allow_uids[0]: expected `int`, got `str`"),
        (
            "[[domains.rule]]\nname = 'voice'\nuidz = [1]",
            "unknown key domains.rule[0].uidz (did you mean uids?)",
        ),
        ("[daemon]\nhello_timeout_s = 'soon'", "daemon.hello_timeout_s: expected `float`"),
        ("[daemon", "not valid TOML"),
    ],
)
def test_bad_values_name_the_key(text: str, message: str) -> None:
    with pytest.raises(ConfigError, match=r"^<config>: ") as caught:
        parse_config(text)
    assert message in str(caught.value)
    assert "$." not in str(caught.value)  # the file's spelling, not msgspec's JSON path


def test_an_unknown_key_far_from_every_name_gets_no_guess() -> None:
    with pytest.raises(ConfigError) as caught:
        parse_config("[daemon]\nzzzzzz = 1")
    assert str(caught.value) == "<config>: unknown key daemon.zzzzzz"


@pytest.mark.parametrize(
    ("old", "new"),
    [
        ("[daemon]\nshutdown_grace = 2.5", "[daemon]\nshutdown_grace_s = 2.5"),
        ("[daemon]\nhello_timeout = 1", "[daemon]\nhello_timeout_s = 1"),
        ("[daemon]\nframe_timeout = 3.0", "[daemon]\nframe_timeout_s = 3.0"),
        ("[daemon]\ncall_watchdog = 0", "[daemon]\ncall_watchdog_s = 0"),
        ("[daemon]\nhung_call_throttle_seconds = 9", "[daemon]\nhung_call_throttle_s = 9"),
        ("[daemon]\nlog_summary_interval = 60", "[daemon]\nlog_summary_interval_s = 60"),
        ("[client_limits]\ndefault_timeout_ms = 250", "[client_limits]\ndefault_timeout_s = 0.25"),
        ("[scheduler]\nbackground_wait_ms = 500", "[scheduler]\nbackground_wait_s = 0.5"),
        (
            "[scheduler]\nrealtime_default_budget_us = 2000\nrealtime_default_period_us = 16000",
            "[scheduler]\nrealtime_default_budget_s = 0.002\nrealtime_default_period_s = 0.016",
        ),
        ("[pool]\nidle_seconds = 5.0", "[pool]\nidle_s = 5.0"),
    ],
)
def test_an_old_key_name_still_works_and_the_warning_names_the_new_one(old: str, new: str) -> None:
    warned: list[str] = []
    assert parse_config(old, warn=warned.append) == parse_config(new, warn=warned.append)
    old_keys = [line.split(" = ")[0] for line in old.splitlines()[1:]]
    new_keys = [line.split(" = ")[0] for line in new.splitlines()[1:]]
    assert len(warned) == len(old_keys)
    for line, old_key, new_key in zip(warned, old_keys, new_keys, strict=True):
        assert line.startswith("<config>: ")
        assert f".{old_key} is now " in line
        assert f".{new_key}" in line
        assert "will refuse the old name" in line


def test_an_old_name_in_milliseconds_is_converted_and_the_warning_gives_the_new_value() -> None:
    warned: list[str] = []
    config = parse_config("[scheduler]\nbackground_wait_ms = 250", warn=warned.append)
    assert config.scheduler.background_wait_s == 0.25
    assert warned == [
        "<config>: scheduler.background_wait_ms is now scheduler.background_wait_s, in seconds "
        "(background_wait_s = 0.25): rename it; npud 0.3 will refuse the old name"
    ]


def test_an_old_name_with_a_bad_value_is_refused_under_the_new_name() -> None:
    with pytest.raises(ConfigError, match=r"client_limits\.default_timeout_s: .* <= 600"):
        parse_config("[client_limits]\ndefault_timeout_ms = 600001", warn=lambda line: None)


def test_a_key_under_both_names_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"daemon\.call_watchdog and daemon\.call_watchdog_s are"):
        parse_config("[daemon]\ncall_watchdog = 1\ncall_watchdog_s = 2", warn=lambda line: None)


def test_the_new_names_raise_no_warning_and_every_duration_ends_in_s() -> None:
    warned: list[str] = []
    parse_config(EXAMPLE.read_text(), warn=warned.append)
    assert warned == []
    for section_name, section in msgspec.structs.asdict(Config()).items():
        for key in msgspec.structs.asdict(section):
            assert not key.endswith(("_ms", "_us", "_seconds")), f"{section_name}.{key}"


def test_an_old_name_warns_on_stderr_by_default(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "npud.toml"
    path.write_text("[pool]\nidle_seconds = 5.0\n")
    assert load_config(path).pool.idle_s == 5.0
    assert capsys.readouterr().err == (
        f"npud: warning: {path}: pool.idle_seconds is now pool.idle_s: rename it; "
        "npud 0.3 will refuse the old name\n"
    )


def test_unreadable_files_are_config_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read"):
        load_config(tmp_path / "missing.toml")
    binary = tmp_path / "bad.toml"
    binary.write_bytes(b"\xff\xfe")
    with pytest.raises(ConfigError, match="not UTF-8"):
        load_config(binary)


def test_socket_mode_is_octal() -> None:
    assert parse_config("[daemon]\nsocket_mode = '0640'").daemon.socket_mode_bits == 0o640


def test_the_largest_buffer_setting_fits_the_wire() -> None:
    """[client_limits] max_buffer_size: at most what the wire can name, by default room
    for llama.cpp's default 1 GiB chunk with its guard page (and v81's 2 MiB rounding),
    inside the per-connection bytes."""
    assert npud_config.MAX_BUFFER_SIZE == p.MAX_BUFFER_SIZE
    limits = Config().client_limits
    chunk = ((1 << 30) + 4096 + (2 << 20) - 1) // (2 << 20) * (2 << 20)
    assert chunk <= limits.max_buffer_size <= p.MAX_BUFFER_SIZE
    assert limits.max_buffer_size <= limits.max_buffer_bytes
    with pytest.raises(ConfigError):
        parse_config(f"[client_limits]\nmax_buffer_size = {p.MAX_BUFFER_SIZE + 1}\n")
