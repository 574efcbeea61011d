"""What confines the PD processes: credentials, capabilities, no_new_privs, Landlock.

Used by the zygote (:mod:`npud.sim.zygote`) on itself before it forks any
child, so every child inherits it:

* :func:`drop_privileges`: as root, to a dedicated uid and gid
  (``setgroups([])``, ``setgid``, ``setuid``), after emptying the capability
  bounding set; otherwise the same uid without any capability (ambient,
  inheritable, permitted, effective);
* :func:`set_no_new_privs`: no execve can give anything back (setuid files,
  file capabilities);
* :func:`restrict_filesystem`: where the kernel has Landlock, the process may
  read the directories it needs to import Python code (and a few system
  files), write ``/dev/null``, and nothing else: npud's configuration, keys,
  sockets and state, the clients' files and every home directory are out of
  reach whatever the uid. The same ruleset forbids TCP (Landlock ABI 4) and
  signals and abstract Unix sockets outside the sandbox (ABI 6).

Everything goes through libc with ctypes, as the rest of the emulator does.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import functools
import os
import struct
from collections.abc import Iterable
from typing import Final

PR_SET_PDEATHSIG: Final = 1
PR_CAPBSET_DROP: Final = 24
PR_SET_NO_NEW_PRIVS: Final = 38
PR_GET_NO_NEW_PRIVS: Final = 39
PR_CAP_AMBIENT: Final = 47
PR_CAP_AMBIENT_CLEAR_ALL: Final = 4
LINUX_CAPABILITY_VERSION_3: Final = 0x20080522
CAP_SETPCAP: Final = 8
CAP_LAST_CAP_PATH: Final = "/proc/sys/kernel/cap_last_cap"

# Landlock (include/uapi/linux/landlock.h); the syscall numbers are the generic table's,
# the same on x86_64 and aarch64.
SYS_LANDLOCK_CREATE_RULESET: Final = 444
SYS_LANDLOCK_ADD_RULE: Final = 445
SYS_LANDLOCK_RESTRICT_SELF: Final = 446
LANDLOCK_CREATE_RULESET_VERSION: Final = 1
LANDLOCK_RULE_PATH_BENEATH: Final = 1
FS_EXECUTE: Final = 1 << 0
FS_WRITE_FILE: Final = 1 << 1
FS_READ_FILE: Final = 1 << 2
FS_READ_DIR: Final = 1 << 3
FS_ABI1: Final = (1 << 13) - 1  # EXECUTE .. MAKE_SYM
FS_REFER: Final = 1 << 13  # ABI 2
FS_TRUNCATE: Final = 1 << 14  # ABI 3
FS_IOCTL_DEV: Final = 1 << 15  # ABI 5
FILE_RIGHTS: Final = FS_EXECUTE | FS_WRITE_FILE | FS_READ_FILE | FS_TRUNCATE | FS_IOCTL_DEV
NET_BIND_TCP: Final = 1 << 0  # ABI 4
NET_CONNECT_TCP: Final = 1 << 1
SCOPE_ABSTRACT_UNIX_SOCKET: Final = 1 << 0  # ABI 6
SCOPE_SIGNAL: Final = 1 << 1
READ_TREE: Final = FS_EXECUTE | FS_READ_FILE | FS_READ_DIR

_RULESET_ATTR: Final = struct.Struct("<QQQ")  # handled_access_fs, handled_access_net, scoped
_PATH_BENEATH_ATTR: Final = struct.Struct("<Qi")  # packed: allowed_access, parent_fd
_CAP_HEADER: Final = struct.Struct("<Ii")  # version, pid
_CAP_DATA: Final = struct.Struct("<IIIIII")  # two of {effective, permitted, inheritable}

SYSTEM_READ_TREES: Final = (
    "/usr",
    "/lib",
    "/lib32",
    "/lib64",
    "/etc/ld.so.conf.d",
    "/proc",
    "/sys/devices/system/cpu",
    "/sys/fs/cgroup",
)
"""Read-only for every PD: shared libraries, the CPU's description (onnxruntime and
numpy size their thread pools from it); /proc's files of other processes stay behind
ptrace checks, which Landlock denies across its boundary."""
SYSTEM_READ_FILES: Final = (
    "/etc/ld.so.cache",
    "/etc/ld.so.conf",
    "/etc/localtime",
    "/dev/urandom",
    "/dev/random",
    "/dev/zero",
)
SYSTEM_WRITE_FILES: Final = ("/dev/null",)


@functools.cache
def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)


def _check(result: int, what: str) -> int:
    if result < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")
    return result


def prctl(option: int, arg2: int = 0, arg3: int = 0, arg4: int = 0, arg5: int = 0) -> int:
    function = _libc().prctl
    function.restype = ctypes.c_int
    function.argtypes = (ctypes.c_int, *([ctypes.c_ulong] * 4))
    return _check(function(option, arg2, arg3, arg4, arg5), f"prctl({option})")


def set_parent_death_signal(signal: int) -> None:
    """The kernel sends ``signal`` when the parent *thread* ends (prctl(2)): only for
    children of a single-threaded parent."""
    prctl(PR_SET_PDEATHSIG, signal)


def set_no_new_privs() -> None:
    prctl(PR_SET_NO_NEW_PRIVS, 1)


def no_new_privs() -> bool:
    return prctl(PR_GET_NO_NEW_PRIVS) == 1


def _last_cap() -> int:
    try:
        with open(CAP_LAST_CAP_PATH, "rb") as file:
            return int(file.read())
    except (OSError, ValueError):
        return 63


def _capset_empty() -> None:
    header = ctypes.create_string_buffer(_CAP_HEADER.pack(LINUX_CAPABILITY_VERSION_3, 0))
    data = ctypes.create_string_buffer(_CAP_DATA.pack(0, 0, 0, 0, 0, 0))
    function = _libc().capset
    function.restype = ctypes.c_int
    function.argtypes = (ctypes.c_void_p, ctypes.c_void_p)
    _check(function(ctypes.addressof(header), ctypes.addressof(data)), "capset")


def _effective_capabilities() -> int:
    with open("/proc/self/status", "rb") as status:
        for line in status:
            if line.startswith(b"CapEff:"):
                return int(line.split()[1], 16)
    return 0


def drop_privileges(uid: int | None, gid: int | None) -> None:
    """Become ``uid``/``gid`` with no supplementary groups (root only), then hold no
    capability at all. None: keep the credentials, drop the capabilities."""
    if _effective_capabilities() & (1 << CAP_SETPCAP):
        # Empty the bounding set while CAP_SETPCAP allows it: nothing regains a capability.
        for capability in range(_last_cap() + 1):
            try:
                prctl(PR_CAPBSET_DROP, capability)
            except OSError as exc:
                if exc.errno != errno.EINVAL:  # a number this kernel does not know
                    raise
    try:
        prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL)
    except OSError as exc:
        if exc.errno != errno.EINVAL:  # kernels before 4.3 have no ambient set
            raise
    if uid is not None and gid is not None:
        os.setgroups([])
        os.setgid(gid)
        os.setuid(uid)  # clears the permitted and effective sets (no keepcaps)
    _capset_empty()


def landlock_abi() -> int:
    """The kernel's Landlock ABI version; 0 without Landlock (or disabled)."""
    function = _libc().syscall
    function.restype = ctypes.c_long
    result = function(
        ctypes.c_long(SYS_LANDLOCK_CREATE_RULESET),
        ctypes.c_void_p(None),
        ctypes.c_size_t(0),
        ctypes.c_uint32(LANDLOCK_CREATE_RULESET_VERSION),
    )
    return max(int(result), 0)


def restrict_filesystem(
    read_trees: Iterable[str], read_files: Iterable[str], write_files: Iterable[str]
) -> int:
    """Landlock this process: read beneath ``read_trees``, read ``read_files``, read and
    write ``write_files``; nothing else of the filesystem, no TCP, no signals or abstract
    sockets out of the sandbox (as far as the kernel's ABI goes). Paths that do not exist
    are skipped. Returns the ABI used, 0 when the kernel has no Landlock (nothing done).
    Needs no_new_privs (or CAP_SYS_ADMIN)."""
    abi = landlock_abi()
    if abi <= 0:
        return 0
    handled_fs = FS_ABI1
    if abi >= 2:
        handled_fs |= FS_REFER
    if abi >= 3:
        handled_fs |= FS_TRUNCATE
    if abi >= 5:
        handled_fs |= FS_IOCTL_DEV
    handled_net = NET_BIND_TCP | NET_CONNECT_TCP if abi >= 4 else 0
    scoped = SCOPE_ABSTRACT_UNIX_SOCKET | SCOPE_SIGNAL if abi >= 6 else 0
    size = 8 if abi < 4 else 16 if abi < 6 else 24
    attr = ctypes.create_string_buffer(_RULESET_ATTR.pack(handled_fs, handled_net, scoped), 24)
    syscall = _libc().syscall
    syscall.restype = ctypes.c_long
    ruleset = _check(
        syscall(
            ctypes.c_long(SYS_LANDLOCK_CREATE_RULESET),
            ctypes.c_void_p(ctypes.addressof(attr)),
            ctypes.c_size_t(size),
            ctypes.c_uint32(0),
        ),
        "landlock_create_ruleset",
    )
    try:
        rules = [(path, READ_TREE & handled_fs) for path in read_trees]
        rules += [(path, FS_READ_FILE) for path in read_files]
        rules += [(path, FS_READ_FILE | FS_WRITE_FILE) for path in write_files]
        for path, access in rules:
            _add_rule(ruleset, path, access)
        _check(
            syscall(ctypes.c_long(SYS_LANDLOCK_RESTRICT_SELF), ctypes.c_int(ruleset), 0),
            "landlock_restrict_self",
        )
    finally:
        os.close(ruleset)
    return abi


def _add_rule(ruleset: int, path: str, access: int) -> None:
    try:
        fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
    except OSError:
        return  # absent here (no /lib32, a venv without that directory...)
    try:
        if not os.path.isdir(path):
            access &= FILE_RIGHTS
        attr = ctypes.create_string_buffer(_PATH_BENEATH_ATTR.pack(access, fd), 12)
        syscall = _libc().syscall
        syscall.restype = ctypes.c_long
        _check(
            syscall(
                ctypes.c_long(SYS_LANDLOCK_ADD_RULE),
                ctypes.c_int(ruleset),
                ctypes.c_int(LANDLOCK_RULE_PATH_BENEATH),
                ctypes.c_void_p(ctypes.addressof(attr)),
                ctypes.c_uint32(0),
            ),
            f"landlock_add_rule({path})",
        )
    finally:
        os.close(fd)


def describe(landlock: int) -> str:
    """One line for the log: who the process is and what confines it."""
    parts = [f"uid {os.getuid()} gid {os.getgid()}", f"capabilities {_effective_capabilities():#x}"]
    parts.append("no_new_privs" if no_new_privs() else "new privileges allowed")
    parts.append(f"Landlock ABI {landlock}" if landlock else "no Landlock")
    return ", ".join(parts)
