"""A running daemon carries no cryptography and no helper process: the check ran and went."""

from __future__ import annotations

from pathlib import Path

from tests.e2e.daemon import RawPeer, start_npud


def test_a_serving_daemon_has_not_mapped_cryptography_and_has_no_child(tmp_path: Path) -> None:
    daemon = start_npud(tmp_path)
    try:
        peer = RawPeer.connect(daemon.socket_path)
        try:
            assert peer.hello().server_version
        finally:
            peer.close()
        maps = Path(f"/proc/{daemon.pid}/maps").read_text()
        assert "cryptography" not in maps  # its Rust binding was only in the verifier
        children = Path(f"/proc/{daemon.pid}/task/{daemon.pid}/children").read_text().split()
        # The verifier was reaped; the one child left is the emulator's PD zygote, whose
        # own children run the DSP processes (docs/emulator.md, PD processes).
        commands = [Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0") for pid in children]
        assert [command[1:4] for command in commands] == [[b"-s", b"-B", b"-m"]]
        assert commands[0][4] == b"npud.sim.zygote"
        assert "shell verification" not in daemon.log()
    finally:
        assert daemon.stop() == 0
