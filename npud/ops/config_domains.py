"""npud.toml's ``[domains]``: which connections share a DSP process, and the named
domains' rules (docs/architecture.md, Domains)."""

from __future__ import annotations

from typing import Annotated, Final, Literal

import msgspec

from npud.ops.config_values import Id, doc

DomainShare = Literal["uid", "all"]

DomainName = Annotated[
    str,
    msgspec.Meta(pattern=r"^[a-z][a-z0-9_-]{0,30}$"),
    doc("Lower-case letters, digits, - and _, starting with a letter; at most 31."),
]
DEFAULT_DOMAIN: Final = "default"
X1E_COMPUTE_CONTEXT_BANKS: Final = 12
"""Compute context banks of the X1E80100 CDSP's FastRPC node in the device tree
(x1e80100.dtsi: SIDs 1-8 and 10-13, "cb 9 is secure"); one per DSP process."""


class DomainRuleConfig(msgspec.Struct, forbid_unknown_fields=True, frozen=True, kw_only=True):
    """A named domain and the connections it takes (``[[domains.rule]]``)."""

    name: Annotated[DomainName, doc("The domain's name, as status shows it.")]
    uids: Annotated[tuple[Id, ...], doc("Connections of these users.")] = ()
    gids: Annotated[
        tuple[Id, ...],
        doc("Connections of users in these groups (primary or supplementary)."),
    ] = ()
    clients: Annotated[
        tuple[Annotated[str, msgspec.Meta(min_length=1, max_length=127)], ...],
        doc(
            "Connections whose Hello client_name matches one of these shell patterns "
            "(fnmatch). A name is the client's own claim: combine it with uids or gids "
            "where that matters."
        ),
    ] = ()
    isolate: Annotated[
        bool,
        doc(
            "Each matching connection gets a DSP process of its own, opened at its Hello "
            "and closed when it goes; false: the matching connections share one."
        ),
    ] = False
    share: Annotated[
        DomainShare,
        doc(
            "uid: each user's matching connections share a DSP process of that user's own, "
            "NAME@UID (root's and npud's own user's: NAME); all: every matching user shares "
            "one, NAME, and DSP code of each reaches the buffers the others map there "
            "(docs/deploy.md, Sharing a DSP process)."
        ),
    ] = "uid"

    def __post_init__(self) -> None:
        if self.name == DEFAULT_DOMAIN:
            raise ValueError(f"{DEFAULT_DOMAIN!r} is the domain of connections no rule takes")
        if not (self.uids or self.gids or self.clients):
            raise ValueError(f"domain {self.name!r} names no uids, gids or clients to take")


DEFAULT_REOPEN_AT_INTERRUPTED_CONTEXTS: Final = 128
"""Half of the CDSP's 255 contexts: other programs on the CDSP leak theirs too."""


class DomainsConfig(msgspec.Struct, forbid_unknown_fields=True, frozen=True, kw_only=True):
    """Domains: which connections share a DSP process (docs/architecture.md, Domains).
    A connection joins the first rule whose every listed kind (uids, gids, clients)
    matches it, else the default domain. A reload (SIGHUP) applies to connections that
    say Hello afterwards."""

    max_domains: Annotated[
        int,
        msgspec.Meta(ge=1, le=14),
        doc(
            "DSP processes npud keeps at once, the default domain's included: one FastRPC "
            "session each, and each takes one of the CDSP's compute context banks (12 on "
            "the X1E80100). A connection that would need one more is refused "
            "(QUOTA_EXCEEDED)."
        ),
    ] = X1E_COMPUTE_CONTEXT_BANKS
    max_domains_per_uid: Annotated[
        int,
        msgspec.Meta(ge=1, le=14),
        doc(
            "DSP processes one user's connections may hold at once (its default@UID and "
            "named@UID domains and its isolated ones), so one user cannot take every context "
            "bank; one more is refused (QUOTA_EXCEEDED, naming the uid). Root and npud's own "
            "user are not bound by it."
        ),
    ] = 4
    isolate_default: Annotated[
        bool,
        doc(
            "Connections that no rule takes get a DSP process each, instead of sharing their "
            "user's default domain."
        ),
    ] = False
    share_default: Annotated[
        bool,
        doc(
            "Connections of every user that no rule takes share one DSP process, default, "
            "as npud did before: DSP code of each reaches the buffers every other maps there "
            "(docs/deploy.md, Sharing a DSP process). false: each user gets its own, "
            "default@UID, and root and npud's own user share default."
        ),
    ] = False
    rule: Annotated[tuple[DomainRuleConfig, ...], doc("The named domains, first match wins.")] = ()
    allow_isolate: Annotated[
        bool,
        doc(
            "A client may ask for a DSP process of its own at its Hello (isolate, protocol "
            "version 4; npud's libcdsprpc does, for dspqueue); false refuses such a Hello."
        ),
    ] = True
    user_domain_linger_s: Annotated[
        float,
        msgspec.Meta(ge=0.0, le=3600.0),
        doc(
            "Seconds a user's own domain (default@UID, NAME@UID) is kept open after its last "
            "connection goes: a connection of that user within them joins it, instead of "
            "npud starting a DSP process again (a client that connects and disconnects in a "
            "loop would otherwise start and stop one each time). It still counts against "
            "max_domains and max_domains_per_uid meanwhile. 0 closes it at once. Isolated "
            "domains close with their connection."
        ),
    ] = 2.0
    reopen_at_interrupted_contexts: Annotated[
        int,
        msgspec.Meta(ge=1, le=254),
        doc(
            "A system suspend interrupts every call waiting for the DSP (each session's "
            "listener, each dspqueue wait), and mainline's fastrpc keeps each interrupted "
            "call's context until its fd closes: the CDSP has 255 for every program. When "
            "npud's sessions hold this many together, npud reopens the sessions holding "
            "the most (their clients see a DSP restart) until they hold half as many."
        ),
    ] = DEFAULT_REOPEN_AT_INTERRUPTED_CONTEXTS

    def __post_init__(self) -> None:
        names = [rule.name for rule in self.rule]
        twice = sorted({name for name in names if names.count(name) > 1})
        if twice:
            raise ValueError(f"domain names must differ: {', '.join(twice)} given twice")
