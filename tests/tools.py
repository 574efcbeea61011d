"""The command-line tools some tests need, and what to do when one is missing.

A missing tool skips its tests with the package that provides it, and
``scripts/test-deps.sh`` (run by ``make test``) installs those packages when
run as root. ``.ci/run`` sets ``NPUD_REQUIRE_TOOLS=1`` (or pass
``--require-tools``): then a missing tool fails the test instead, so CI can
never pass by skipping what it was meant to check.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Final, NoReturn

import pytest

REQUIRE_TOOLS_ENV: Final = "NPUD_REQUIRE_TOOLS"

_strict = False


def set_strict(strict: bool) -> None:
    """Called once by conftest.py with ``--require-tools`` or ``$NPUD_REQUIRE_TOOLS``."""
    global _strict  # noqa: PLW0603 - one switch for the session, set before any test runs
    _strict = strict


def strict_from_environment() -> bool:
    return os.environ.get(REQUIRE_TOOLS_ENV, "") not in ("", "0")


def missing(what: str, package: str) -> NoReturn:
    """Skip (or, under --require-tools, fail) the running test: ``what`` is not installed."""
    message = (
        f"{what} is not installed: `make test` installs it as root (or apt-get install {package})"
    )
    if _strict:
        pytest.fail(f"{message}; --require-tools forbids skipping", pytrace=False)
    pytest.skip(message)


def require_tool(name: str, package: str) -> str:
    """The path of the executable ``name``, provided by the Debian ``package``."""
    path = shutil.which(name)
    if path is None:
        missing(name, package)
    return path


def require_file(path: Path, package: str) -> Path:
    """``path`` (a header, a data file), provided by the Debian ``package``."""
    if not path.exists():
        missing(str(path), package)
    return path
