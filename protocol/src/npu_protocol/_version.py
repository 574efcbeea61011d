"""The version of npud, npu-client and npu-protocol: written here once, released together.

``npu_client/_version.py`` and ``npud/_version.py`` are symbolic links to this
file, and each ``pyproject.toml`` reads it (``[tool.setuptools.dynamic]``), so
the three distributions, their ``__version__`` and ``--version`` always agree.
After a change of the first two numbers, update the ``~=`` pins between the
three packages (tests/unit/test_version.py says so).
"""

__version__ = "0.1.0"
