"""The README's client example runs as written against a real npud."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from tests.e2e.daemon import start_npud

README = Path(__file__).resolve().parents[2] / "README.md"


def test_the_readme_client_examples_run(tmp_path: Path) -> None:
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), re.DOTALL)
    assert len(blocks) == 2
    daemon = start_npud(tmp_path)
    try:
        echo, vad = (
            subprocess.run(
                [sys.executable, "-c", block],
                env={**os.environ, "NPUD_SOCKET": str(daemon.socket_path)},
                capture_output=True,
                text=True,
                timeout=60,
                check=False,
            )
            for block in blocks
        )
    finally:
        assert daemon.stop() == 0
    assert echo.returncode == 0, echo.stderr
    assert echo.stdout == "b'hello'\n"
    assert vad.returncode == 0, vad.stderr
    probabilities = [float(line) for line in vad.stdout.splitlines()]
    assert len(probabilities) == 3
    assert all(0 <= value < 0.5 for value in probabilities)  # silence


def test_the_readme_commands_exist() -> None:
    text = README.read_text()
    makefile = (README.parent / "Makefile").read_text()
    for target in ("run", "test", "bench"):
        assert f"make {target}" in text
        assert f"\n{target}:" in makefile
