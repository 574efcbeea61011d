"""Configuration errors in the words of the file: the key as TOML spells it, a close
match for a misspelt key, and the allowed values of a bad choice.

msgspec does the validating; its messages speak JSON paths and struct fields
(``Object contains unknown field `log_levl` - at `$.daemon```). This rewrites the
three shapes it produces: an unknown field, a bad enum value, and anything else
with a path. Suggestions come from difflib, the standard library's fuzzy matcher.
"""

from __future__ import annotations

import difflib
import re

import msgspec
import msgspec.inspect as mi

_AT = re.compile(r"^(?P<what>.*?)(?: - at `\$(?P<path>[^`]*)`)?$", re.DOTALL)
_UNKNOWN = re.compile(r"^Object contains unknown field `(?P<name>[^`]*)`$")
_ENUM = re.compile(r"^Invalid enum value (?P<value>.*)$")
_STEP = re.compile(r"\.(?P<key>[^.\[]+)|\[(?P<index>\d+)\]")


def explain(error: msgspec.ValidationError, schema: type) -> str:
    """``error`` (from decoding into ``schema``, a Struct) as one line naming the key."""
    match = _AT.match(str(error))
    assert match is not None  # the pattern matches any text
    what, path = match["what"], match["path"] or ""
    key = _key(path)
    node = _type_at(mi.type_info(schema), path)
    unknown = _UNKNOWN.match(what)
    if unknown:
        name = unknown["name"]
        full = f"{key}.{name}" if key else name
        return f"unknown key {full}{_did_you_mean(name, _keys_of(node))}"
    enum = _ENUM.match(what)
    if enum and node is not None:
        allowed = _choices(node)
        if allowed:
            return f"{key}: {enum['value']} is not one of {', '.join(allowed)}"
    text = what[:1].lower() + what[1:]
    return f"{key}: {text}" if key else text


def _did_you_mean(name: str, known: list[str]) -> str:
    """`` (did you mean X?)`` for the closest of ``known``, or nothing."""
    close = difflib.get_close_matches(name, known, n=1)
    return f" (did you mean {close[0]}?)" if close else ""


def _key(path: str) -> str:
    """``$.domains.rule[0]`` as the file spells it: ``domains.rule[0]``."""
    return path[1:] if path.startswith(".") else path


def _strip(node: mi.Type) -> mi.Type:
    while isinstance(node, mi.Metadata):
        node = node.type
    return node


def _type_at(root: mi.Type, path: str) -> mi.Type | None:
    """The schema's type at a msgspec path, or None where the path leaves the schema."""
    node: mi.Type | None = _strip(root)
    for step in _STEP.finditer(path):
        if isinstance(node, mi.StructType) and step["key"] is not None:
            node = next((_strip(f.type) for f in node.fields if f.encode_name == step["key"]), None)
        elif isinstance(node, (mi.VarTupleType, mi.ListType)) and step["index"] is not None:
            node = _strip(node.item_type)
        else:
            return None
    return node


def _keys_of(node: mi.Type | None) -> list[str]:
    return [f.encode_name for f in node.fields] if isinstance(node, mi.StructType) else []


def _choices(node: mi.Type) -> list[str]:
    if isinstance(node, mi.LiteralType):
        return [str(value) for value in node.values]
    if isinstance(node, mi.EnumType):
        return [str(member.value) for member in node.cls]
    return []
