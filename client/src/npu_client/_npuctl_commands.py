"""What each npuctl subcommand does, once connected: ``run(client, args)`` returns
the exit status (the parser, :mod:`npu_client._npuctl_parser`, names one per
subcommand; :mod:`npu_client.npuctl` connects and turns npud's errors into statuses)."""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Final, TypeVar

import msgspec

from npu_client import cli
from npu_client._blocking import Client
from npu_client._chain_run import ChainArgs, render_chain, run_chain_once
from npu_client._errors import (
    DeviceNotFound,
    InvalidArgument,
    ModelFileUnreadable,
    ModelFormatError,
    ModelMalformed,
    NpuError,
)
from npu_client._llm import LlmUnavailable
from npu_client._metrics import render, render_down
from npu_client._model_run import RunArgs, RunUsageError, render_run, run_once
from npu_client._selftest import render_report, run_selftest
from npu_client._status_text import render_status
from npu_client._top import Sample
from npu_client._top import frame as top_frame
from npu_client._top import render as render_top

ReportT = TypeVar("ReportT")

NPUCTL_NAME: Final = "npuctl"
"""The client name npuctl gives npud (its row in the status)."""

CLEAR: Final = "\x1b[H\x1b[2J"
"""Home the cursor and clear the screen (ANSI; every terminal emulator knows it)."""

Command = Callable[[Client, argparse.Namespace], int]


def status(client: Client, args: argparse.Namespace) -> int:
    status = client.status()
    if args.json:
        print(msgspec.json.encode(status).decode())
    else:
        print(render_status(status))
    return cli.EXIT_OK


def selftest(client: Client, args: argparse.Namespace) -> int:
    report = run_selftest(client)
    if args.json:
        print(msgspec.json.encode(report).decode())
    else:
        print(render_report(report))
    return cli.EXIT_OK if report.ok else cli.EXIT_FAILURE


def metrics(client: Client, args: argparse.Namespace) -> int:
    write_metrics(render(client.status(), exclude=(os.getpid(), NPUCTL_NAME)), args.output)
    return cli.EXIT_OK


def metrics_down(args: argparse.Namespace) -> None:
    """npud did not answer: say so in the metrics too, so a stale file does not linger."""
    write_metrics(render_down(), args.output)


class OutputError(Exception):
    """--output could not be written; the message says which file and why."""


def write_metrics(text: str, output: Path | None) -> None:
    if output is None:
        sys.stdout.write(text)
        return
    # The collector may read at any moment: never let it see half a file.
    try:
        with tempfile.NamedTemporaryFile(
            "w", dir=output.parent, prefix=f".{output.name}.", delete=False, encoding="utf-8"
        ) as tmp:
            tmp.write(text)
    except OSError as exc:
        raise OutputError(f"cannot write {output}: {exc.strerror}") from None
    try:
        os.chmod(tmp.name, 0o644)
        os.replace(tmp.name, output)
    except OSError as exc:
        os.unlink(tmp.name)
        raise OutputError(f"cannot write {output}: {exc.strerror}") from None


def top(client: Client, args: argparse.Namespace) -> int:
    frames = 1 if args.once else args.count
    redraw = not args.json and sys.stdout.isatty()
    me = (os.getpid(), NPUCTL_NAME)
    before = Sample(client.status(), time.monotonic())
    shown = 0
    while frames is None or shown < frames:
        time.sleep(args.interval)
        after = Sample(client.status(), time.monotonic())
        view = top_frame(before, after, sort=args.sort, exclude=me)
        if args.json:
            print(msgspec.json.encode(view).decode(), flush=True)
        else:
            text = render_top(view, width=shutil.get_terminal_size().columns if redraw else None)
            print(
                f"{CLEAR}{text}" if redraw else text + ("\n" if frames != 1 else ""),
                flush=True,
            )
        before = after
        shown += 1
    return cli.EXIT_OK


def run(client: Client, args: argparse.Namespace) -> int:
    run_args = RunArgs(
        args.model,
        inputs={name: Path(path) for name, path in args.input},
        shapes=dict(args.shape),
        graph=args.graph,
        constants=dict(args.constant),
    )
    return _report(lambda: run_once(client, run_args), render_run, args.json, args.model)


def chain(client: Client, args: argparse.Namespace) -> int:
    chain_args = ChainArgs(
        args.models,
        feeds=list(args.feed),
        inputs={name: Path(path) for name, path in args.input},
        shapes=dict(args.shape),
        outputs=list(args.output),
    )
    return _report(
        lambda: run_chain_once(client, chain_args), render_chain, args.json, "a model or input"
    )


def _report(
    produce: Callable[[], ReportT], render_text: Callable[[ReportT], str], as_json: bool, what: str
) -> int:
    """Print what ``produce`` ran (as text or JSON), or say why it could not: a bad
    command line, or a file it could not open (``what``, when the error names none).
    npud's refusals and timeouts go up to the caller, which says them."""
    try:
        report = produce()
    except RunUsageError as exc:
        error(str(exc))
        return exc.exit_status
    except (NpuError, TimeoutError):
        raise  # npud's answer, or none in time (both OSErrors too): said by the caller
    except OSError as exc:
        error(f"cannot open {exc.filename or what}: {exc.strerror}")
        return cli.EX_NOINPUT
    print(msgspec.json.encode(report).decode() if as_json else render_text(report))
    return cli.EXIT_OK


LLM_STATUSES: Final[tuple[tuple[type[NpuError], int], ...]] = (
    (LlmUnavailable, cli.EX_UNAVAILABLE),
    (DeviceNotFound, cli.EX_UNAVAILABLE),
    (ModelFileUnreadable, cli.EX_NOINPUT),
    (ModelFormatError, cli.EX_DATAERR),
    (ModelMalformed, cli.EX_DATAERR),
    (InvalidArgument, cli.EX_USAGE),
)
"""npuctl llm's exit status for the errors of load_llm and its generation."""


def llm(client: Client, args: argparse.Namespace) -> int:
    # llama.cpp's warnings are the library user's to see; a command shows only errors.
    logging.getLogger("npu_client.llm").setLevel(logging.ERROR)
    prompt = sys.stdin.read() if args.prompt == "-" else args.prompt
    sampling = {
        "max_tokens": args.max_tokens,
        "temperature": args.temperature,
        "top_k": args.top_k,
        "top_p": args.top_p,
        "seed": args.seed,
        "stop": args.stop,
    }
    try:
        with client.load_llm(args.model, n_ctx=args.ctx) as llm:
            if args.json:
                tokens = list(llm.tokens(prompt, **sampling))
                report = {
                    "model": str(args.model),
                    "text": llm.detokenize(tokens),
                    "tokens": tokens,
                    "statistics": msgspec.to_builtins(llm.statistics()),
                }
                print(msgspec.json.encode(report).decode())
                return cli.EXIT_OK
            for piece in llm.stream(prompt, **sampling):
                sys.stdout.write(piece)
                sys.stdout.flush()
            sys.stdout.write("\n")
    except NpuError as exc:
        status = next((code for kind, code in LLM_STATUSES if isinstance(exc, kind)), None)
        if status is None:
            raise  # npud's: said by the caller
        error(exc.message)
        return status
    return cli.EXIT_OK


def debug(client: Client, args: argparse.Namespace) -> int:
    if args.domain and args.action != "ssr":
        error("--domain goes with ssr only")
        return cli.EX_USAGE
    if args.action == "ssr":
        seconds = 1.0 if args.seconds is None else args.seconds
        detail = client.debug_fault("ssr", seconds, domain=args.domain)
    elif args.action == "latency":
        detail = client.debug_fault("latency", args.seconds or 0.0)
    elif args.action == "fail-next-invoke":
        detail = client.debug_fault("fail_next_invoke", code=args.code)
    else:
        detail = client.debug_fault("clear")
    print(detail)
    return cli.EXIT_OK


WATCHING: Final[frozenset[Command]] = frozenset({status, top, metrics})
"""Commands that only read the status: their connection says hello.watch, so npud opens
no DSP process for them (for a user other than root, it would open one of its own)."""


def error(message: str) -> None:
    print(f"npuctl: {message}", file=sys.stderr)
