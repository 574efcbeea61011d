"""The emulator's cost per invoke, at the FastRpcSession level (no daemon, no socket).

Rows (each round times ``calls`` echoes of 64 bytes per variant, variants
interleaved; a round's figure is the median call):

* ``emulator.slice_echo``: input and output are slices of a DMA-BUF. Baseline:
  the same session code on an emulator with ``SimConfig(address_cache=False,
  procmap_query=False)``, the lookup path before the cache (every argument
  read ``/proc/self/maps`` and every call mapped the buffer). Ratio: old time
  / new time, how many times faster. Goal: the slice echo itself <= 350 µs.
* ``emulator.inline_echo``: input and output inline (the emulated kernel
  copies them). Baseline: the copies such a call needs done bare, three
  ``process_vm_readv``/``process_vm_writev`` calls through ctypes (argument
  array, inputs, output). Ratio: invoke time / bare copies, what the
  emulated kernel and DSP cost beyond the unavoidable copies.
* ``emulator.slice_vs_inline``: the slice echo over the inline echo, from the
  rounds above: a dma-buf argument should cost no more than a copied one.
* ``emulator.pd_inline_echo`` and ``emulator.pd_slice_echo``: the same echoes
  with the skel in the DSP process's child process (``pd_isolation="process"``,
  the default) over the skel on the caller's thread (``"thread"``), sessions of
  one run, interleaved round by round. Ratio: process / thread, what running a
  PD in its own process costs per invoke (two process wake-ups and the
  messages between them).

The first three rows run with ``pd_isolation="thread"``: they measure the
emulated kernel, whatever process the skel runs in.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import os
import struct
import time
from collections.abc import Callable, Iterator

from bench.harness import Context, Goal, Row, median, ratio_row
from npud.fastrpc.kernel.invoke_args import Capacity, Inline, Slice
from npud.fastrpc.session import FastRpcSession
from npud.ops.backend import DEV_SHELL
from npud.sim import DSP_LIBRARY_DIR, EmulatedDriver, SimConfig

NAME = "emulator"
SUMMARY = (
    "emulator invoke cost at the FastRpcSession level: slice and inline echo; "
    "skels in a PD child process vs on the caller's thread"
)

ECHO_URI = "file:///libecho_skel.so?echo_skel_handle_invoke&_modver=1.0&_dom=cdsp"
ECHO_SC = 0x02020100
SIZE = 64
PRIM = struct.pack("<II", SIZE, SIZE)
DATA = bytes(range(SIZE))
SLICE_GOAL_US = 350.0


@contextlib.contextmanager
def _echo_session(config: SimConfig) -> Iterator[tuple[FastRpcSession, int]]:
    with EmulatedDriver(config) as driver:
        session = FastRpcSession.open(driver, library_path=(DSP_LIBRARY_DIR,))
        try:
            session.load_shell(DEV_SHELL.read_bytes())
            yield session, session.remote_open(ECHO_URI)
        finally:
            session.close()


def _timer(call: Callable[[], None], calls: int) -> Callable[[], float]:
    def one_round() -> float:
        samples = []
        for _ in range(calls):
            start = time.perf_counter_ns()
            call()
            samples.append((time.perf_counter_ns() - start) / 1000)
        return median(samples)

    for _ in range(min(100, calls)):  # warm up
        call()
    return one_round


def _slice_echo(
    session: FastRpcSession, handle: int
) -> tuple[Callable[[], None], Callable[[], None]]:
    buffer = session.alloc(2 * 4096)
    buffer.view()[:SIZE] = DATA

    def call() -> None:
        result = session.invoke(
            handle, ECHO_SC, [Inline(PRIM), Slice(buffer, 0, SIZE)], [Slice(buffer, 4096, SIZE)]
        )
        if result.rc != 0 or bytes(buffer.view()[4096 : 4096 + SIZE]) != DATA:
            raise AssertionError(f"slice echo failed: rc {result.rc:#x}")

    return call, lambda: session.free(buffer)


def _inline_echo(session: FastRpcSession, handle: int) -> Callable[[], None]:
    def call() -> None:
        result = session.invoke(handle, ECHO_SC, [Inline(PRIM), Inline(DATA)], [Capacity(SIZE)])
        if result.rc != 0 or result.outputs[0] != DATA:
            raise AssertionError(f"inline echo failed: rc {result.rc:#x}")

    return call


class _BareCopies:
    """What the emulated kernel must copy for an inline echo, done with bare syscalls."""

    def __init__(self) -> None:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        self._readv, self._writev = libc.process_vm_readv, libc.process_vm_writev
        self._pid = os.getpid()
        self._args = ctypes.create_string_buffer(3 * 24)
        self._prim = ctypes.create_string_buffer(PRIM, len(PRIM))
        self._data = ctypes.create_string_buffer(DATA, SIZE)
        self._out = ctypes.create_string_buffer(SIZE)
        self._scratch = ctypes.create_string_buffer(3 * 24 + len(PRIM) + 2 * SIZE)
        base = ctypes.addressof(self._scratch)

        def iovecs(*pairs: tuple[int, int]) -> ctypes.Array[ctypes.c_char]:
            packed = b"".join(struct.pack("<QQ", address, length) for address, length in pairs)
            return ctypes.create_string_buffer(packed, len(packed))

        self._calls = [
            (self._readv, iovecs((base, 72)), iovecs((ctypes.addressof(self._args), 72)), 1),
            (
                self._readv,
                iovecs((base + 72, len(PRIM)), (base + 80, SIZE)),
                iovecs(
                    (ctypes.addressof(self._prim), len(PRIM)),
                    (ctypes.addressof(self._data), SIZE),
                ),
                2,
            ),
            (
                self._writev,
                iovecs((base + 80, SIZE)),
                iovecs((ctypes.addressof(self._out), SIZE)),
                1,
            ),
        ]

    def __call__(self) -> None:
        for function, local, remote, count in self._calls:
            if function(self._pid, local, count, remote, count, 0) < 0:
                raise OSError(ctypes.get_errno(), "process_vm copy failed")


def rows(ctx: Context) -> list[Row]:
    rounds = ctx.rounds(9, 3)
    calls = ctx.rounds(300, 60)
    old_calls = ctx.rounds(30, 10)  # the old path costs about a millisecond a call
    thread = SimConfig(pd_isolation="thread")
    old_config = SimConfig(address_cache=False, procmap_query=False, pd_isolation="thread")
    with (
        _echo_session(thread) as (session, handle),
        _echo_session(old_config) as (old_session, old_handle),
        _echo_session(SimConfig(pd_isolation="process")) as (pd_session, pd_handle),
    ):
        new_slice, free_new = _slice_echo(session, handle)
        old_slice, free_old = _slice_echo(old_session, old_handle)
        pd_slice, free_pd = _slice_echo(pd_session, pd_handle)
        try:
            variants = {
                "slice": _timer(new_slice, calls),
                "slice_old_path": _timer(old_slice, old_calls),
                "inline": _timer(_inline_echo(session, handle), calls),
                "bare_copies": _timer(_BareCopies(), calls),
                "pd_inline": _timer(_inline_echo(pd_session, pd_handle), calls),
                "pd_slice": _timer(pd_slice, calls),
            }
            results: dict[str, list[float]] = {name: [] for name in variants}
            for index in range(rounds):
                order = list(variants) if index % 2 == 0 else list(reversed(variants))
                for name in order:
                    results[name].append(variants[name]())
        finally:
            free_new()
            free_old()
            free_pd()
    slice_us, old_us = results["slice"], results["slice_old_path"]
    inline_us, bare_us = results["inline"], results["bare_copies"]
    pd_inline_us, pd_slice_us = results["pd_inline"], results["pd_slice"]
    return [
        ratio_row(
            "emulator.slice_echo",
            "old lookup path / cached (x faster), 64-byte slice echo",
            [o / n for o, n in zip(old_us, slice_us, strict=True)],
            {"slice_us": median(slice_us), "old_path_us": median(old_us)},
            Goal("slice_us", SLICE_GOAL_US),
        ),
        ratio_row(
            "emulator.inline_echo",
            "invoke / bare process_vm copies, 64-byte inline echo",
            [i / b for i, b in zip(inline_us, bare_us, strict=True)],
            {"inline_us": median(inline_us), "bare_copies_us": median(bare_us)},
        ),
        ratio_row(
            "emulator.slice_vs_inline",
            "slice echo / inline echo",
            [s / i for s, i in zip(slice_us, inline_us, strict=True)],
            {"slice_us": median(slice_us), "inline_us": median(inline_us)},
        ),
        ratio_row(
            "emulator.pd_inline_echo",
            "skel in a PD child process / on the caller's thread, 64-byte inline echo",
            [p / t for p, t in zip(pd_inline_us, inline_us, strict=True)],
            {"process_us": median(pd_inline_us), "thread_us": median(inline_us)},
        ),
        ratio_row(
            "emulator.pd_slice_echo",
            "skel in a PD child process / on the caller's thread, 64-byte slice echo",
            [p / t for p, t in zip(pd_slice_us, slice_us, strict=True)],
            {"process_us": median(pd_slice_us), "thread_us": median(slice_us)},
        ),
    ]
