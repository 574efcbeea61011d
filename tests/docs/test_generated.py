"""The man pages and bash completion are generated from the code and are current.

`make docs` (scripts/generate_docs.py) writes them; these tests fail when a
parser or the config schema changed and nobody re-ran it, and check that the
pages are valid roff and the completion really completes.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Final

import msgspec
import pytest

from npu_client import npuctl
from npud.daemon import main
from npud.ops import doctor
from npud.ops.config import Config
from tests.tools import require_tool

REPO: Final = Path(__file__).resolve().parents[2]
GENERATOR: Final = REPO / "scripts" / "generate_docs.py"
MAN: Final = REPO / "man"
COMPLETIONS: Final = REPO / "completions" / "bash"


def load_generator() -> ModuleType:
    """scripts/generate_docs.py as a module (scripts/ is not a package)."""
    if "generate_docs" in sys.modules:
        return sys.modules["generate_docs"]
    spec = importlib.util.spec_from_file_location("generate_docs", GENERATOR)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def roff(option: str) -> str:
    return option.replace("-", "\\-")


def test_the_committed_files_are_what_the_code_generates() -> None:
    result = subprocess.run(
        [sys.executable, str(GENERATOR), "--check"],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr + "\nrun `make docs` and commit the result"


def test_a_stale_file_is_named(tmp_path: Path) -> None:
    generator = load_generator()
    current = tmp_path / "current"
    current.write_text("same")
    assert generator.stale({current: "same", tmp_path / "changed": "new"}) == [tmp_path / "changed"]
    current.write_text("edited by hand")
    assert generator.stale({current: "same"}) == [current]


@pytest.mark.parametrize(
    ("page", "parsers"),
    [
        ("npud.8", [main.build_parser(), doctor.build_parser()]),
        ("npuctl.1", [npuctl.build_parser()]),
    ],
)
def test_every_option_is_in_its_man_page(page: str, parsers: list[object]) -> None:
    text = (MAN / page).read_text()
    generator = load_generator()
    pending = list(parsers)
    while pending:
        parser = pending.pop()
        pending += generator.subcommands(parser).values()
        for action in generator.documented_actions(parser):
            for option in action.option_strings:
                assert f"\\fB{roff(option)}\\fR" in text, (page, option)


def test_every_config_key_is_in_npud_toml_5() -> None:
    text = (MAN / "npud.toml.5").read_text()
    for section, table in msgspec.structs.asdict(Config()).items():
        assert f'.SH "[{section}]"' in text
        for key in msgspec.structs.asdict(table):
            assert f"\\fB{roff(key)}\\fR = " in text, f"{section}.{key}"


def test_the_man_pages_are_valid_roff() -> None:
    groff = require_tool("groff", "groff-base")
    for page in sorted(MAN.iterdir()):
        result = subprocess.run(
            [groff, "-man", "-ww", "-z", str(page)],
            capture_output=True,
            text=True,
            check=False,
            timeout=60,
        )
        assert (result.returncode, result.stderr) == (0, ""), page.name


COMPLETE: Final = """
source "$1"; fn=$2; shift 2
COMP_WORDS=("$@"); COMP_CWORD=$(( ${#COMP_WORDS[@]} - 1 ))
COMP_LINE="$*"; COMP_POINT=${#COMP_LINE}; COMPREPLY=()
"$fn" "${COMP_WORDS[0]}" "${COMP_WORDS[COMP_CWORD]}" "${COMP_WORDS[COMP_CWORD-1]}"
printf '%s\\n' "${COMPREPLY[@]}"
"""


def complete(command: str, *words: str) -> list[str]:
    bash = require_tool("bash", "bash")
    result = subprocess.run(
        [bash, "-c", COMPLETE, "complete", str(COMPLETIONS / command), f"_shtab__{command}",
         command, *words],
        capture_output=True, text=True, check=True, timeout=60, cwd=REPO,
    )  # fmt: skip
    return [line for line in result.stdout.splitlines() if line]


def test_npuctl_completes_its_commands_and_their_options() -> None:
    assert complete("npuctl", "") == [
        "status", "selftest", "metrics", "top", "run", "chain", "llm", "debug"
    ]  # fmt: skip
    assert complete("npuctl", "llm", "--max") == ["--max-tokens"]
    assert complete("npuctl", "me") == ["metrics"]
    assert "--timeout" in complete("npuctl", "--")
    assert complete("npuctl", "metrics", "--o") == ["--output"]
    assert complete("npuctl", "top", "--so") == ["--sort"]
    assert complete("npuctl", "debug", "ss") == ["ssr"]


def test_npud_completes_choices_and_the_doctor() -> None:
    assert complete("npud", "--backend", "") == ["auto", "kernel", "emulator"]
    assert complete("npud", "--log-format", "j") == ["json"]
    assert complete("npud", "doctor", "--j") == ["--json"]
    assert complete("npud", "--config", "pyproj") == ["pyproject.toml"]  # a file name
