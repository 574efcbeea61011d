"""The one event drain (npud/datapath/drain.py) the handshake and the link share."""

from __future__ import annotations

import os
from collections.abc import Sequence

import structlog

import npu_protocol as p
from npud.datapath.drain import Ending, drain
from npud.ops.loglimit import LogBudget


class Closer:
    def __init__(self, *, accept: bool = True) -> None:
        self.closed: list[int] = []
        self.accept = accept

    def __call__(self, fds: Sequence[int]) -> bool:
        for fd in fds:
            os.close(fd)
        self.closed.extend(fds)
        return self.accept


def drained(
    protocol: p.ServerConnection, closer: Closer, *, first_only: bool = False
) -> tuple[list[p.ClientMessage], Ending | None]:
    return drain(
        protocol,
        close_later=closer,
        log=structlog.get_logger(),
        log_budget=LogBudget(5, 10.0),
        fds_waiting_cap=7,
        first_only=first_only,
    )


def hello_bytes(client: p.ClientConnection) -> bytes:
    data, _ = client.send(p.Hello(protocol_version=p.PROTOCOL_VERSION, client_name="t"))
    return bytes(data)


def test_the_handshake_stops_at_the_hello_and_leaves_what_follows() -> None:
    server = p.ServerConnection()
    server.receive_data(hello_bytes(p.ClientConnection()) + b"NP")  # and a frame begun
    messages, ending = drained(server, Closer(), first_only=True)
    assert [type(m) for m in messages] == [p.Hello]
    assert ending is None
    assert server.bytes_buffered == 2  # for the link, after the Welcome


def test_a_violation_ends_with_its_one_answer_and_the_fds_closed() -> None:
    server = p.ServerConnection()
    read_end, write_end = os.pipe()
    closer = Closer()
    server.receive_data(b"garbage!" * 4, [read_end, write_end])
    messages, ending = drained(server, closer)
    assert messages == []
    assert ending is not None
    assert ending.violation
    assert ending.reason.startswith("protocol violation")
    assert sorted(closer.closed) == sorted([read_end, write_end])


def test_stray_fds_are_closed_and_too_many_waiting_end_the_peer() -> None:
    server = p.ServerConnection()
    read_end, write_end = os.pipe()
    closer = Closer(accept=False)
    server.receive_data(hello_bytes(p.ClientConnection()), [read_end, write_end])  # unasked
    _, ending = drained(server, closer)
    assert sorted(closer.closed) == sorted([read_end, write_end])
    assert ending is not None
    assert ending.reason == "too many of its user's fds wait to be closed"
    farewell = ending.farewell
    assert farewell is not None
    assert farewell.error_code is p.ErrorCode.QUOTA_EXCEEDED
    assert farewell.fields["limit"] == 7


def test_the_end_of_the_stream_is_no_violation() -> None:
    server = p.ServerConnection()
    server.receive_data(b"")  # end of stream
    messages, ending = drained(server, Closer())
    assert messages == []
    assert ending is not None
    assert not ending.violation
    assert ending.reason == "closed by the client"
