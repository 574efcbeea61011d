"""The requests on the daemon itself: status, ping and debug."""

from __future__ import annotations

from typing import TYPE_CHECKING

import structlog

import npu_protocol as p
from npu_protocol import CodedError, ErrorCode
from npud.domain.life import Domain
from npud.fastrpc.kernel.driver import FaultControl
from npud.requests.handler import Answer, Handler, Route

if TYPE_CHECKING:  # loaded with the first model load (ModelLoad), not at start-up
    pass

_log = structlog.get_logger("npud.requests.daemon_requests")


class Status(Handler[p.StatusRequest]):
    route = Route.HERE
    acquires = False

    def run(self) -> Answer:
        status = self.daemon.status(self.client)
        return Answer(p.StatusReply(id=self.request.id, status=status))


class Ping(Handler[p.PingRequest]):
    route = Route.HERE
    acquires = False

    def run(self) -> Answer:
        return Answer(p.PongReply(id=self.request.id, payload=self.request.payload))


class Debug(Handler[p.DebugRequest]):
    """Fault injection on the emulator, for exercising recovery on a running daemon."""

    since = p.Feature.MODELS

    route = Route.HERE
    acquires = False

    def arrive(self) -> None:
        if self.client.uid != 0:
            raise CodedError(
                ErrorCode.NOT_PERMITTED,
                detail=f"debug faults need root (this client is uid {self.client.uid})",
            )
        faults = self.domain.device.driver.fault_control()
        if faults is None:
            raise CodedError(
                ErrorCode.UNSUPPORTED,
                what="debug faults on the kernel backend: they are the emulator's",
            )
        self.faults: FaultControl = faults
        self.target: Domain | None = None
        if self.request.domain:
            target = self.daemon.domain_named(self.request.domain)
            if target is None:
                raise CodedError(
                    ErrorCode.INVALID_ARGUMENT, detail=f"no domain {self.request.domain!r}"
                )
            if self.request.action != "ssr":
                raise CodedError(
                    ErrorCode.INVALID_ARGUMENT,
                    detail="a domain is a target of ssr only (the other faults are the DSP's)",
                )
            self.target = target

    def run(self) -> Answer:
        faults = self.faults
        request = self.request
        seconds = request.duration_ms / 1000
        if request.action == "ssr" and self.target is not None:
            detail = _crash_domain(faults, self.target)
        elif request.action == "ssr":
            faults.subsystem_restart(down_for=seconds)
            detail = f"subsystem restart: the DSP is away for {seconds:g} s"
        elif request.action == "latency":
            faults.set_latency(seconds)
            detail = f"every invoke now takes {seconds:g} s longer"
        elif request.action == "fail_next_invoke":
            if request.code == 0:
                raise CodedError(
                    ErrorCode.INVALID_ARGUMENT, detail="fail_next_invoke needs a non-zero code"
                )
            faults.fail_next_invoke(request.code)
            detail = f"the next invoke answers 0x{request.code:08X}"
        else:
            faults.clear()
            detail = "latency and pending failures cleared"
        _log.warning(
            "debug fault injected", action=request.action, detail=detail, pid=self.client.pid
        )
        return Answer(p.DebugReply(id=request.id, detail=detail))


def _crash_domain(faults: FaultControl, domain: Domain) -> str:
    """The domain's DSP process crashes (the emulator kills it): the domain recovers alone."""
    session = domain.session
    if session is None:
        raise CodedError(ErrorCode.DSP_RESTARTED)
    if not faults.crash_process(session.fileno()):
        raise CodedError(
            ErrorCode.INVALID_ARGUMENT, detail=f"domain {domain.name!r} has no DSP process"
        )
    domain.notice_restart("the DSP process crashed (debug ssr of the domain)", session)
    return f"the DSP process of domain {domain.name!r} crashed; it restarts alone"
