"""How the device node in use is named: the emulator's nodes are not in /dev."""

from __future__ import annotations

from npud.ops.backend import select_profile
from npud.ops.config import Config


def test_the_emulators_node_is_named_as_emulated() -> None:
    profile = select_profile(Config(), "emulator")
    label = profile.device_label("/dev/fastrpc-cdsp-secure")
    assert label == "/dev/fastrpc-cdsp-secure (emulated)"


def test_a_real_node_and_no_node_are_shown_as_they_are() -> None:
    assert select_profile(Config(), "kernel").device_label("/dev/fastrpc-cdsp") == (
        "/dev/fastrpc-cdsp"
    )
    assert select_profile(Config(), "emulator").device_label("") == ""
