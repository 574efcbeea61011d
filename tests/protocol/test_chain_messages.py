"""model_chain and its reply (protocol 7), sans-IO: round trips, bounds, negotiation."""

from __future__ import annotations

import msgspec
import pytest

import npu_protocol as p
from tests.protocol.helpers import connected_pair, drain, feed, frame, transfer

CHAIN = p.ModelChainRequest(
    id=5,
    steps=(
        p.ChainStep(model=3),
        p.ChainStep(model=4, inputs={"input_1": p.ChainSource(step=0, output="frames")}),
        p.ChainStep(model=5, graph="head", inputs={"x.1": p.ChainSource(step=1, output="f/0")}),
    ),
    outputs=(p.ChainOutput(step=2, output="score"), p.ChainOutput(step=0, output="frames")),
    deadline_ms=20,
)


def test_a_chain_and_its_reply_round_trip() -> None:
    client, server = connected_pair()
    assert transfer(client, server, CHAIN) == CHAIN
    reply = p.ModelChainReply(id=5, dsp_us=900, output_shapes=((1, 1), (1, 5, 0)))
    assert transfer(server, client, reply) == reply
    assert p.REPLY_TYPES[p.ModelChainRequest] is p.ModelChainReply


def test_the_wire_form_is_the_documented_one() -> None:
    wire = msgspec.msgpack.decode(msgspec.msgpack.encode(CHAIN))
    assert wire == {
        "type": "model_chain",
        "id": 5,
        "steps": [
            {"model": 3},
            {"model": 4, "inputs": {"input_1": {"step": 0, "output": "frames"}}},
            {"model": 5, "graph": "head", "inputs": {"x.1": {"step": 1, "output": "f/0"}}},
        ],
        "outputs": [{"step": 2, "output": "score"}, {"step": 0, "output": "frames"}],
        "deadline_ms": 20,
    }


def _raw_chain(steps: int, outputs: int = 1) -> bytes:
    return msgspec.msgpack.encode(
        {
            "type": "model_chain",
            "id": 1,
            "steps": [{"model": 1}] * steps,
            "outputs": [{"step": 0, "output": "y"}] * outputs,
        }
    )


@pytest.mark.parametrize(
    ("payload", "accepted"),
    [
        (_raw_chain(4 * p.MAX_CHAIN_STEPS), True),  # npud answers past MAX_CHAIN_STEPS itself
        (_raw_chain(4 * p.MAX_CHAIN_STEPS + 1), False),
        (_raw_chain(0), False),
        (_raw_chain(1, 0), False),
        (_raw_chain(1, p.MAX_TENSORS + 1), False),
    ],
)
def test_the_decoder_bounds_a_chain(payload: bytes, accepted: bool) -> None:
    _, server = connected_pair()
    feed(server, frame(payload))
    if accepted:
        [event] = drain(server)
        assert isinstance(event, p.ModelChainRequest)
    else:
        with pytest.raises(p.RemoteProtocolError) as caught:
            drain(server)
        assert caught.value.code is p.ErrorCode.BAD_MESSAGE


@pytest.mark.parametrize(("offered", "spoken"), [(6, 6), (7, 7), (8, 7), (1, 1)])
def test_a_server_speaks_the_version_both_know(offered: int, spoken: int) -> None:
    assert p.SINCE[p.Feature.CHAIN] == p.PROTOCOL_VERSION == 7
    assert p.choose_protocol_version(offered) == spoken
