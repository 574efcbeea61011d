"""The same-work floor: the least machinery that does what npud does for a call.

One blocking thread per connection: ``recvmsg``, decode with the same
``npu_protocol`` objects, the same ``FastRpcSession.invoke`` on the same
emulator (with the same shell loaded), encode, ``sendmsg``. No scheduler, no
tables, no quotas, no second thread on the path. The blocking client cannot
tell it from npud for ``open``, ``invoke``, ``close`` and ``status``; the ratio
of npud to it is npud's own overhead per call, not the emulator's.

Run as ``python -m bench.same_work_server SOCKET [DSP_UNITS]``; it serves until
killed. (A benchmark baseline, not a daemon: no error handling beyond
answering an error, no limits.)
"""

from __future__ import annotations

import socket
import sys
import threading

import npu_protocol as p
from npu_client.transport import ANCILLARY_SPACE, RECV_BUFFER, fds_ancillary
from npud.fastrpc.kernel.invoke_args import Capacity, InArg, Inline, OutArg
from npud.fastrpc.session import FastRpcSession
from npud.ops.backend import DEV_SHELL
from npud.sim import DSP_LIBRARY_DIR, EmulatedDriver, SimConfig

CAPABILITIES = p.DspCapabilities(arch_ver=0x73)


def serve(sock: socket.socket, session: FastRpcSession) -> None:
    conn = p.ServerConnection()
    handles: dict[int, int] = {}
    with sock:
        while True:
            data, _, _, _ = sock.recvmsg(RECV_BUFFER, ANCILLARY_SPACE)
            conn.receive_data(data)
            while True:
                event = conn.next_event()
                if event is p.NEED_DATA:
                    break
                if isinstance(event, p.ConnectionClosed):
                    return
                reply = _answer(event, session, handles)
                if reply is None:
                    continue
                out, fds = conn.send(reply)
                sock.sendmsg([out], fds_ancillary(fds))


def _answer(
    event: object, session: FastRpcSession, handles: dict[int, int]
) -> p.ServerMessage | None:
    if isinstance(event, p.Hello):
        return p.Welcome(
            server_version="same-work-floor",
            protocol_version=p.PROTOCOL_VERSION,
            backend="emulator",
            dsp=CAPABILITIES,
            limits=p.ClientLimits(priority=event.priority),
            epoch=1,
        )
    if isinstance(event, p.InvokeRequest):
        inputs: list[InArg] = [Inline(a.data) for a in event.inputs if isinstance(a, p.InlineInput)]
        outputs: list[OutArg] = [
            Capacity(a.capacity) for a in event.outputs if isinstance(a, p.InlineOutput)
        ]
        result = session.invoke(handles[event.handle], event.scalars, inputs, outputs)
        if result.rc:
            return p.ErrorMessage.for_code(p.ErrorCode.INVOKE_FAILED, id=event.id, code=result.rc)
        return p.InvokeReply(id=event.id, outputs=result.outputs)
    if isinstance(event, p.OpenRequest):
        handle_id = len(handles) + 1
        handles[handle_id] = session.remote_open(event.uri)
        return p.OpenReply(id=event.id, handle=handle_id)
    if isinstance(event, p.CloseRequest):
        session.remote_close(handles.pop(event.handle))
        return p.CloseReply(id=event.id)
    if isinstance(event, p.Request):
        return p.ErrorMessage.for_code(
            p.ErrorCode.UNSUPPORTED, id=event.id, what="the same-work floor only invokes"
        )
    return None


def main(argv: list[str]) -> None:
    path = argv[0]
    units = int(argv[1]) if len(argv) > 1 else 0
    driver = EmulatedDriver(SimConfig(dsp_units=units))
    session = FastRpcSession.open(driver, library_path=(DSP_LIBRARY_DIR,))
    session.load_shell(DEV_SHELL.read_bytes())
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(256)
    print("READY", flush=True)
    while True:
        sock, _ = listener.accept()
        threading.Thread(target=serve, args=(sock, session), daemon=True).start()


if __name__ == "__main__":
    main(sys.argv[1:])
