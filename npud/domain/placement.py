"""Which domain a connection joins, from the configuration's rules. Pure.

A connection joins the first ``[[domains.rule]]`` whose every listed kind
matches it: its uid among ``uids``, one of its groups (primary or
supplementary, from SO_PEERGROUPS) among ``gids``, its Hello ``client_name``
matching one of the ``clients`` shell patterns. No rule: the default domain,
shared, or one of its own with ``isolate_default``.
"""

from __future__ import annotations

import dataclasses
import fnmatch
from collections.abc import Iterable

from npud.config import DEFAULT_DOMAIN, DomainRuleConfig, DomainsConfig


@dataclasses.dataclass(frozen=True)
class Placement:
    """Where a connection goes: the domain's name, and whether it gets one of its own."""

    name: str
    isolate: bool


def matches(rule: DomainRuleConfig, uid: int, groups: Iterable[int], client_name: str) -> bool:
    """Every kind the rule lists matches the connection (a rule lists at least one)."""
    if rule.uids and uid not in rule.uids:
        return False
    if rule.gids and not set(groups) & set(rule.gids):
        return False
    return not rule.clients or any(
        fnmatch.fnmatchcase(client_name, pattern) for pattern in rule.clients
    )


def place(config: DomainsConfig, uid: int, groups: Iterable[int], client_name: str) -> Placement:
    """The domain a connection of ``uid`` in ``groups`` that calls itself ``client_name``
    joins."""
    group_set = frozenset(groups)
    for rule in config.rule:
        if matches(rule, uid, group_set, client_name):
            return Placement(rule.name, rule.isolate)
    return Placement(DEFAULT_DOMAIN, config.isolate_default)
