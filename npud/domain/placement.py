"""Which domain a connection joins, from the configuration's rules. Pure.

A connection joins the first ``[[domains.rule]]`` whose every listed kind
matches it: its uid among ``uids``, one of its groups (primary or
supplementary, from SO_PEERGROUPS) among ``gids``, its Hello ``client_name``
matching one of the ``clients`` shell patterns. No rule: the default domain.

A DSP process is a security boundary: DSP code reaches every buffer mapped
into its process by fd number, whoever mapped it. So users never share one
unless the configuration says so: a domain is **per uid** (``NAME@UID``) by
default, and only the *privileged* users (root and npud's own user, who can
read every buffer anyway) share the plain ``NAME``. ``share = "all"`` on a
rule, or ``share_default`` for the default domain, makes one ``NAME`` for
every user it takes; ``isolate`` gives each connection a process of its own
(``NAME@UID#N``, or ``NAME#N`` for the privileged).
"""

from __future__ import annotations

import dataclasses
import fnmatch
from collections.abc import Iterable

from npud.ops.config import DEFAULT_DOMAIN, DomainRuleConfig, DomainsConfig


@dataclasses.dataclass(frozen=True)
class Placement:
    """Where a connection goes: the domain's name (``NAME`` or ``NAME@UID``), whether it
    gets one of its own, and the user the DSP process it joins or opens is counted
    against (``max_domains_per_uid``; None: a domain several users share, or one of the
    privileged users, which no per-user bound counts)."""

    name: str
    isolate: bool
    owner: int | None = None


def matches(rule: DomainRuleConfig, uid: int, groups: Iterable[int], client_name: str) -> bool:
    """Every kind the rule lists matches the connection (a rule lists at least one)."""
    if rule.uids and uid not in rule.uids:
        return False
    if rule.gids and not set(groups) & set(rule.gids):
        return False
    return not rule.clients or any(
        fnmatch.fnmatchcase(client_name, pattern) for pattern in rule.clients
    )


def place(
    config: DomainsConfig,
    uid: int,
    groups: Iterable[int],
    client_name: str,
    privileged: Iterable[int] = (0,),
) -> Placement:
    """The domain a connection of ``uid`` in ``groups`` that calls itself ``client_name``
    joins; ``privileged``: the users who share the plain names (root, npud's own)."""
    group_set = frozenset(groups)
    for rule in config.rule:
        if matches(rule, uid, group_set, client_name):
            return _owned(rule.name, rule.isolate, rule.share == "all", uid, privileged)
    return _owned(DEFAULT_DOMAIN, config.isolate_default, config.share_default, uid, privileged)


def _owned(
    name: str, isolate: bool, shared: bool, uid: int, privileged: Iterable[int]
) -> Placement:
    if uid in set(privileged):
        return Placement(name, isolate)
    if shared:
        # One process for every user the rule takes; an isolated one is still its user's.
        return Placement(name, isolate, uid if isolate else None)
    return Placement(f"{name}@{uid}", isolate, uid)
