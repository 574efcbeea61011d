"""A model file's checks, in a process of the load's own.

Before a model reaches the DSP npud walks its file (its kind, external data, a loop,
its shapes: :meth:`npud.fastrpc.stubs.portal_qnn.PortalQnn.check`). A hostile file can
make that walk long (millions of tiny protobuf fields), so it runs neither on the
domain's loader lane, where another user's open or load would wait behind it, nor in
npud's process, where its pure-Python loop would hold the interpreter's lock that
every other client's requests need: each load starts a thread of its own (a user has
at most ``[uid_limits] max_loads_in_flight``), which runs the walks in a child
process, ``python -m npud.requests.model_check``, given a duplicate of the client's fd and
nothing else (a file of at most :data:`IN_PROCESS_MAX` bytes, whose walks are short
whatever it holds, is walked on the thread itself). The child

* limits its own private memory to :data:`CHILD_MEMORY` (RLIMIT_DATA; the walks are
  bounded in memory by construction, npud.formats.onnx_proto, this is the backstop)
  and lowers its priority (:data:`CHILD_NICENESS`),
* walks within ``[daemon] model_check_s`` (:class:`npud.formats.onnx_proto.Budget`),
* prints one JSON line: what the file is, the outputs left for the DSP to size and
  each graph's outputs with rooms (npud.fastrpc.stubs.model_walks.CheckedFile), or the
  walk's refusal, which npud reports as the same walk in npud would.

npud kills a child still running :data:`START_GRACE` seconds past ``model_check_s``
(the load is refused as not checked in time) and reports a child that died as a
refusal (out of memory). The load request waits for :attr:`FileCheck.done` (a gate)
before it goes to the loader lane with the result. The thread and the child read
their own duplicate of the client's fd, closed when the check ends, so the request
may close the client's fd whenever it ends.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import threading
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Final, Literal

from npu_protocol import CodedError, ErrorCode

if TYPE_CHECKING:  # loaded with the first model load, not at start-up
    from npud.fastrpc.stubs.model_walks import CheckedFile
    from npud.formats.onnx_proto import Budget
    from npud.formats.onnx_values import Constant

IN_PROCESS_MAX: Final = 256 << 10
"""A file of at most this many bytes is walked on the check's thread in npud: at most
128 Ki fields, a few tens of milliseconds, cheaper than a child's start."""
CHILD_MEMORY: Final = 256 << 20
"""The child's RLIMIT_DATA: what its walks may hold, with the interpreter's own."""
CHILD_NICENESS: Final = 10
"""Added to the child's nice value: a long walk takes the CPU only when calls do not."""
START_GRACE: Final = 10.0
"""Seconds past ``model_check_s`` before a child still running is killed: its start on a
loaded machine (the walks themselves stop at their budget)."""
OUTPUT_MAX: Final = 1 << 20
"""Bytes of the child's answer read at most (a description, a few tensors)."""


class FileCheck:
    """One load's checks on a thread of their own (which runs them in a child process,
    see the module docstring); :attr:`done` opens when they end and :meth:`outcome` then
    says what they found (or raises their refusal)."""

    def __init__(
        self,
        fd: int,
        backend: Literal["kernel", "emulator"],
        shapes: Mapping[str, Sequence[int]],
        seconds: float | None,
        constants: Mapping[str, Constant] | None = None,
        sizes: Mapping[str, Sequence[Sequence[int]]] | None = None,
    ) -> None:
        from npud.requests.clients import Gate  # noqa: PLC0415  (not in the child)

        self.done = Gate()
        self._backend: Literal["kernel", "emulator"] = backend
        self._shapes = shapes
        self._constants = constants or {}
        self._sizes = sizes or {}
        self._seconds = seconds
        self._result: CheckedFile | None = None
        self._error: CodedError | None = None
        try:
            self._fd = os.dup(fd)  # the thread's own: closed when the check ends
        except OSError as exc:
            raise CodedError(
                ErrorCode.MODEL_FILE_UNREADABLE, detail=f"cannot check the file: {exc.strerror}"
            ) from None
        self._thread = threading.Thread(target=self._run, name="model-check", daemon=True)
        try:
            self._thread.start()
        except RuntimeError:
            os.close(self._fd)
            raise CodedError(
                ErrorCode.INTERNAL_ERROR, detail="no thread for the model check"
            ) from None

    def _run(self) -> None:
        import structlog  # noqa: PLC0415

        from npud.fastrpc.stubs.model_walks import walk_model_file  # noqa: PLC0415
        from npud.fastrpc.stubs.portal_qnn import PortalQnn  # noqa: PLC0415  (see above)
        from npud.formats.onnx_proto import Budget  # noqa: PLC0415

        try:
            small = os.fstat(self._fd).st_size <= IN_PROCESS_MAX
            self._result = PortalQnn.check(
                self._fd,
                self._backend,
                self._shapes,
                Budget(self._seconds),
                walks=walk_model_file if small else walk_in_child,
                constants=self._constants,
                sizes=self._sizes,
            )
        except CodedError as exc:
            self._error = exc
        except Exception as exc:
            structlog.get_logger("npud.requests.model_check").exception("model check failed")
            self._error = CodedError(ErrorCode.INTERNAL_ERROR, detail=type(exc).__name__)
        finally:
            os.close(self._fd)
            self.done.open()

    def outcome(self) -> CheckedFile:
        """What the checks found (once :attr:`done` is open); their refusal raised."""
        assert self.done.is_open, "the check has not ended"
        if self._error is not None:
            raise self._error
        assert self._result is not None
        return self._result


def walk_in_child(
    fd: int,
    backend: str,
    shapes: Mapping[str, Sequence[int]],
    budget: Budget | None,
    constants: Mapping[str, Sequence[int]] | None = None,
    sizes: Mapping[str, Sequence[Sequence[int]]] | None = None,
) -> CheckedFile:
    """:func:`npud.fastrpc.stubs.model_walks.walk_model_file` in a child process (see
    the module docstring): its answer, or its refusal raised here."""
    from npud.formats.onnx_proto import CheckTimeoutError, LimitError  # noqa: PLC0415

    seconds = budget.seconds if budget is not None else None
    argv = [
        sys.executable, "-s", "-B", "-m", "npud.requests.model_check",
        "--fd", str(fd), "--backend", backend,
        "--shapes", json.dumps({name: list(dims) for name, dims in shapes.items()}),
        "--constants", json.dumps({name: list(dims) for name, dims in (constants or {}).items()}),
        "--sizes", json.dumps({name: [list(s) for s in v] for name, v in (sizes or {}).items()}),
    ]  # fmt: skip
    if seconds is not None:
        argv += ["--seconds", repr(seconds)]
    try:
        done = subprocess.run(
            argv,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            pass_fds=(fd,),
            timeout=None if seconds is None else seconds + START_GRACE,
            check=False,
            env=_environment(),
        )
    except subprocess.TimeoutExpired:
        assert seconds is not None
        raise CheckTimeoutError(seconds) from None
    if done.returncode != 0 or not done.stdout:
        raise LimitError(
            f"its check ended without an answer (exit status {done.returncode}; at most"
            f" {CHILD_MEMORY >> 20} MiB of memory)"
        )
    return _answer(json.loads(done.stdout[:OUTPUT_MAX]))


def _environment() -> dict[str, str]:
    """The child's environment: what finds Python and npud, nothing else."""
    keep = ("PATH", "PYTHONPATH", "LANG", "LC_ALL", "VIRTUAL_ENV")
    return {name: os.environ[name] for name in keep if name in os.environ}


def _answer(answer: dict[str, Any]) -> CheckedFile:
    """The child's answer as walk_model_file's result, or its refusal raised."""
    from npud.fastrpc.stubs.model_format import (  # noqa: PLC0415
        ModelFileError,
        ModelFormat,
        Sniffed,
    )
    from npud.fastrpc.stubs.model_shapes import ShapeError  # noqa: PLC0415
    from npud.fastrpc.stubs.model_walks import CheckedFile  # noqa: PLC0415
    from npud.formats.onnx_proto import (  # noqa: PLC0415
        CheckTimeoutError,
        DamagedError,
        GraphTensor,
        LimitError,
    )

    error = answer.get("error")
    message = str(answer.get("message", ""))
    if error == "file":
        raise ModelFileError(answer["kind"], message)
    if error == "shape":
        raise ShapeError(answer["kind"], message)
    if error == "damaged":
        raise DamagedError(message)
    if error == "timeout":
        raise CheckTimeoutError(float(answer["seconds"]))
    if error == "limit":
        raise LimitError(message)
    if error == "os":
        raise OSError(message)
    file = answer["file"]
    model_format = ModelFormat[file["format"]] if file["format"] else None
    sniffed = Sniffed(model_format, file["description"], int(file["size"]), tuple(file["graphs"]))
    unsized = tuple(
        GraphTensor(kind, name, None if dims is None else tuple(dims))
        for kind, name, dims in answer["unsized"]
    )
    rooms = tuple(frozenset(str(name) for name in graph) for graph in answer["rooms"])
    return CheckedFile(sniffed, unsized, rooms)


def _child_answer(
    fd: int,
    backend: str,
    shapes: Mapping[str, Sequence[int]],
    seconds: float | None,
    constants: Mapping[str, Sequence[int]] | None = None,
    sizes: Mapping[str, Sequence[Sequence[int]]] | None = None,
) -> dict[str, Any]:
    """In the child: the walks' result or refusal, as :func:`_answer` reads it."""
    from npud.fastrpc.stubs.model_format import ModelFileError  # noqa: PLC0415
    from npud.fastrpc.stubs.model_shapes import ShapeError  # noqa: PLC0415
    from npud.fastrpc.stubs.model_walks import walk_model_file  # noqa: PLC0415
    from npud.formats import onnx_proto  # noqa: PLC0415

    try:
        checked = walk_model_file(
            fd, backend, shapes, onnx_proto.Budget(seconds), constants or {}, sizes or {}
        )
    except ModelFileError as exc:
        return {"error": "file", "kind": exc.kind, "message": str(exc)}
    except ShapeError as exc:
        return {"error": "shape", "kind": exc.kind, "message": str(exc)}
    except onnx_proto.DamagedError as exc:
        return {"error": "damaged", "message": str(exc)}
    except onnx_proto.CheckTimeoutError as exc:
        return {"error": "timeout", "seconds": exc.seconds}
    except onnx_proto.LimitError as exc:
        return {"error": "limit", "message": str(exc)}
    except OSError as exc:
        return {"error": "os", "message": str(exc)}
    sniffed = checked.file
    return {
        "file": {
            "format": sniffed.format.name if sniffed.format is not None else None,
            "description": sniffed.description,
            "size": sniffed.size,
            "graphs": list(sniffed.graphs),
        },
        "unsized": [[t.kind, t.name, t.dims] for t in checked.unsized],
        "rooms": [sorted(graph) for graph in checked.rooms],
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m npud.requests.model_check",
        description="Walk the model file on --fd as npud does before a load (npud runs it).",
    )
    parser.add_argument("--fd", type=int, required=True)
    parser.add_argument("--backend", choices=("kernel", "emulator"), required=True)
    parser.add_argument("--shapes", default="{}", help="JSON: tensor name -> dimensions")
    parser.add_argument(
        "--constants", default="{}", help="JSON: input name -> dimensions of its value"
    )
    parser.add_argument("--sizes", default="{}", help="JSON: tensor name -> list of dimensions")
    parser.add_argument("--seconds", type=float, default=None)
    args = parser.parse_args(argv)
    resource.setrlimit(resource.RLIMIT_DATA, (CHILD_MEMORY, CHILD_MEMORY))
    os.nice(CHILD_NICENESS)  # the loading user's walk yields the CPU to everyone's calls
    shapes = {str(k): tuple(int(d) for d in v) for k, v in json.loads(args.shapes).items()}
    constants = {str(k): tuple(int(d) for d in v) for k, v in json.loads(args.constants).items()}
    sizes = {
        str(k): tuple(tuple(int(d) for d in s) for s in v)
        for k, v in json.loads(args.sizes).items()
    }
    answer = _child_answer(args.fd, args.backend, shapes, args.seconds, constants, sizes)
    sys.stdout.write(json.dumps(answer) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
