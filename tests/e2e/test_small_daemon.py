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
        assert children == []  # the verifier was reaped
        assert "shell verification" not in daemon.log()
    finally:
        assert daemon.stop() == 0
