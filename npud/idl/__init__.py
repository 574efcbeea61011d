"""Typed stubs from the IDL at run time: the qaic marshalling rules without qaic.

``parse`` reads the IDL subset this repository uses (``idl/*.idl``) and
:func:`load` gives one interface from the IDL files shipped with npud. Each
:class:`Method` knows its index, its scalars word and the layout of its
primIn / primROut buffers (reference ``fastrpc-abi.md`` 5.4):

* buffer order: primIn, one buffer per ``in`` sequence/string, primROut,
  one buffer per ``rout`` sequence, then handle slots;
* primIn holds every ``in`` scalar and the element count (u32) of every
  sequence/string, ``in`` and ``rout``, in parameter order; primROut every
  ``rout`` scalar; each item at its natural alignment, the buffer rounded up
  to its largest alignment; no buffer when there is nothing to put in it;
* strings travel with their NUL, which the count includes;
* a ``remote_handle64`` interface numbers user methods from 2 (0 and 1 are
  the open and close that remotectl runs); a plain one from 0; methods from
  31 on travel as method 31 with the real index first in primIn.

Both directions are here: a stub encodes Python values into buffers
(:meth:`Method.encode`) and decodes what comes back (:meth:`Method.decode`);
a skel checks and unpacks what it received (:meth:`Method.unpack`) and
writes its rout values (:meth:`Method.pack_routs`). Every check fails with
:class:`MarshalError`, which a skel answers with AEE_EBADPARM.

The subset: ``#include`` and other preprocessor lines (skipped), comments,
``struct`` of primitives and fixed arrays of primitives, ``interface X``
and ``interface X : remote_handle64``, methods returning ``long`` /
``AEEResult`` with ``in`` / ``rout`` parameters of the primitive types,
structs, ``string`` (``in`` only) and ``sequence<T>`` (T a primitive or a
struct). ``rout sequence<sequence<T>>`` (one per method, after every other
sequence and string, as apps_std's search paths) travels as its count in
primIn, one input buffer with each item's capacity (u32) and one output
buffer per item after all the others, so its scalars word depends on the
count (``Method.sc_for``). An ``in sequence<sequence<T>>`` parses, so that the
methods after it keep their indices, but marshalling a method with one is a
:class:`MarshalError` (``Method.runtime_counted`` names it).
Anything else is an :class:`IdlError` naming the line.

Pure Python, standard library only: no I/O besides :func:`load`, no other
npud module (tests/unit/test_layering.py), because both sides use it: the
stubs in ``npud.fastrpc`` and the emulator's skels in ``npud.sim``, which must
not import each other. It could move to a package the client shares unchanged.
"""

from npud.idl._method import (
    DOMAIN_FIRST_METHOD,
    ESCAPE_METHOD,
    EncodedCall,
    Interface,
    Method,
    PrimLayout,
    Slot,
    make_scalars,
)
from npud.idl._parser import IDL_DIR, IdlFile, load, parse
from npud.idl._types import (
    DOMAIN_BASE,
    BufferRef,
    HandleType,
    IdlError,
    MarshalError,
    Member,
    NestedSequenceType,
    Param,
    Primitive,
    SequenceType,
    StringType,
    StructType,
    Value,
    Values,
    is_buffer_ref,
)

__all__ = [
    "DOMAIN_BASE",
    "DOMAIN_FIRST_METHOD",
    "ESCAPE_METHOD",
    "IDL_DIR",
    "BufferRef",
    "EncodedCall",
    "HandleType",
    "IdlError",
    "IdlFile",
    "Interface",
    "MarshalError",
    "Member",
    "Method",
    "NestedSequenceType",
    "Param",
    "PrimLayout",
    "Primitive",
    "SequenceType",
    "Slot",
    "StringType",
    "StructType",
    "Value",
    "Values",
    "is_buffer_ref",
    "load",
    "make_scalars",
    "parse",
]
