"""tests/tools.py: a missing tool skips its test, or fails it under --require-tools (CI)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests import tools


@pytest.fixture
def restore_strictness(pytestconfig: pytest.Config) -> Iterator[None]:
    yield
    tools.set_strict(bool(pytestconfig.getoption("require_tools")))


@pytest.mark.usefixtures("restore_strictness")
def test_a_missing_tool_skips_and_names_its_package() -> None:
    tools.set_strict(False)
    with pytest.raises(pytest.skip.Exception, match=r"apt-get install no-such-package\)"):
        tools.require_tool("no-such-tool-for-npud", "no-such-package")


@pytest.mark.usefixtures("restore_strictness")
def test_under_require_tools_a_missing_tool_fails() -> None:
    tools.set_strict(True)
    with pytest.raises(pytest.fail.Exception, match="--require-tools forbids skipping"):
        tools.require_tool("no-such-tool-for-npud", "no-such-package")
    with pytest.raises(pytest.fail.Exception, match="linux-libc-dev"):
        tools.require_file(Path("/no/such/header.h"), "linux-libc-dev")


def test_a_present_tool_is_returned() -> None:
    assert tools.require_tool("sh", "dash").endswith("/sh")


@pytest.mark.parametrize(
    ("value", "strict"), [("1", True), ("yes", True), ("0", False), ("", False)]
)
def test_the_environment_switch(monkeypatch: pytest.MonkeyPatch, value: str, strict: bool) -> None:
    monkeypatch.setenv(tools.REQUIRE_TOOLS_ENV, value)
    assert tools.strict_from_environment() is strict
