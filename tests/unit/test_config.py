"""Configuration: the shipped example is complete and correct; bad input names its key."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest

from npud.config import Config, ConfigError, load_config, parse_config

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
        ("[daemon]\nsockt = 1", "unknown field `sockt` - at `$.daemon`"),
        ("[nope]\n", "unknown field `nope`"),
        ("[client_limits]\nmax_buffers = -1", "at `$.client_limits.max_buffers`"),
        ("[daemon]\nsocket_mode = '999'", "at `$.daemon.socket_mode`"),
        ("[backend]\nkind = 'gpu'", "at `$.backend.kind`"),
        ("[backend]\nlanes = 2", "unknown field `lanes` - at `$.backend`"),
        ("[scheduler]\ndsp_slots = 0", "at `$.scheduler.dsp_slots`"),
        ("[scheduler]\nmode = 'lifo'", "at `$.scheduler.mode`"),
        ("[scheduler]\ndsp_slots = 2\nrealtime_reserve = 2", "leaves no slot of 2"),
        (
            "[client_limits]\nmax_calls_in_flight = 70000",
            "at `$.client_limits.max_calls_in_flight`",
        ),
        ("[access]\nallow_uids = ['root']", "at `$.access.allow_uids[0]`"),
        ("[daemon", "not valid TOML"),
    ],
)
def test_bad_values_name_the_key(text: str, message: str) -> None:
    with pytest.raises(ConfigError, match=r"^<config>: ") as caught:
        parse_config(text)
    assert message in str(caught.value)


def test_unreadable_files_are_config_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read"):
        load_config(tmp_path / "missing.toml")
    binary = tmp_path / "bad.toml"
    binary.write_bytes(b"\xff\xfe")
    with pytest.raises(ConfigError, match="not UTF-8"):
        load_config(binary)


def test_socket_mode_is_octal() -> None:
    assert parse_config("[daemon]\nsocket_mode = '0640'").daemon.socket_mode_bits == 0o640
