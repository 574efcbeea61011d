"""The IDL subset's tokenizer and parser (see npud.idl)."""

from __future__ import annotations

import dataclasses
import functools
import re
from pathlib import Path
from typing import Final, Literal

from npud.idl._method import Interface, Method, implicit_methods
from npud.idl._types import (
    ALIASES,
    DOMAIN_BASE,
    PRIMITIVES,
    Element,
    IdlError,
    Member,
    NestedSequenceType,
    Param,
    ParamType,
    Primitive,
    SequenceType,
    StringType,
    StructType,
)

IDL_DIR: Final = Path(__file__).resolve().parent / "files"
"""The IDL files that ship with npud (the repository's ``idl/``, linked into the package)."""


@dataclasses.dataclass(frozen=True)
class IdlFile:
    interfaces: dict[str, Interface]
    structs: dict[str, StructType]


_TOKEN: Final = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)|(0[xX][0-9A-Fa-f]+|\d+)|(\S)")
_PUNCTUATION: Final = frozenset("{}()<>[];,:")


@dataclasses.dataclass(frozen=True)
class _Token:
    text: str
    line: int
    kind: Literal["name", "number", "punct"]


def _strip(text: str) -> str:
    """Comments and preprocessor lines become blanks; newlines stay (line numbers)."""

    def blank(match: re.Match[str]) -> str:
        return re.sub(r"[^\n]", " ", match.group(0))

    text = re.sub(r"/\*.*?\*/", blank, text, flags=re.DOTALL)
    text = re.sub(r"//[^\n]*", blank, text)
    return re.sub(r"(?m)^[ \t]*#[^\n]*", blank, text)


def _tokens(text: str, source: str) -> list[_Token]:
    stripped = _strip(text)
    if "/*" in stripped:
        raise IdlError(f"{source}: unterminated comment")
    tokens: list[_Token] = []
    for line_number, line in enumerate(stripped.splitlines(), start=1):
        for match in _TOKEN.finditer(line):
            name, number, punct = match.groups()
            if name:
                tokens.append(_Token(name, line_number, "name"))
            elif number:
                tokens.append(_Token(number, line_number, "number"))
            elif punct not in _PUNCTUATION:
                raise IdlError(f"{source}:{line_number}: unexpected character {punct!r}")
            else:
                tokens.append(_Token(punct, line_number, "punct"))
    return tokens


class _Parser:
    def __init__(self, text: str, source: str) -> None:
        self._source = source
        self._tokens = _tokens(text, source)
        self._position = 0
        self.structs: dict[str, StructType] = {}
        self.interfaces: dict[str, Interface] = {}

    # -- token helpers ------------------------------------------------------
    def _peek(self, ahead: int = 0) -> _Token | None:
        index = self._position + ahead
        return self._tokens[index] if index < len(self._tokens) else None

    def _error(self, message: str) -> IdlError:
        token = self._peek()
        where = f"{self._source}:{token.line}" if token else f"{self._source}: at the end"
        return IdlError(f"{where}: {message}")

    def _next(self) -> _Token:
        token = self._peek()
        if token is None:
            raise self._error("unexpected end of file")
        self._position += 1
        return token

    def _expect(self, text: str) -> None:
        token = self._peek()
        if token is None or token.text != text:
            found = repr(token.text) if token else "the end"
            raise self._error(f"expected {text!r}, found {found}")
        self._position += 1

    def _name(self, what: str) -> str:
        token = self._peek()
        if token is None or token.kind != "name":
            raise self._error(f"expected {what}")
        self._position += 1
        return token.text

    def _accept(self, text: str) -> bool:
        token = self._peek()
        if token is not None and token.text == text:
            self._position += 1
            return True
        return False

    # -- grammar ------------------------------------------------------------
    def parse(self) -> IdlFile:
        while self._peek() is not None:
            keyword = self._name("'struct' or 'interface'")
            if keyword == "struct":
                self._struct()
            elif keyword == "interface":
                self._interface()
            else:
                self._position -= 1
                raise self._error(f"{keyword!r} is outside the supported IDL subset")
        return IdlFile(dict(self.interfaces), dict(self.structs))

    def _primitive(self) -> Primitive | None:
        """A primitive type at the cursor (consumed, longest spelling first), or None."""
        for length in (3, 2, 1):
            window = self._tokens[self._position : self._position + length]
            words = tuple(t.text for t in window if t.kind == "name")
            if len(words) == length and words in ALIASES:
                self._position += length
                return PRIMITIVES[ALIASES[words]]
        token = self._peek()
        if token is not None and token.text in PRIMITIVES:
            self._position += 1
            return PRIMITIVES[token.text]
        return None

    def _element_type(self) -> Element:
        primitive = self._primitive()
        if primitive is not None:
            return primitive
        name = self._name("a type")
        if name in self.structs:
            return self.structs[name]
        self._position -= 1
        raise self._error(f"unknown type {name!r}")

    def _number(self) -> int:
        token = self._next()
        if token.kind != "number":
            self._position -= 1
            raise self._error("expected a number")
        return int(token.text, 0)

    def _struct(self) -> None:
        name = self._name("a struct name")
        if name in self.structs or name in PRIMITIVES:
            raise self._error(f"type {name!r} is defined twice")
        self._expect("{")
        members: list[Member] = []
        offset, align = 0, 1
        while not self._accept("}"):
            member_type = self._primitive()
            if member_type is None:
                raise self._error("struct members must be primitives or arrays of them")
            while True:
                member_name = self._name("a member name")
                count: int | None = None
                if self._accept("["):
                    count = self._number()
                    if count <= 0:
                        raise self._error(f"{member_name}: array size must be positive")
                    self._expect("]")
                if any(m.name == member_name for m in members):
                    raise self._error(f"{name}.{member_name} is declared twice")
                offset += -offset % member_type.align
                members.append(Member(member_name, member_type, count, offset))
                offset += members[-1].size
                align = max(align, member_type.align)
                if not self._accept(","):
                    break
            self._expect(";")
        self._expect(";")
        if not members:
            raise self._error(f"struct {name} is empty")
        self.structs[name] = StructType(name, tuple(members), offset + (-offset % align), align)

    def _interface(self) -> None:
        name = self._name("an interface name")
        domain = False
        if self._accept(":"):
            base = self._name("a base interface")
            if base != DOMAIN_BASE:
                self._position -= 1
                raise self._error(f"only {DOMAIN_BASE} may be a base interface, not {base!r}")
            domain = True
        self._expect("{")
        methods = implicit_methods() if domain else []
        index = len(methods)
        while not self._accept("}"):
            methods.append(self._method(index))
            index += 1
        self._expect(";")
        names = [m.name for m in methods]
        duplicates = {n for n in names if names.count(n) > 1}
        if duplicates:
            raise IdlError(f"{self._source}: {name}.{sorted(duplicates)[0]} is declared twice")
        if name in self.interfaces:
            raise IdlError(f"{self._source}: interface {name} is declared twice")
        self.interfaces[name] = Interface(name, domain, tuple(methods))

    def _method(self, index: int) -> Method:
        returns = self._name("a return type")
        if returns not in ("long", "AEEResult"):
            self._position -= 1
            raise self._error(f"methods return long (an AEE result), not {returns!r}")
        name = self._name("a method name")
        self._expect("(")
        params: list[Param] = []
        if not self._accept(")"):
            while True:
                params.append(self._param())
                if self._accept(")"):
                    break
                self._expect(",")
        self._expect(";")
        seen = [p.name for p in params]
        if len(set(seen)) != len(seen):
            raise self._error(f"{name}: a parameter name is used twice")
        return Method.build(name, index, params)

    def _param(self) -> Param:
        direction = self._name("'in' or 'rout'")
        if direction not in ("in", "rout"):
            self._position -= 1
            raise self._error(f"parameter direction {direction!r} is not supported (in, rout)")
        param_type: ParamType
        if self._accept("sequence"):
            self._expect("<")
            if self._accept("sequence"):
                self._expect("<")
                param_type = NestedSequenceType(SequenceType(self._element_type()))
                self._expect(">")
            else:
                param_type = SequenceType(self._element_type())
            self._expect(">")
        elif self._accept("string"):
            if direction != "in":
                raise self._error("rout string is not supported; use rout sequence<char>")
            param_type = StringType()
        else:
            param_type = self._element_type()
        name = self._name("a parameter name")
        return Param(name, "in" if direction == "in" else "rout", param_type)


def parse(text: str, *, source: str = "<idl>") -> IdlFile:
    """Parse IDL text; IdlError (with ``source:line``) for anything outside the subset."""
    return _Parser(text, source).parse()


@functools.cache
def load(interface: str, *, directory: Path = IDL_DIR) -> Interface:
    """Interface ``interface`` from ``<directory>/<interface>.idl`` (parsed once)."""
    path = directory / f"{interface}.idl"
    parsed = parse(path.read_text(encoding="utf-8"), source=path.name)
    try:
        return parsed.interfaces[interface]
    except KeyError:
        raise IdlError(f"{path.name} does not declare interface {interface}") from None
