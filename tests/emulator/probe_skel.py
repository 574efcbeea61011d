"""A skel for the PD process tests: it reports, from inside the simulated DSP, what its
process can do (open a path, list its directory, signal a pid) and misbehaves on request
(spins, raises).

It is importable by name (``tests.emulator.probe_skel.ProbeSkel``), as a factory sent to a
PD child must be, and imports nothing heavy. The descriptor ``libprobe_skel.so`` is
written by :func:`write_descriptor`; ``SimConfig(skels=PROBE_SKELS)`` installs it.
"""

from __future__ import annotations

import os
import struct
import time
from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Final

from npud.sim.builtin_skels import BUILTIN_SKELS
from npud.sim.skels import Skel, SkelCall, SkelMethod

URI: Final = "file:///libprobe_skel.so?probe_skel_handle_invoke&_modver=1.0&_dom=cdsp"
DESCRIPTOR: Final = "NPUD-SIM-SKEL 1\nskel=probe\nsymbols=probe_skel_handle_invoke\n"

# Domain method numbers (user methods from 2) and their scalars words.
SC_OPEN: Final = 0x02010100  # in: path; out: {s32 errno}
SC_IDENTITY: Final = 0x03000100  # out: {u32 pid, u32 uid, u32 gid, s32 listdir, s32 create}
SC_SPIN: Final = 0x04010000  # in: {u32 milliseconds, 0: forever}; burns this process's CPU
SC_BY_FD: Final = 0x05010100  # in: {s32 fd}; out: the first bytes of that MEM_MAP
SC_SIGNAL: Final = 0x06010100  # in: {u32 pid}; out: {s32 errno} of kill(pid, 0)
SC_RAISE: Final = 0x07000000  # raises
SC_THREADS: Final = 0x08000100  # out: {u32 threads of this process}
SC_LIE_ABOUT_WORK: Final = 0x09010000  # in: {u32 0: begin unmetered, 1: end a piece never begun}

IDENTITY: Final = struct.Struct("<IIIii")


def _errno_of(action: object) -> int:
    try:
        action()  # type: ignore[operator]
    except OSError as exc:
        return exc.errno or -1
    return 0


class ProbeSkel(Skel):
    name = "probe"

    def __init__(self) -> None:
        self._methods = {
            0: SkelMethod("open", 1, 1, self._open),
            1: SkelMethod("identity", 0, 1, self._identity),
            2: SkelMethod("spin", 1, 0, self._spin),
            3: SkelMethod("by_fd", 1, 1, self._by_fd),
            4: SkelMethod("signal", 1, 1, self._signal),
            5: SkelMethod("raise", 0, 0, self._raise),
            6: SkelMethod("threads", 0, 1, self._threads),
            7: SkelMethod("lie_about_work", 1, 0, self._lie_about_work),
        }

    def methods(self) -> Mapping[int, SkelMethod]:
        return self._methods

    @staticmethod
    def _open(call: SkelCall) -> int:
        path = bytes(call.inputs[0]).decode()

        def attempt() -> None:
            os.close(os.open(path, os.O_RDONLY))

        call.outputs[0][:] = struct.pack("<i", _errno_of(attempt))
        return 0

    @staticmethod
    def _identity(call: SkelCall) -> int:
        def create() -> None:
            fd = os.open("probe-file", os.O_CREAT | os.O_WRONLY, 0o600)
            os.close(fd)
            os.unlink("probe-file")

        listing = _errno_of(lambda: os.listdir("."))
        call.outputs[0][:] = IDENTITY.pack(
            os.getpid(), os.getuid(), os.getgid(), listing, _errno_of(create)
        )
        return 0

    @staticmethod
    def _spin(call: SkelCall) -> int:
        (milliseconds,) = struct.unpack("<I", call.inputs[0])
        deadline = time.monotonic() + milliseconds / 1000 if milliseconds else None
        total = 0
        while deadline is None or time.monotonic() < deadline:
            total += sum(range(1000))  # a hung skel: it never waits, it only burns
        return 0

    @staticmethod
    def _by_fd(call: SkelCall) -> int:
        from npud.sim import pd_child

        (fd,) = struct.unpack("<i", call.inputs[0])
        runtime = pd_child.current_runtime()
        found = runtime.memory.find_by_fd(fd) if runtime is not None else None
        if found is None:
            return 0x8000040E  # AEE_EBADPARM
        memory_id, offset, length = found
        memory = runtime.memory.acquire(memory_id) if runtime is not None else None
        assert memory is not None
        assert runtime is not None
        try:
            count = min(len(call.outputs[0]), length)
            call.outputs[0][:count] = memory.mapping[offset : offset + count]
        finally:
            runtime.memory.release(memory)
        return 0

    @staticmethod
    def _signal(call: SkelCall) -> int:
        (pid,) = struct.unpack("<I", call.inputs[0])
        call.outputs[0][:] = struct.pack("<i", _errno_of(lambda: os.kill(pid, 0)))
        return 0

    @staticmethod
    def _raise(call: SkelCall) -> int:
        raise RuntimeError("the probe skel was asked to raise")

    @staticmethod
    def _lie_about_work(call: SkelCall) -> int:
        """A broken child: pieces of work the driver never allowed or never saw begin
        (through the child's own call object, which SkelCall.computing would not do)."""
        (mode,) = struct.unpack("<I", call.inputs[0])
        own = call.host_files  # in a PD child: the call's object, with begin and end
        if mode == 0:
            own.begin(True)  # type: ignore[attr-defined]
            call.work(0.001)  # the next message: the driver reads the begin first
        else:
            own.end(99, 0.001)  # type: ignore[attr-defined]
        return 0

    @staticmethod
    def _threads(call: SkelCall) -> int:
        count = len(os.listdir("/proc/self/task")) if os.path.isdir("/proc/self/task") else 0
        call.outputs[0][:] = struct.pack("<I", count)
        return 0


PROBE_SKELS: Final = MappingProxyType({**BUILTIN_SKELS, "probe": ProbeSkel})


def write_descriptor(directory: Path) -> Path:
    path = directory / "libprobe_skel.so"
    path.write_text(DESCRIPTOR)
    return path
