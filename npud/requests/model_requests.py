"""The requests on models: load, info, run, a chain of runs, unload.

The model code (npud.requests.models, portal_qnn, the ONNX reader) is imported by
the first load, not at start-up.
"""

from __future__ import annotations

import os
import time
from typing import TYPE_CHECKING

import npu_protocol as p
from npu_client.transport import OwnedFd
from npu_protocol import CodedError, ErrorCode
from npud.domain.life import Domain
from npud.fastrpc.session import FastRpcSession
from npud.requests.clients import Client, Entry, Kind
from npud.requests.handler import Answer, CallTiming, DaemonView, Handler, Route, destroyable
from npud.requests.holdings import (
    let_go,
)

if TYPE_CHECKING:  # loaded with the first model load (ModelLoad), not at start-up
    from npud.requests.model_check import FileCheck


class LoadModel(Handler[p.ModelLoadRequest]):
    session: FastRpcSession
    since = p.Feature.MODELS
    route = Route.LOADER
    creates = True
    check: FileCheck

    def __init__(
        self, client: Client, domain: Domain, request: p.ModelLoadRequest, daemon: DaemonView
    ) -> None:
        super().__init__(client, domain, request, daemon)
        # The client's file: ours from now on, closed once when the request ends.
        self.file = OwnedFd(self.request.fd)

    def arrive(self) -> None:
        self.session = self.domain.current()
        try:
            size = os.fstat(self.file.fileno()).st_size
        except OSError as exc:
            raise CodedError(
                ErrorCode.MODEL_FILE_UNREADABLE, detail=f"cannot stat the file: {exc.strerror}"
            ) from None
        with self.quotas.reserving:
            self.quotas.check_model(self.client, size)
            self.quotas.begin_load(self.client)
            self._loading = True
            self.entry = self._reserve(Kind.MODEL, size)
        from npud.formats.onnx_values import Constant  # noqa: PLC0415  (as NpuModel)
        from npud.requests.model_check import FileCheck  # noqa: PLC0415  (the first model load loads it)

        # The file's checks run on a thread of this load's own, not on the domain's loader
        # lane (npud/requests/model_check.py); the load goes there once they have ended, with
        # what they found (the rooms and the outputs left to the DSP, for each size).
        request = self.request
        backend = self.domain.device.kind
        assert backend in ("kernel", "emulator")
        self.shapes = {name: tuple(dims) for name, dims in request.shapes.items()}
        self.constants = {
            name: Constant(c.dtype, tuple(c.shape), tuple(c.values))
            for name, c in request.constants.items()
        }
        self.sizes = {n: tuple(tuple(s) for s in v) for n, v in request.sizes.items()}
        self.check = FileCheck(
            self.file.fileno(),
            backend,  # type: ignore[arg-type]
            self.shapes,
            self.domain.device.model_check_seconds,
            self.constants,
            self.sizes,
        )
        self._waits.append(self.check.done)

    def run(self) -> Answer:
        from npud.requests.models import NpuModel  # noqa: PLC0415  (the first model load loads it)

        session, request, objects, domain = (
            self.session,
            self.request,
            self.client.objects,
            self.domain,
        )
        backend = domain.device.kind
        assert backend in ("kernel", "emulator")
        memory = domain.device.require_memory()
        try:
            checked = self.check.outcome()
            model = domain.run(
                session,
                lambda: NpuModel.load(
                    session,
                    domain.registry,
                    backend,  # type: ignore[arg-type]
                    self.file.fileno(),
                    name=request.name,
                    shapes=self.shapes,
                    constants=self.constants,
                    sizes=self.sizes,
                    digests=domain.digests,
                    allocate=lambda size: memory.allocate_fresh(size, self._fallback),
                    release_arena=memory.release,
                    checked=checked,
                ),
            )
        except BaseException:
            objects.failed(self.entry)
            raise
        try:
            self.entry.size = model.bytes
            self.quotas.check_model_bytes(self.client)
            reply_fd = OwnedFd(os.dup(model.arena.fd))
        except BaseException as exc:
            objects.failed(self.entry)
            let_go(domain, models=[model])
            if isinstance(exc, OSError):
                raise CodedError(
                    ErrorCode.DMA_BUF_ALLOC, msg=f"no fd for the reply: {exc.strerror}"
                ) from None
            raise
        if not objects.created(self.entry, model):
            reply_fd.close()
            let_go(domain, models=[model])
            raise CodedError(ErrorCode.DSP_RESTARTED)
        reply = p.ModelLoadReply(
            id=request.id,
            model=self.entry.id,
            info=model.info(self.client.protocol_version),
            fd=reply_fd.fileno(),
        )
        return Answer(reply, reply_fd)

    _loading = False

    def end(self) -> None:
        if self._loading:
            self._loading = False
            self.quotas.end_load(self.client)
        # The client's file: its close may block (FUSE), and this may be the loader lane.
        if self.file.fd >= 0:
            self.domain.device.close_later(self.client.uid, [self.file.detach()])
        super().end()


class ModelInfo(Handler[p.ModelInfoRequest]):
    since = p.Feature.MODELS
    route = Route.HERE
    acquires = False

    def arrive(self) -> None:
        self.entry = self._use(self.request.model, Kind.MODEL)

    def run(self) -> Answer:
        info = self._model(self.entry).info(self.client.protocol_version)
        return Answer(p.ModelInfoReply(id=self.request.id, info=info))


class RunModel(Handler[p.ModelRunRequest]):
    """One run, scheduled like an invoke; the model is held from arrival to the end."""

    session: FastRpcSession

    since = p.Feature.MODELS

    route = Route.DSP

    def arrive(self) -> None:
        if self.request.graph and not p.speaks(self.client.protocol_version, p.Feature.GRAPHS):
            # Served as the connection's version knows it: no graph but the first.
            raise CodedError(
                ErrorCode.UNSUPPORTED,
                what="model_run.graph on this connection: it came with a later protocol"
                " version than this connection speaks; offer that version in the hello",
            )
        self.session = self.domain.current()
        request = self.request
        timing = self.timing = CallTiming(
            self.client, self.limits, request.timeout_ms, request.deadline_ms
        )
        self.entry = self._use(self.request.model, Kind.MODEL)
        timing.begin()

    def run(self) -> Answer:
        model = self._model(self.entry)
        graph = model.graph_index(self.request.graph)
        started = time.perf_counter()
        try:
            shapes = self.domain.run(model.session, lambda: model.run(graph))
        finally:
            self.dsp_seconds = time.perf_counter() - started
        model.count_run(self.dsp_seconds)
        dsp_us = round(self.dsp_seconds * 1_000_000)
        return Answer(p.ModelRunReply(id=self.request.id, dsp_us=dsp_us, output_shapes=shapes))

    def end(self) -> None:
        if self.timing is not None:
            self.timing.end()
        super().end()


class RunChain(Handler[p.ModelChainRequest]):
    """Several loaded models in one request (npud/requests/chains.py), scheduled like one run;
    every model it names is held from arrival to the end."""

    session: FastRpcSession

    since = p.Feature.CHAIN
    route = Route.DSP

    def arrive(self) -> None:
        from npud.requests.chains import MAX_STEPS, too_many_steps  # noqa: PLC0415  (as RunModel)

        steps = self.request.steps
        if len(steps) > MAX_STEPS:
            raise too_many_steps(len(steps))
        self.session = self.domain.current()
        request = self.request
        timing = self.timing = CallTiming(
            self.client, self.limits, request.timeout_ms, request.deadline_ms
        )
        self.entries: dict[int, Entry] = {}
        for step in steps:
            if step.model not in self.entries:
                self.entries[step.model] = self._use(step.model, Kind.MODEL)
        timing.begin()

    def run(self) -> Answer:
        from npud.requests import chains  # noqa: PLC0415  (loaded with the first chain)

        models = [self._model(self.entries[step.model]) for step in self.request.steps]
        session = models[0].session
        plan = chains.plan_chain(self.request, models, session)
        started = time.perf_counter()
        try:
            shapes = self.domain.run(session, lambda: chains.run_chain(plan))
        finally:
            self.dsp_seconds = time.perf_counter() - started
        for model in plan.models:
            model.count_run(self.dsp_seconds / len(plan.models))
        dsp_us = round(self.dsp_seconds * 1_000_000)
        return Answer(p.ModelChainReply(id=self.request.id, dsp_us=dsp_us, output_shapes=shapes))

    def end(self) -> None:
        if self.timing is not None:
            self.timing.end()
        super().end()


class UnloadModel(Handler[p.ModelUnloadRequest]):
    since = p.Feature.MODELS
    route = Route.LOADER
    acquires = False

    def arrive(self) -> None:
        self.entry = self.client.objects.doom(self.request.model, Kind.MODEL)
        self._waits += destroyable(self.entry)

    def run(self) -> Answer:
        model = self._model(self.entry)
        self.client.objects.remove(self.entry)
        let_go(self.domain, models=[model], strict=True)
        return Answer(p.ModelUnloadReply(id=self.request.id))


# --- daemon ----------------------------------------------------------------------------
