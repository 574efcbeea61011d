"""Exposed files: descriptors the daemon lends the DSP's loader for one load, under a
generated name that only apps_std resolves."""

from __future__ import annotations

import contextlib

from npud.fastrpc.kernel.trace_hooks import Record
from npud.fastrpc.reverse.exposed_files import ExposedFile
from npud.fastrpc.session._trace import Tracing, file_record


class Exposing(Tracing):
    """Lending file descriptors to the DSP (see ExposedFiles)."""

    def expose_file(self, fd: int, *, suffix: str = "") -> ExposedFile:
        """Let the DSP read the regular file open on ``fd`` under a generated name.

        The name (``ExposedFile.name``, ``npud-fd-<hex><suffix>``) is what a
        skel's loader asks the listener's apps_std for; no other name reaches
        the descriptor. The caller keeps ``fd``; the returned ExposedFile owns a
        duplicate and must be closed (it is a context manager) when the load is
        done. ValueError when ``fd`` is not a regular file open for reading.
        """
        hooks = self._hooks
        if hooks is None:
            return self._expose_file(fd, suffix)
        limit = hooks.capture_limit
        args: Record = {"suffix": suffix, "data": None}
        with contextlib.suppress(OSError):  # expose() says what is wrong with the descriptor
            args["data"] = file_record(fd, limit)
        with hooks.operation("expose_file", self._trace_session, **args) as op:
            exposed = self._expose_file(fd, suffix)
            op.result(name=exposed.name)
        session = self._trace_session

        def closed() -> None:
            with hooks.operation("unexpose", session, name=exposed.name):
                pass

        exposed.on_close = closed
        return exposed

    def _expose_file(self, fd: int, suffix: str) -> ExposedFile:
        self._check_usable()
        self._require_process()
        return self._exposed.expose(fd, suffix=suffix)

    @property
    def exposed_files(self) -> int:
        """Descriptors currently lent to the DSP (leak checks)."""
        return len(self._exposed)
