#!/usr/bin/env python3
"""Checks of npud's libcdsprpc on a device, for scripts/hw_bringup.sh (its library step).

Each check prints one ``ANSWER name: ...`` line per answer; docs/hardware.md ("What
only a device can tell") says which open question each answer decides. The library
is loaded with ctypes and reaches npud through ``NPUD_SOCKET``, as a program does.

* ``maps``: fastrpc_mmap of a 1 MiB rpcmem buffer with each flag FASTRPC_MAP_FD (2),
  FD_DELAYED (3), FD_EXTENDED (17) and FD_DELAYED_EXTENDED (18), and its munmap;
* ``caps``: capability attributes 1-11 and 128-131 (the dspsignal ones newer
  llama.cpp reads) as the library answers them, and as the kernel does when the
  device node opens (``--node``);
* ``rpcmem``: a buffer of ``--mib`` MiB (300: past llama.cpp's 256 MiB chunks),
  written at both ends, its fd, and mapped into the DSP with FASTRPC_MAP_FD.

Exit status: 0 when the library works at all (a 1 MiB buffer maps with
FASTRPC_MAP_FD); 1 otherwise; 64 for a bad command line; 69 when the library
cannot be loaded. A refused extended flag or large buffer is an answer, not a failure.
"""

from __future__ import annotations

import argparse
import ctypes
import errno
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Final

CDSP_DOMAIN_ID: Final = 3
RPCMEM_HEAP_ID_SYSTEM: Final = 25
RPCMEM_DEFAULT_FLAGS: Final = 1
DSPRPC_GET_DSP_INFO: Final = 2
MAP_FLAGS: Final = {2: "FD", 3: "FD_DELAYED", 17: "FD_EXTENDED", 18: "FD_DELAYED_EXTENDED"}
ATTRIBUTES: Final = (*range(1, 12), 128, 129, 130, 131)
EX_USAGE: Final = 64
EX_UNAVAILABLE: Final = 69
MIB: Final = 1 << 20


class Capability(ctypes.Structure):
    """struct remote_dsp_capability (remote.h)."""

    _fields_ = (
        ("domain", ctypes.c_uint32),
        ("attribute_ID", ctypes.c_uint32),
        ("capability", ctypes.c_uint32),
    )


class Library:
    """The FastRPC calls the checks make, typed."""

    def __init__(self, path: Path) -> None:
        lib = ctypes.CDLL(str(path))
        self.rpcmem_alloc = lib.rpcmem_alloc
        self.rpcmem_alloc.argtypes = (ctypes.c_int, ctypes.c_uint32, ctypes.c_int)
        self.rpcmem_alloc.restype = ctypes.c_void_p
        self.rpcmem_free = lib.rpcmem_free
        self.rpcmem_free.argtypes = (ctypes.c_void_p,)
        self.rpcmem_free.restype = None
        self.rpcmem_to_fd = lib.rpcmem_to_fd
        self.rpcmem_to_fd.argtypes = (ctypes.c_void_p,)
        self.rpcmem_to_fd.restype = ctypes.c_int
        self.fastrpc_mmap = lib.fastrpc_mmap
        self.fastrpc_mmap.argtypes = (
            ctypes.c_int,
            ctypes.c_int,
            ctypes.c_void_p,
            ctypes.c_int,
            ctypes.c_size_t,
            ctypes.c_int,
        )
        self.fastrpc_mmap.restype = ctypes.c_int
        self.fastrpc_munmap = lib.fastrpc_munmap
        self.fastrpc_munmap.argtypes = (
            ctypes.c_int,
            ctypes.c_int,
            ctypes.c_void_p,
            ctypes.c_size_t,
        )
        self.fastrpc_munmap.restype = ctypes.c_int
        self.remote_handle_control = lib.remote_handle_control
        self.remote_handle_control.argtypes = (ctypes.c_uint32, ctypes.c_void_p, ctypes.c_uint32)
        self.remote_handle_control.restype = ctypes.c_int

    def alloc(self, size: int) -> int | None:
        pointer: int | None = self.rpcmem_alloc(RPCMEM_HEAP_ID_SYSTEM, RPCMEM_DEFAULT_FLAGS, size)
        return pointer

    def capability(self, attribute: int) -> tuple[int, int]:
        """(result, value) of DSPRPC_GET_DSP_INFO for ``attribute``."""
        cap = Capability(domain=CDSP_DOMAIN_ID, attribute_ID=attribute, capability=0)
        rc = int(self.remote_handle_control(DSPRPC_GET_DSP_INFO, ctypes.byref(cap), 12))
        return rc, int(cap.capability)


def answer(name: str, text: str) -> None:
    print(f"ANSWER {name}: {text}", flush=True)


def result(rc: int) -> str:
    return "0 (ok)" if rc == 0 else f"0x{rc & 0xFFFFFFFF:08x}"


def check_maps(lib: Library) -> bool:
    """Each map flag on a fresh 1 MiB buffer; True when FASTRPC_MAP_FD works."""
    fd_works = False
    for flag, name in MAP_FLAGS.items():
        pointer = lib.alloc(MIB)
        if pointer is None:
            answer(f"fastrpc_mmap {name} ({flag})", "rpcmem_alloc of 1 MiB failed")
            continue
        try:
            fd = int(lib.rpcmem_to_fd(pointer))
            rc = int(lib.fastrpc_mmap(CDSP_DOMAIN_ID, fd, pointer, 0, MIB, flag))
            text = f"{result(rc)}"
            if rc == 0:
                unmapped = int(lib.fastrpc_munmap(CDSP_DOMAIN_ID, fd, pointer, MIB))
                text += f", munmap {result(unmapped)}"
                fd_works = fd_works or (flag == 2 and unmapped == 0)
            answer(f"fastrpc_mmap {name} ({flag})", text)
        finally:
            lib.rpcmem_free(pointer)
    return fd_works


def kernel_capabilities(node: str) -> dict[int, str]:
    """What the kernel's GET_DSP_INFO answers, read directly (npud's own code)."""
    from npud.fastrpc.kernel import abi  # noqa: PLC0415  (only for this check)
    from npud.fastrpc.kernel.capabilities import query_capability  # noqa: PLC0415
    from npud.fastrpc.kernel.driver import KernelDriver  # noqa: PLC0415

    driver = KernelDriver()
    fd = driver.open(node, os.O_RDONLY | os.O_NONBLOCK)
    answers: dict[int, str] = {}
    try:
        for attribute in ATTRIBUTES:
            try:
                value = query_capability(
                    lambda cap: driver.ioctl(fd, abi.FASTRPC_IOCTL_GET_DSP_INFO, cap), attribute
                )
                answers[attribute] = str(value)
            except OSError as exc:
                answers[attribute] = errno.errorcode.get(exc.errno or 0, str(exc.errno))
            except Exception as exc:
                answers[attribute] = str(exc)
    finally:
        driver.close(fd)
    return answers


def check_caps(lib: Library, node: str | None) -> bool:
    kernel: dict[int, str] = {}
    if node is not None:
        try:
            kernel = kernel_capabilities(node)
        except OSError as exc:
            answer("kernel capabilities", f"{node} did not open: {os.strerror(exc.errno or 0)}")
    for attribute in ATTRIBUTES:
        rc, value = lib.capability(attribute)
        library = f"{value}" if rc == 0 else f"result {result(rc)}"
        text = f"library {library}"
        if attribute in kernel:
            text += f", kernel {kernel[attribute]}"
        answer(f"capability {attribute}", text)
    return True


def check_rpcmem(lib: Library, mib: int) -> bool:
    size = mib * MIB
    pointer = lib.alloc(size)
    if pointer is None:
        answer(f"rpcmem {mib} MiB", "rpcmem_alloc returned NULL (NPUD_SHIM_LOG=1 says why)")
        return True
    try:
        memory = (ctypes.c_ubyte * size).from_address(pointer)
        memory[0], memory[size - 1] = 0x5A, 0xA5
        fd = int(lib.rpcmem_to_fd(pointer))
        rc = int(lib.fastrpc_mmap(CDSP_DOMAIN_ID, fd, pointer, 0, size, 2))
        text = f"allocated, fd {fd}, fastrpc_mmap FD {result(rc)}"
        if rc == 0:
            text += f", munmap {result(int(lib.fastrpc_munmap(CDSP_DOMAIN_ID, fd, pointer, size)))}"
        answer(f"rpcmem {mib} MiB", text)
    finally:
        lib.rpcmem_free(pointer)
    return True


def parse(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="hw_checks.py",
        description="Checks of npud's libcdsprpc on a device (scripts/hw_bringup.sh).",
    )
    parser.add_argument("checks", nargs="+", choices=("maps", "caps", "rpcmem"))
    parser.add_argument("--library", type=Path, required=True, help="libcdsprpc.so.1 to load")
    parser.add_argument("--mib", type=int, default=300, help="rpcmem's buffer in MiB (300)")
    parser.add_argument("--node", help="a device node to read the kernel's capabilities from")
    args = parser.parse_args(argv)
    if args.mib <= 0 or args.mib > 4096:
        parser.error(f"--mib {args.mib}: 1 to 4096")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    try:
        args = parse(sys.argv[1:] if argv is None else argv)
    except SystemExit as exc:
        return EX_USAGE if exc.code else 0
    try:
        lib = Library(args.library)
    except (OSError, AttributeError) as exc:
        print(f"hw_checks.py: {args.library}: {exc}", file=sys.stderr)
        return EX_UNAVAILABLE
    checks: dict[str, Callable[[], bool]] = {
        "maps": lambda: check_maps(lib),
        "caps": lambda: check_caps(lib, args.node),
        "rpcmem": lambda: check_rpcmem(lib, args.mib),
    }
    works = all([checks[name]() for name in args.checks])
    return 0 if works else 1


if __name__ == "__main__":
    sys.exit(main())
