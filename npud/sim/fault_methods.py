"""Which invoke methods of a module fault on purpose: the emulator's fault injection.

The emulated skels have methods that crash their DSP process on purpose
(``npu_test.fault``, :attr:`npud.sim.skels.Skel.faults`): a test's way to exercise
a domain's recovery. In a user's hands each call is a restart of that user's domain,
so npud runs them only for root and ``[emulator] fault_uids`` (PROTOCOL.md 7.4); a
long call (``npu_test.busy``) is ordinary DSP work and stays open to all.

:func:`fault_methods` answers for a remotectl open's module name what the emulated
DSP's loader would bind, the same way (:mod:`npud.sim.loader`): the library's skel
descriptor in the backend's library directories, its skel, and the entry symbol's
method numbering. Pure apart from reading that one small file.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from pathlib import Path

from npud.sim.builtin_skels import BUILTIN_SKELS
from npud.sim.errors import LoadError
from npud.sim.loader import MAX_LIBRARY_SIZE, method_offset, parse_descriptor, parse_module_uri
from npud.sim.skels import SkelFactory, load_idl


def fault_methods(
    uri: str,
    library_path: Iterable[Path],
    skels: Mapping[str, SkelFactory] = BUILTIN_SKELS,
) -> frozenset[int]:
    """The invoke method numbers of the module ``uri`` names that fault on purpose;
    empty for any module that has none, or that the loader could not bind."""
    try:
        request = parse_module_uri(uri)
    except LoadError:
        return frozenset()
    data = _library(request.library, library_path)
    if data is None:
        return frozenset()
    try:
        descriptor = parse_descriptor(data, request.library)
    except LoadError:
        return frozenset()
    factory = skels.get(descriptor.skel)
    faults: frozenset[str] = getattr(factory, "faults", frozenset())
    offset = method_offset(request.symbol)
    if not faults or offset is None or request.symbol not in descriptor.symbols:
        return frozenset()
    user = load_idl(descriptor.skel).user_methods
    first = user[0].index if user else 0
    return frozenset(m.index - first + offset for m in user if m.name in faults)


def _library(name: str, library_path: Iterable[Path]) -> bytes | None:
    """The first ``name`` under the library directories, as the host serves it."""
    for directory in library_path:
        candidate = os.path.normpath(os.path.join(directory, name))
        if os.path.commonpath([candidate, os.path.normpath(directory)]) != os.path.normpath(
            directory
        ):
            continue
        try:
            with open(candidate, "rb") as file:
                return file.read(MAX_LIBRARY_SIZE + 1)
        except OSError:
            continue
    return None
