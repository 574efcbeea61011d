"""An error names only the requester's own ids: never a DSP handle, an fd or another table's id.

:func:`leaked_numbers` looks at one refusal: the request, the code, the fields
and the rendered message. Every number in the message must come from the
request itself, from a field that is not an id (a limit, a size, a DSP result
code), or from the template's own text. A field that is an id (``buffer``,
``handle``, ...) must hold an id the request named.

``tests/conftest.py`` records every refusal the daemons that run inside the
test process send, and fails the run if any of them leaks a number.
"""

from __future__ import annotations

import re
import string
from typing import Final

import msgspec

import npu_protocol as p
from npu_protocol import ErrorCode
from npu_protocol.errors import template

ID_FIELDS: Final = frozenset({"buffer", "handle", "fd", "model"})
"""Fields that name an object: their value must be one the request named."""

MODEL_CODES: Final = frozenset(
    {
        ErrorCode.QNN,
        ErrorCode.INVALID_TENSOR_INDEX,
        ErrorCode.TENSOR_MISMATCH,
        ErrorCode.INPUT_NOT_SET,
        ErrorCode.MODEL_FILE_UNREADABLE,
        ErrorCode.MODEL_FORMAT,
        ErrorCode.MODEL_MALFORMED,
        ErrorCode.MODEL_REJECTED,
        ErrorCode.NO_OUTPUTS,
        ErrorCode.OUTPUT_TOO_LARGE,
    }
)
"""Codes whose detail describes the client's own model or file (its graph, its tensors'
sizes, what the file is, the QNN error number the runtime gave, portal_qnn's published
limits): numbers there are the requester's. Their id fields are still checked."""

_DECIMAL: Final = re.compile(r"(?<![0-9A-Za-z_])-?[0-9]+(?![0-9A-Za-z_])")
_HEX: Final = re.compile(r"0x[0-9A-Fa-f]+")


def request_numbers(request: object) -> set[int]:
    """Every integer in ``request``, at any depth, and every number written in its
    strings (a URI's ``_modver=1.0``); bytes excluded."""
    found: set[int] = set()

    def walk(value: object) -> None:
        if isinstance(value, bool):
            return
        if isinstance(value, int):
            found.add(value)
        elif isinstance(value, str):
            found.update(int(n) for n in _DECIMAL.findall(value))
        elif isinstance(value, msgspec.Struct):
            for name in value.__struct_fields__:
                walk(getattr(value, name))
        elif isinstance(value, tuple | list):
            for item in value:
                walk(item)

    walk(request)
    if isinstance(request, p.InvokeRequest):
        found.add(request.scalars)
    if isinstance(request, p.ModelChainRequest):  # its steps' positions and count
        found.update(range(len(request.steps) + 1))
    return found


def _template_numbers(code: ErrorCode) -> set[int]:
    text = "".join(literal for literal, _, _, _ in string.Formatter().parse(template(code)))
    return {int(n) for n in _DECIMAL.findall(text)}


def leaked_numbers(
    request: p.Request,
    code: ErrorCode,
    fields: dict[str, object],
    message: str,
    limits: object = None,
) -> list[str]:
    """What in this refusal is not the request's own: empty when all is well.

    ``limits``: the ``ClientLimits`` the connection was told, whose numbers a
    message may quote.
    """
    named = request_numbers(request)
    problems = [
        f"field {name}={value} is not an id the request named"
        for name, value in fields.items()
        if name in ID_FIELDS and value not in named
    ]
    allowed = named | _template_numbers(code) | request_numbers(limits)
    allowed |= {v for k, v in fields.items() if k not in ID_FIELDS and isinstance(v, int)}
    for value in fields.values():
        if isinstance(value, str) and value not in message:
            problems.append(f"field text {value!r} is not in the message")
    if code in MODEL_CODES:
        return problems
    text = _HEX.sub(" ", message)  # DSP result codes, rendered from their fields
    for token in _DECIMAL.findall(text):
        if int(token) not in allowed:
            problems.append(f"number {token} in {message!r} is not the request's")
    return problems
