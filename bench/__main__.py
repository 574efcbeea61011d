"""npud benchmarks: each beside its baseline in the same run, reported as ratios with spread.

Runs the benchmark modules listed in MODULES (or those named with --only),
prints one table and writes a JSON summary (its path is printed last). A module
whose optional build or package is missing here (llm: make llm; batch_rtt: make
peer-llama) is skipped with what to do, unless named with --only. Each
ratio is the median of per-round ratios, baseline and subject interleaved
within the run; IQR is the interquartile range of those per-round ratios.
Absolute figures on a shared machine mean little; compare the ratios.
How to add a module: bench/README.md.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import platform
import sys
import tempfile
import time
import traceback
from collections.abc import Sequence
from pathlib import Path
from typing import cast

from bench.harness import (
    REPO_ROOT,
    Benchmark,
    Context,
    Row,
    UnavailableError,
    format_table,
    timestamp,
)

MODULES: dict[str, str] = {
    "echo": "bench.echo",
    "dispatch": "bench.dispatch",
    "scheduling": "bench.scheduling",
    "transfer": "bench.transfer",
    "pool": "bench.pool",
    "client_cost": "bench.client_cost",
    "emulator": "bench.emulator",
    "portal_qnn_vad": "bench.portal_qnn_vad",
    "model_vad": "bench.model_vad",
    "voice_models": "bench.voice_models",
    "daemon": "bench.daemon",
    "domains": "bench.domains",
    "confinement": "bench.confinement",
    "voice_day": "bench.voice_day",
    "llm": "bench.llm",
    "batch_rtt": "bench.batch_rtt",
    "gate_policy": "bench.gate_policy",
    "attacks": "bench.attacks",
}
"""Every benchmark module by its NAME, in the order they run. Add yours here."""


def load(name: str) -> Benchmark:
    """The benchmark module called ``name`` (imported only when it runs or is listed)."""
    module = cast(Benchmark, importlib.import_module(MODULES[name]))
    if name != module.NAME:
        raise SystemExit(f"{MODULES[name]} is named {module.NAME!r}, listed as {name!r}")
    return module


def build_parser(names: Sequence[str]) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m bench",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--only",
        action="append",
        default=[],
        metavar="NAME",
        help=f"run only these modules (repeat or comma-separate): {', '.join(names)}",
    )
    parser.add_argument(
        "--quick", action="store_true", help="fewer rounds and calls: a smoke run, not figures"
    )
    parser.add_argument(
        "--json",
        type=Path,
        default=None,
        metavar="PATH",
        help="where to write the JSON summary (default: build/bench/<UTC time>.json in the repo)",
    )
    parser.add_argument("--list", action="store_true", help="list the modules and exit")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser(list(MODULES)).parse_args(argv)
    if args.list:
        for name in MODULES:
            print(f"{name:15} {load(name).SUMMARY}")
        return 0
    selected = [name for item in args.only for name in item.split(",") if name]
    unknown = [name for name in selected if name not in MODULES]
    if unknown:
        print(
            f"python -m bench: unknown module {', '.join(unknown)}; "
            f"choose from {', '.join(MODULES)}",
            file=sys.stderr,
        )
        return 2
    chosen = [name for name in MODULES if not selected or name in selected]
    summary_path = args.json or REPO_ROOT / "build" / "bench" / f"{timestamp()}.json"

    started = time.time()
    load_before = os.getloadavg()
    rows: list[Row] = []
    errors: dict[str, str] = {}
    skipped: dict[str, str] = {}
    with tempfile.TemporaryDirectory(prefix="npud-bench-") as tmp:
        for name in chosen:
            workdir = Path(tmp) / name
            workdir.mkdir()
            try:
                module = load(name)
                print(f"{name}: {module.SUMMARY}", file=sys.stderr, flush=True)
                rows.extend(module.rows(Context(quick=args.quick, workdir=workdir)))
            except UnavailableError as exc:
                if name in selected:  # asked for by name: it was not run
                    errors[name] = f"{type(exc).__name__}: {exc}"
                else:
                    skipped[name] = str(exc)
                print(f"{name}: unavailable here: {exc}", file=sys.stderr, flush=True)
            except Exception as exc:  # one broken module must not hide the others' figures
                traceback.print_exc()
                errors[name] = f"{type(exc).__name__}: {exc}"

    print(format_table(rows, quick=args.quick))
    for name, reason in skipped.items():
        print(f"{name}: SKIPPED: {reason}")
    for name, error in errors.items():
        print(f"{name}: FAILED: {error}")
    summary = {
        "command": ["python", "-m", "bench", *(argv if argv is not None else sys.argv[1:])],
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)),
        "seconds": round(time.time() - started, 1),
        "quick": args.quick,
        "machine": {
            "python": platform.python_version(),
            "kernel": platform.release(),
            "cpus": os.cpu_count(),
            "load_average_before": load_before,
            "load_average_after": os.getloadavg(),
        },
        "rows": [row.as_json() for row in rows],
        "errors": errors,
        "skipped": skipped,
    }
    summary_path.parent.mkdir(parents=True, exist_ok=True)
    summary_path.write_text(json.dumps(summary, indent=2) + "\n")
    print(f"summary: {summary_path}")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
