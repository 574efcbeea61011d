"""Who a peer is: SO_PEERCRED and SO_PEERGROUPS, and the rules that match every group of
it (the allow-list, the realtime list, the domain rules)."""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator

import pytest

from npud.daemon.peers import identify
from npud.daemon.server import peer_allowed
from npud.domain.placement import Placement, place
from npud.ops.config import parse_config

NOBODY = 65534


@pytest.fixture
def pair() -> Iterator[tuple[socket.socket, socket.socket]]:
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    yield a, b
    a.close()
    b.close()


def test_a_peer_in_this_process_has_this_processs_groups(
    pair: tuple[socket.socket, socket.socket],
) -> None:
    pid, uid, gid, groups = identify(pair[0])
    assert (pid, uid, gid) == (os.getpid(), os.getuid(), os.getgid())
    assert groups[0] == gid  # the primary group first
    assert set(os.getgroups()) <= set(groups)
    assert len(groups) == len(set(groups))


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to take other groups")
def test_the_supplementary_groups_of_a_peer_of_another_user() -> None:
    """A child that became nobody with supplementary groups 4242 and 4243 (as
    ``usermod -aG`` would make it) connects: the daemon's end sees all three groups."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(f"\0npud-test-peers-{os.getpid()}")
    listener.listen(1)
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        code = 1
        try:
            os.setgroups([4242, 4243])
            os.setgid(NOBODY)
            os.setuid(NOBODY)
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as client:
                client.connect(f"\0npud-test-peers-{os.getppid()}")
                client.recv(1)
            code = 0
        finally:
            os._exit(code)
    try:
        conn, _ = listener.accept()
        with conn:
            peer_pid, uid, gid, groups = identify(conn)
            conn.send(b"x")
    finally:
        _, status = os.waitpid(pid, 0)
        listener.close()
    assert os.waitstatus_to_exitcode(status) == 0
    assert (peer_pid, uid, gid) == (pid, NOBODY, NOBODY)
    assert groups == (NOBODY, 4242, 4243)


def test_the_allow_list_matches_supplementary_groups() -> None:
    config = parse_config("[access]\nallow_gids = [4242]\n")
    assert peer_allowed(config, 1000, (1000, 4242))  # usermod -aG npu
    assert peer_allowed(config, 1000, (4242,))  # the primary group
    assert not peer_allowed(config, 1000, (1000, 4243))
    assert peer_allowed(config, 0, ())  # root always


def test_domain_rules_match_every_listed_kind_and_supplementary_groups() -> None:
    config = parse_config(
        "[domains]\n"
        "[[domains.rule]]\nname = 'voice'\nuids = [991]\n"
        "[[domains.rule]]\nname = 'llm'\ngids = [992]\nclients = ['llama*']\nisolate = true\n"
        "[[domains.rule]]\nname = 'lab'\nclients = ['bench-?']\n"
    ).domains
    assert place(config, 991, (991,), "anything") == Placement("voice@991", False, 991)
    assert place(config, 1000, (1000, 992), "llama-server") == Placement("llm@1000", True, 1000)
    # Both kinds must match: a name alone does not take a user outside the group.
    assert place(config, 1000, (1000,), "llama-server") == Placement("default@1000", False, 1000)
    assert place(config, 1000, (1000, 992), "whisper") == Placement("default@1000", False, 1000)
    assert place(config, 5, (5,), "bench-7") == Placement("lab@5", False, 5)
    isolating = parse_config("[domains]\nisolate_default = true\n").domains
    assert place(isolating, 5, (5,), "x") == Placement("default@5", True, 5)


def test_users_never_share_a_domain_unless_the_configuration_says_so() -> None:
    """A DSP process is a security boundary (issue 27): each user's connections go to a
    domain of that user's own; root and npud's own user share the plain names; share =
    "all" and share_default put every user in one."""
    config = parse_config("[[domains.rule]]\nname = 'lab'\nclients = ['bench-*']\n").domains
    privileged = (0, 990)
    assert place(config, 0, (0,), "x", privileged) == Placement("default", False)
    assert place(config, 990, (990,), "x", privileged) == Placement("default", False)
    assert place(config, 1000, (1000,), "x", privileged) == Placement("default@1000", False, 1000)
    assert place(config, 1001, (1001,), "x", privileged) == Placement("default@1001", False, 1001)
    assert place(config, 1000, (1000,), "bench-1", privileged).name == "lab@1000"
    assert place(config, 0, (0,), "bench-1", privileged).name == "lab"
    shared = parse_config(
        "[domains]\nshare_default = true\n"
        "[[domains.rule]]\nname = 'lab'\nclients = ['bench-*']\nshare = 'all'\n"
        "[[domains.rule]]\nname = 'llm'\nclients = ['llama*']\nshare = 'all'\nisolate = true\n"
    ).domains
    assert place(shared, 1000, (1000,), "x") == Placement("default", False)
    assert place(shared, 1001, (1001,), "bench-2") == Placement("lab", False)
    # A process of one's own is still its user's, counted against its bound.
    assert place(shared, 1001, (1001,), "llama-cli") == Placement("llm", True, 1001)
