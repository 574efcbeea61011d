"""The session package's one logger."""

from __future__ import annotations

import logging

log = logging.getLogger("npud.fastrpc.session")
"""One logger for the whole session package (its records keep the module's old name)."""
