"""The zygote: a small single-threaded process that forks one child per emulated PD.

Started by the emulated driver (:mod:`npud.sim.pd_host`) as
``python -m npud.sim.zygote`` with a clean environment, close_fds, stdin and
stdout on /dev/null, in a session of its own and an empty directory as its
working directory. On start it:

1. watches npud's process through a pidfd (and exits at once if npud is
   already gone: its parent pid is not the one it was given);
2. imports what skels need (numpy, the skels and the table that names them,
   onnxruntime through the portal_qnn skel, and the modules of the driver's
   own skels given with ``--preload``) and parses their IDL files, so that
   every child starts with them, their pages shared: a confined child may not
   read them (as root it runs as another user, and a checkout in root's 0700
   home is not that user's to read), so it imports nothing after step 3;
3. drops its privileges for good (:mod:`npud.sim.sandbox`): as root to the
   dedicated uid and gid it was given, otherwise to no capabilities; then
   no_new_privs, umask 077, Landlock where the kernel has it;
4. ignores SIGCHLD, so the kernel reaps its children (no zombie ever
   exists; npud kills children through pidfds, never by pid);
5. says ``Ready`` on its control socket and serves ``Spawn`` requests: each
   forks a child that sets PR_SET_PDEATHSIG (SIGKILL: the zygote is
   single-threaded, so its death is its thread's), limits its private memory
   (``RLIMIT_DATA``, the Spawn's ``memory_limit``), closes every fd but its
   socket and doorbell (and 0-2) and runs :func:`npud.sim.pd_child.serve`.

It exits when its control socket closes (the driver released it, or npud
died) or npud's pidfd says npud exited; its children die with it. It does
not use PR_SET_PDEATHSIG itself: that signal follows the thread that
forked it, and the driver may start the zygote from any thread of npud,
one that ends long before npud does.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import os
import resource
import select
import signal
import socket
import sys
import traceback
from collections.abc import Sequence
from typing import Final, NoReturn

import msgspec

from npud.sim import pd_wire as wire
from npud.sim import sandbox

PRELOAD: Final = (
    "numpy",
    "npud.sim.pd_child",
    "npud.sim.builtin_skels",  # where a built-in skel's pickled factory is found
    "npud.sim.portal_qnn",
    "npud.sim.skels_dspqueue",
    "npud.sim.htp.skel",
)
"""Imported before any fork; a module that cannot be imported is skipped (the child
imports it when a skel needs it, and fails there)."""
PRELOAD_IDL: Final = ("apps_mem", "echo", "npu_test")
"""Parsed before the zygote confines itself (npud.idl keeps what it parsed): the skels
parse their IDL at first use, and the IDL files lie outside what a child may read."""
CHILD_FAILED: Final = 71
MAX_FD: Final = 1 << 20

_SPAWN: Final = msgspec.msgpack.Decoder(wire.Spawn)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m npud.sim.zygote", description=__doc__)
    parser.add_argument("--parent", type=int, required=True, help="npud's pid")
    parser.add_argument("--control", type=int, required=True, help="the control socket's fd")
    parser.add_argument("--uid", type=int, default=None, help="run children as this uid (root)")
    parser.add_argument("--gid", type=int, default=None, help="and this gid")
    parser.add_argument("--no-landlock", action="store_true", help="do not confine the filesystem")
    parser.add_argument(
        "--preload",
        action="append",
        default=[],
        metavar="MODULE",
        help="import this module too before confining (a module of the driver's skels)",
    )
    return parser


def _read_trees() -> list[str]:
    """Where Python code may be imported from: sys.path, the prefixes, and the package
    directories of every module imported so far (editable installs live outside
    sys.path)."""
    trees = {path for path in sys.path if path and os.path.isabs(path)}
    trees |= {sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix}
    for name, module in list(sys.modules.items()):
        path = getattr(module, "__file__", None)
        if "." in name or not isinstance(path, str):
            continue
        trees.add(os.path.dirname(path))
    trees.update(sandbox.SYSTEM_READ_TREES)
    return sorted(trees)


def _confine(uid: int | None, gid: int | None, *, landlock: bool) -> str:
    sandbox.drop_privileges(uid, gid)
    sandbox.set_no_new_privs()
    os.umask(0o077)
    abi = 0
    if landlock:
        abi = sandbox.restrict_filesystem(
            _read_trees(), sandbox.SYSTEM_READ_FILES, sandbox.SYSTEM_WRITE_FILES
        )
    return sandbox.describe(abi)


def _child(
    sock_fd: int, doorbell_fd: int, control: socket.socket, zygote: int, memory_limit: int
) -> NoReturn:
    """In the forked child: never returns."""
    try:
        sandbox.set_parent_death_signal(signal.SIGKILL)
        if os.getppid() != zygote:
            os._exit(0)  # the zygote died between fork and prctl
        if memory_limit:
            # This PD's blow-up ends this PD only: past the limit its allocations fail
            # (MemoryError, fatal in a PD: npud.sim.pd_child), npud and other PDs live.
            resource.setrlimit(resource.RLIMIT_DATA, (memory_limit, memory_limit))
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        control.detach()  # the fd is closed below; the object must not close it again
        keep = sorted((sock_fd, doorbell_fd))
        # The control socket, npud's pidfd, anything an import opened: only 0-2 stay.
        os.closerange(3, keep[0])
        os.closerange(keep[0] + 1, keep[1])
        os.closerange(keep[1] + 1, MAX_FD)
        from npud.sim import pd_child  # noqa: PLC0415  (preloaded: no import happens here)

        pd_child.serve(sock_fd, doorbell_fd)
    except BaseException:
        traceback.print_exc()
    os._exit(CHILD_FAILED)


def serve(control: socket.socket, watch: int) -> None:
    """Fork a child per Spawn until the control socket closes or npud exits."""
    buffer = bytearray(wire.MESSAGE_MAX)
    poller = select.poll()
    poller.register(control.fileno(), select.POLLIN)
    poller.register(watch, select.POLLIN)
    me = os.getpid()
    while True:
        events = dict(poller.poll())
        if watch in events:
            return  # npud exited
        try:
            received = wire.receive(control, buffer)
        except wire.ClosedError:
            return
        try:
            spawn = _SPAWN.decode(received.header)
        except msgspec.DecodeError:
            received.close_fds()
            return  # not the driver talking: stop
        if len(received.fds) != 2:
            received.close_fds()
            continue
        sock_fd, doorbell_fd = received.fds
        try:
            pid = os.fork()
        except OSError:
            received.close_fds()  # the driver sees the child's socket close: spawn failed
            continue
        if pid == 0:
            _child(sock_fd, doorbell_fd, control, me, spawn.memory_limit)
        received.close_fds()


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    control = socket.socket(fileno=args.control)
    try:
        watch = os.pidfd_open(args.parent)
    except OSError:
        return 0  # npud is already gone
    if os.getppid() != args.parent:
        return 0
    for name in (*PRELOAD, *args.preload):
        with contextlib.suppress(ImportError):
            importlib.import_module(name)
    from npud import idl  # noqa: PLC0415  (after the preloads: the child's pages share it)

    for interface in PRELOAD_IDL:
        idl.load(interface)
    description = _confine(args.uid, args.gid, landlock=not args.no_landlock)
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)
    try:
        wire.send(control, wire.Ready(os.getpid(), description))
        serve(control, watch)
    except wire.ClosedError:
        pass
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
