"""Frames of this change's messages mutated at random (issues 28 and 30): a model_chain
request reaching npud, and a status reply with held batches reaching a client. Each
mutant is decoded into a message or refused as a protocol error: nothing else escapes
the decoder, whatever the bytes. Bounded by the count of mutants (a few seconds) and by
the frame limit (a mutant cannot ask for more memory than its length prefix allows)."""

from __future__ import annotations

import random

import pytest

import npu_protocol as p
from tests.protocol.helpers import connected_pair, daemon_status, drain, feed, transfer
from tests.protocol.test_chain_messages import CHAIN

MUTANTS = 2000
"""Mutants per message."""


def _mutants(frame: bytes, rng: random.Random) -> list[bytes]:
    """``frame`` with a few bytes flipped, cut short, or with bytes put in: the header
    left whole half the time, so most mutants reach the payload's decoder."""
    out = []
    for _ in range(MUTANTS):
        data = bytearray(frame)
        keep_header = rng.random() < 0.5
        first = 8 if keep_header else 0
        for _ in range(rng.randint(1, 4)):
            at = rng.randrange(first, len(data))
            what = rng.random()
            if what < 0.6:
                data[at] = rng.randrange(256)
            elif what < 0.8:
                del data[at:]
                break
            else:
                data[at:at] = rng.randbytes(rng.randint(1, 8))
        if keep_header:  # the length prefix follows the payload, as a sender's would
            data[4:8] = (len(data) - 8).to_bytes(4, "little")
        out.append(bytes(data))
    return out


def _survives(receiver: p.ClientConnection | p.ServerConnection, data: bytes) -> str:
    """What ``receiver`` made of ``data``: a message, a protocol error, or more wanted."""
    feed(receiver, data)
    try:
        events = drain(receiver)
    except p.RemoteProtocolError:
        return "refused"
    return "decoded" if any(isinstance(e, p.Message) for e in events) else "incomplete"


HELD = p.ClientRow(
    pid=10,
    uid=1000,
    name="llm",
    priority="background",
    held=(
        p.HoldRow(reason="realtime_due", batches=12, held_us=34_500),
        p.HoldRow(reason="realtime_on_dsp", batches=3, held_us=9_000),
    ),
)


def test_mutated_chain_requests_are_decoded_or_refused() -> None:
    client, _ = connected_pair()
    frame = bytes(client.send(CHAIN)[0])
    outcomes = {"decoded": 0, "refused": 0, "incomplete": 0}
    rng = random.Random(30)  # noqa: S311  (a test's mutations, not a secret)
    for mutant in _mutants(frame, rng):
        _, server = connected_pair()
        outcomes[_survives(server, mutant)] += 1
    assert outcomes["refused"] > MUTANTS // 4
    assert outcomes["decoded"] > 0  # some mutants stay valid (a name's letter changed)


@pytest.mark.parametrize("seed", [28, 29])
def test_mutated_status_replies_with_held_batches_are_decoded_or_refused(seed: int) -> None:
    client, server = connected_pair()
    transfer(client, server, p.StatusRequest(id=8))
    frame = bytes(server.send(p.StatusReply(id=8, status=daemon_status(HELD)))[0])
    outcomes = {"decoded": 0, "refused": 0, "incomplete": 0}
    rng = random.Random(seed)  # noqa: S311
    for mutant in _mutants(frame, rng):
        client, server = connected_pair()
        client.send(p.StatusRequest(id=8))  # the reply answers a request in flight
        outcomes[_survives(client, mutant)] += 1
    assert outcomes["refused"] > MUTANTS // 4
    assert outcomes["decoded"] > 0
