"""The attack bench's processes of other users: a child forked to run as a uid, and
the lines of JSON it and the bench tell each other."""

from __future__ import annotations

import contextlib
import json
import os
import sys
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO


@dataclass
class Forked:
    """A child running as another user; lines of JSON to and from it."""

    pid: int
    to_child: BinaryIO
    from_child: BinaryIO

    def say(self, line: str) -> None:
        self.to_child.write(line.encode() + b"\n")
        self.to_child.flush()

    def hear(self) -> Any:
        line = self.from_child.readline()
        if not line:
            raise RuntimeError("a child of the attack bench ended without an answer")
        return json.loads(line)


@contextlib.contextmanager
def as_user(
    uid: int, socket_path: Path, work: Callable[[Path, BinaryIO, BinaryIO], None]
) -> Iterator[Forked]:
    """``work(socket, from parent, to parent)`` in a forked child running as ``uid``; the
    socket's directory is reached through an fd (its parents' modes do not matter)."""
    directory = os.open(socket_path.parent, os.O_PATH)
    down_r, down_w = os.pipe()
    up_r, up_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        code = 0
        try:
            os.close(down_w)
            os.close(up_r)
            os.setgroups([])
            os.setgid(uid)
            os.setuid(uid)
            path = Path(f"/proc/self/fd/{directory}/{socket_path.name}")
            with open(down_r, "rb") as inbox, open(up_w, "wb") as outbox:
                work(path, inbox, outbox)
        except BaseException:
            traceback.print_exc()  # the parent hears of it as a child that ended unasked
            sys.stderr.flush()
            code = 1
        finally:
            os._exit(code)
    os.close(directory)
    os.close(down_r)
    os.close(up_w)
    child = Forked(pid, open(down_w, "wb"), open(up_r, "rb"))  # noqa: SIM115 - closed below
    try:
        yield child
    finally:
        child.to_child.close()
        child.from_child.close()
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, 0)


def tell(outbox: BinaryIO, value: object) -> None:
    outbox.write(json.dumps(value).encode() + b"\n")
    outbox.flush()
