"""The floor: a bare trio server speaking npud's framing, with no DSP behind it.

It answers the Hello, ``open`` and ``close``, and answers every ``invoke`` by
echoing its last inline input into its inline output, as the echo skel does.
The blocking client cannot tell it from npud, so the difference between the
two round trips is what npud, its lanes and the (emulated) driver add.

Run as ``python -m bench.floor_server SOCKET``; it prints ``READY`` once listening.
"""

from __future__ import annotations

import socket
import sys

import trio

import npu_protocol as p
from npu_client.transport import ANCILLARY_SPACE, RECV_BUFFER, fds_ancillary

CAPABILITIES = p.DspCapabilities(arch_ver=0x73)


async def serve(sock: trio.socket.SocketType) -> None:
    conn = p.ServerConnection()
    next_handle = 1
    with sock:
        while True:
            data, _, _, _ = await sock.recvmsg(RECV_BUFFER, ANCILLARY_SPACE)
            conn.receive_data(data)
            while True:
                event = conn.next_event()
                if event is p.NEED_DATA:
                    break
                if isinstance(event, p.ConnectionClosed):
                    return
                reply: p.ServerMessage
                if isinstance(event, p.Hello):
                    reply = p.Welcome(
                        server_version="floor",
                        protocol_version=p.PROTOCOL_VERSION,
                        backend="floor",
                        dsp=CAPABILITIES,
                        limits=p.ClientLimits(priority=event.priority),
                        epoch=1,
                    )
                elif isinstance(event, p.OpenRequest):
                    reply = p.OpenReply(id=event.id, handle=next_handle)
                    next_handle += 1
                elif isinstance(event, p.CloseRequest):
                    reply = p.CloseReply(id=event.id)
                elif isinstance(event, p.InvokeRequest):
                    reply = p.InvokeReply(id=event.id, outputs=_echo(event))
                elif isinstance(event, p.Request):
                    reply = p.ErrorMessage.for_code(
                        p.ErrorCode.UNSUPPORTED, id=event.id, what="the floor server only echoes"
                    )
                else:
                    continue
                out, fds = conn.send(reply)
                await sock.sendmsg([out], fds_ancillary(fds))


def _echo(request: p.InvokeRequest) -> tuple[bytes | None, ...]:
    inline = [arg.data for arg in request.inputs if isinstance(arg, p.InlineInput)]
    data = inline[-1] if inline else b""
    return tuple(
        data[: arg.capacity].ljust(arg.capacity, b"\0") if isinstance(arg, p.InlineOutput) else None
        for arg in request.outputs
    )


async def main(path: str) -> None:
    listener = trio.socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    await listener.bind(path)
    listener.listen(16)
    print("READY", flush=True)
    async with trio.open_nursery() as nursery:
        while True:
            sock, _ = await listener.accept()
            nursery.start_soon(serve, sock)


if __name__ == "__main__":
    trio.run(main, sys.argv[1])
