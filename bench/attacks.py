"""Attacks: a hostile user beside a victim user running VAD, npud as shipped (issue 27).

The review's five high findings and its critical one, each repeated as an attacker
beside a victim, in one table. npud runs on the emulator with config/npud.toml as
shipped (the victim and the attackers allowed, the call watchdog at 0.5 s so a hung call
ends within the run). The victim, uid 65534 (nobody), runs the Silero VAD model every 32 ms and
holds a buffer of its own with a secret in it, mapped into its DSP process. The
attacker runs each scenario in turn, each for the same time (10 s; 3 s with --quick),
each scenario as a user of its own (uid 65533 for the first, 65532 for the second, and
so on: :func:`attacker_uids`): npud rightly makes a user pay for what it did (a user
whose connections it dropped for breaking the protocol, as fault_loop's and the
stray_fds ones' are, has its new connections refused for a minute; one whose calls hung
runs throttled, then is refused), and an attacker already refused would measure
nothing in the next scenario. Before each, a quiet window of that length, that
scenario's attacker connected and idle (its own DSP process open, as any user's may
be), is the baseline. Victim and attackers are processes forked from the bench that
drop to their uid. Needs root (the other users).

Each scenario gives four rows, ``attacks.<scenario>.<what>``, with issue 27's goals:

* ``errors``: the victim's failed runs during the attack (and, for isolate_hog, its own
  isolated Hello if refused). Goal 0. The attack's own figures (``attacker_*``) are
  beside it.
* ``worst``: the victim's worst run during the attack, in ms (``quiet_worst_ms``: in the
  quiet window). Goal at most 100 ms.
* ``rss``: npud's peak resident memory attacked / quiet. Goal at most 1.1.
* ``fds``: npud's peak open fds attacked / quiet. Goal at most 1.1. Where the attack
  holds what npud grants any user within a bound, that is the attacker's own and is
  taken off the peak first (``attacker_own_fds``): for isolate_hog the fds npud held
  with its 4 DSP processes and connections up, measured; for stray_fds and
  stray_fds_loop the peak's excess over quiet up to ``attacker_fds_bound``, its
  ``max_fds_waiting`` + 4 fds waiting to be closed.
  ``npud_fds_left``: npud's fds once the attack ended and settled, over those with the
  victim alone (goal 0: it returned).

The scenarios, in order:

* ``cross_user`` (critical): the attacker's DSP code (the dspqueue skel's
  ``init_process_state``, which maps the memory an fd names) tries every fd number up
  to 512. ``attacker_reached``: other users' buffers it mapped (must be 0).
* ``isolate_hog``: 11 isolated Hellos held at once; ``attacker_processes``: DSP
  processes it got (``max_domains_per_uid``, 4); the victim's isolated Hello meanwhile
  counts as an error if refused.
* ``fault_loop``: ``npu_test.fault`` in a loop; ``attacker_crashes``: DSP processes it
  crashed (0: faults are root's), ``attacker_refused``: calls refused.
* ``crafted_onnx_4mib``, ``crafted_onnx_8mib`` (``crafted_onnx_16mib`` with
  --crafted-16mib): the review's ONNX file of 2-byte empty nodes, loaded once
  (``attacker_load_s``: its wait for the answer; ``attacker_refused``: 1 if refused).
* ``stray_fds``: after its Hello, a frame header, then one byte at a time with 4 fds
  on each, on one connection, as the review did; ``attacker_dropped``: 1 when npud
  dropped it (at ``max_fds_waiting``), ``attacker_fds_sent``; then idle.
* ``stray_fds_loop``: the same on a new connection each time npud drops one, for the
  whole window (``attacker_connections``).
* ``hung_calls``: 45 s calls, each on a fresh connection; ``attacker_hung``: calls the
  watchdog ended, ``attacker_refused``: Hellos refused (its user is revoked after
  ``hung_calls_before_revoke``, 2).
* ``zero_stride``: an htp CPY batch of 2^29 f32 elements of stride 0 over 4 bytes in
  one emulated DSP process, beside a victim htp session (a SCALE batch every 32 ms) in
  another. It runs in the bench's own process on the emulator (npud's clients have no
  dspqueue API), so "npud" there is the driver's side; ``attacker_status`` (4:
  INVAL_PARAMS), ``attacker_dsp_alive``, ``attacker_dsp_peak_rss_mib``.

Another attack through npud is one more function ``(socket path, seconds) -> figures``
run as the attacker, and one more entry in :data:`SCENARIOS`
(both in bench/attacks_scenarios.py). The parts: the forked users (attacks_users),
the victim (attacks_victim), the scenarios (attacks_scenarios), npud's footprint
(attacks_footprint), the parse and batch attacks (attacks_parse); this module runs
the windows and makes the rows.

Run: ``python -m bench --only attacks`` (every scenario but the 16 MiB file), or
``python -m bench.attacks [--only SCENARIO,...] [--crafted-16mib] [--seconds S]
[--quick]``.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
import tomllib
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Final

import npu_protocol as p
from bench.attacks_footprint import Sampler, open_fds, settle
from bench.attacks_parse import Outcome, zero_stride
from bench.attacks_scenarios import (
    LOCAL,
    OPTIONAL,
    ORDER,
    SCENARIOS,
    Scenario,
    attacker_runs,
    idle_attacker,
)
from bench.attacks_users import as_user
from bench.attacks_victim import preload, victim_isolates, victim_runs
from bench.harness import REPO_ROOT, Context, Goal, Row, format_table, ratio_row
from bench.processes import running, wait_for_hello

__all__ = [
    "ATTACKER",
    "ATTACKER_UIDS",
    "NAME",
    "OPTIONAL",
    "ORDER",
    "SCENARIOS",
    "SUMMARY",
    "VICTIM",
    "WATCHDOG_S",
    "attacker_uids",
    "main",
    "rows",
    "run",
]

NAME = "attacks"
SUMMARY = "an attacker uid beside a victim uid running VAD: errors, worst latency, npud's RSS/fds"

VICTIM: Final = 65534
ATTACKER: Final = 65533
"""The first scenario's attacker; the next ones count down from it."""
ATTACKER_UIDS: Final = 13
"""Attacker uids at most, one per scenario: 65533 down to 65521, between systemd's
dynamic users (61184-65519) and nobody (the victim), so no user of the system's own."""
WATCHDOG_S: Final = 0.5


def attacker_uids(names: Sequence[str]) -> dict[str, int]:
    """Each scenario's attacker, a uid of its own: ``ATTACKER`` for the first, one less
    for each next. A user npud refused for what it did in one scenario (a minute, after
    its connections were dropped or its calls hung) is not the next one's attacker."""
    if len(names) > ATTACKER_UIDS:
        raise ValueError(f"{len(names)} scenarios: the attackers' uids are {ATTACKER_UIDS}")
    if len(set(names)) != len(names):
        raise ValueError(f"a scenario is named twice in {', '.join(names)}")
    return {name: ATTACKER - n for n, name in enumerate(names)}


def _shipped_config(attackers: Sequence[int] = (ATTACKER,)) -> str:
    """config/npud.toml as shipped, on the emulator, with the victim and ``attackers``
    allowed."""
    allowed = ", ".join(str(uid) for uid in (VICTIM, *attackers))
    text = (REPO_ROOT / "config" / "npud.toml").read_text()
    for old, new in {
        'kind = "auto"': 'kind = "emulator"',
        'socket_mode = "0660"': 'socket_mode = "0666"',
        'log_level = "info"': 'log_level = "warning"',
        "call_watchdog_s = 30.0": f"call_watchdog_s = {WATCHDOG_S}",
        "allow_uids = []": f"allow_uids = [{allowed}]",
    }.items():
        if old not in text:
            raise RuntimeError(f"config/npud.toml no longer has {old!r}")
        text = text.replace(old, new)
    return text


def _max_fds_waiting() -> int:
    """``[uid_limits] max_fds_waiting`` as shipped: the fds of one user npud may hold
    waiting to be closed."""
    value = tomllib.loads(_shipped_config())["uid_limits"]["max_fds_waiting"]
    assert isinstance(value, int)
    return value


# --- the module -------------------------------------------------------------------------


def rows(ctx: Context) -> list[Row]:
    """Every scenario of :data:`SCENARIOS` and :data:`LOCAL` (``python -m bench``)."""
    return run(ctx, [*SCENARIOS, *LOCAL])


def run(ctx: Context, names: list[str], seconds: float | None = None) -> list[Row]:
    """The scenarios ``names`` (of SCENARIOS, OPTIONAL and LOCAL), each ``seconds`` long
    (default 10, 3 with ``--quick``) after as long a quiet window."""
    if os.geteuid() != 0:
        raise RuntimeError("the attacks bench needs root: it runs clients as two other users")
    if seconds is None:
        seconds = 3.0 if ctx.quick else 10.0
    through_npud = {**SCENARIOS, **OPTIONAL}
    chosen = {n: through_npud[n] for n in ORDER if n in names}
    found = _through_npud(ctx, chosen, seconds)
    if "zero_stride" in names:
        ctx.progress("attacks: zero_stride, on the emulator in this process")
        found += _zero_stride_rows(zero_stride(settle_s=seconds / 2))
    return found


def _through_npud(  # noqa: PLR0915 - the windows, step by step
    ctx: Context, chosen: dict[str, Scenario], seconds: float
) -> list[Row]:
    if not chosen:
        return []
    from bench.model_vad import SILERO  # noqa: PLC0415 - numpy and the model, when it runs

    workdir = ctx.workdir / "attacks"
    workdir.mkdir(exist_ok=True)
    workdir.chmod(0o711)
    uids = attacker_uids(list(chosen))
    config = workdir / "npud.toml"
    config.write_text(_shipped_config(list(uids.values())))
    socket_path = workdir / "npud.sock"
    args = [
        sys.executable, "-m", "npud.daemon.main", "--config", str(config),
        "--socket", str(socket_path), "--log-format", "json",
    ]  # fmt: skip
    found: list[Row] = []
    with (
        running(args, stderr=workdir / "npud.log") as daemon,
        open(SILERO, "rb") as model,
    ):
        wait_for_hello(daemon, socket_path)
        preload(socket_path, model)
        with as_user(VICTIM, socket_path, victim_runs(model)) as victim:
            if victim.hear() != "ready":
                raise RuntimeError("the victim did not start")
            windows: list[tuple[str, float, float, float, dict[str, float]]] = []
            settled = open_fds(daemon.pid)
            for name, scenario in chosen.items():
                uid = uids[name]
                ctx.progress(
                    f"attacks: {name}, as uid {uid}, quiet then attacked, {seconds:g} s each"
                )
                settle(daemon.pid, settled)
                with as_user(uid, socket_path, idle_attacker) as idle:
                    connected = idle.hear()  # the quiet window has the attacker's user in
                    if connected != "connected":
                        raise RuntimeError(
                            f"attacks: {name}: its attacker, uid {uid}, could not connect "
                            f"for the quiet window: {connected['error']}"
                        )
                    with Sampler(daemon.pid) as quiet:
                        quiet_start = time.monotonic()
                        time.sleep(seconds)
                    idle.say("go")
                settle(daemon.pid, settled)
                attack_start = time.monotonic()
                own = 0
                with (
                    Sampler(daemon.pid) as attacked,
                    as_user(uid, socket_path, attacker_runs(scenario, seconds)) as attacker,
                ):
                    extra = 0.0
                    if name == "isolate_hog":
                        time.sleep(seconds / 2)
                        own = open_fds(daemon.pid)  # the attacker's, held: less npud's below
                        with as_user(VICTIM, socket_path, victim_isolates) as trying:
                            extra = 0.0 if trying.hear() else 1.0
                    figures = attacker.hear()
                attack_end = time.monotonic()
                if "error" in figures:
                    raise RuntimeError(f"attacks: {name}: {figures['error']}")
                settle(daemon.pid, settled)
                after = open_fds(daemon.pid)
                figures.update(
                    victim_isolate_refused=extra,
                    npud_rss_mib=attacked.rss / (1 << 20),
                    quiet_rss_mib=quiet.rss / (1 << 20),
                    npud_fds=attacked.fds,
                    quiet_fds=quiet.fds,
                    npud_fds_left=after - settled,
                )
                if own:
                    figures["attacker_own_fds"] = own - after
                if name.startswith("stray_fds"):
                    # What npud may hold for it: its fds waiting to be closed, up to their
                    # bound (the peak over quiet, if less: the sampler may miss a spike).
                    bound = _max_fds_waiting() + p.MAX_FDS_PER_FRAME
                    figures["attacker_fds_bound"] = bound
                    figures["attacker_own_fds"] = min(bound, max(0, attacked.fds - quiet.fds))
                windows.append((name, quiet_start, attack_start, attack_end, figures))
            victim.say("stop")
            runs: list[list[Any]] = victim.hear()
    for name, quiet_start, attack_start, attack_end, figures in windows:
        found += _scenario_rows(name, runs, quiet_start, attack_start, attack_end, figures)
    return found


def _scenario_rows(
    name: str,
    runs: list[list[Any]],
    quiet_start: float,
    attack_start: float,
    attack_end: float,
    figures: dict[str, float],
) -> list[Row]:
    quiet = [r for r in runs if quiet_start <= r[0] < attack_start]
    attacked = [r for r in runs if attack_start <= r[0] < attack_end]
    errors = sum(not ok for _, _, ok in attacked) + figures.pop("victim_isolate_refused", 0.0)
    worst_ms = max((seconds * 1000 for _, seconds, _ in attacked), default=float("nan"))
    quiet_worst_ms = max((seconds * 1000 for _, seconds, _ in quiet), default=float("nan"))
    apart = ("attacker_own_fds", "attacker_fds_bound")  # the fds row's
    attack = {k: v for k, v in figures.items() if k.startswith("attacker_") and k not in apart}
    own = figures.get("attacker_own_fds", 0.0)
    fds_figures = {
        "npud_fds": figures["npud_fds"],
        "quiet_fds": figures["quiet_fds"],
        "npud_fds_left": figures["npud_fds_left"],
    }
    fds_figures.update({k: figures[k] for k in apart if k in figures})
    return _rows(
        f"attacks.{name}",
        errors=errors,
        victim={"victim_runs": len(attacked), **attack},
        worst_ms=worst_ms,
        quiet_worst_ms=quiet_worst_ms,
        rss=(figures["npud_rss_mib"], figures["quiet_rss_mib"]),
        fds=((figures["npud_fds"] - own) / figures["quiet_fds"], fds_figures),
        fds_what=(
            "npud's peak fds attacked, less the attacker's own within its bound "
            "(attacker_own_fds), / quiet"
            if "attacker_own_fds" in figures
            else "npud's peak fds attacked / quiet"
        ),
    )


def _rows(
    prefix: str,
    *,
    errors: float,
    victim: dict[str, float],
    worst_ms: float,
    quiet_worst_ms: float,
    rss: tuple[float, float],
    fds: tuple[float, dict[str, float]],
    fds_what: str = "npud's peak fds attacked / quiet",
) -> list[Row]:
    """The four rows of one scenario, with the goals of issue 27."""
    return [
        ratio_row(
            f"{prefix}.errors",
            "the victim's failed runs during the attack (count)",
            [errors],
            victim,
            Goal("ratio", 0),
        ),
        ratio_row(
            f"{prefix}.worst",
            "the victim's worst run during the attack (ms)",
            [worst_ms],
            {"quiet_worst_ms": quiet_worst_ms},
            Goal("ratio", 100),
        ),
        ratio_row(
            f"{prefix}.rss",
            "npud's peak RSS attacked / quiet",
            [rss[0] / rss[1]],
            {"npud_rss_mib": rss[0], "quiet_rss_mib": rss[1]},
            Goal("ratio", 1.1),
        ),
        ratio_row(f"{prefix}.fds", fds_what, [fds[0]], fds[1], Goal("ratio", 1.1)),
    ]


def _zero_stride_rows(outcome: Outcome) -> list[Row]:
    """zero_stride's rows: "npud" is the bench's process here (the driver's side)."""
    quiet_worst_ms = outcome.details.pop("quiet_worst_ms")
    return _rows(
        "attacks.zero_stride",
        errors=outcome.victim_errors,
        victim={
            "victim_runs": outcome.victim_runs,
            "attacker_batch_s": outcome.load_s,
            **outcome.details,
        },
        worst_ms=outcome.victim_worst_ms,
        quiet_worst_ms=quiet_worst_ms,
        rss=(outcome.peak_rss_mib, outcome.rss_before_mib),
        fds=(
            outcome.peak_fds / outcome.fds_before,
            {"npud_fds": outcome.peak_fds, "quiet_fds": outcome.fds_before},
        ),
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.attacks",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    every = [*ORDER, *LOCAL]
    parser.add_argument(
        "--only",
        action="append",
        default=[],
        metavar="SCENARIO",
        help=f"run only these (repeat or comma-separate): {', '.join(every)}",
    )
    parser.add_argument(
        "--crafted-16mib",
        action="store_true",
        help="also crafted_onnx_16mib (the review's largest file)",
    )
    parser.add_argument(
        "--seconds", type=float, default=None, help="each window's length (default 10; --quick 3)"
    )
    parser.add_argument("--quick", action="store_true", help="3 s windows: a smoke run")
    args = parser.parse_args(argv)
    names = [n for item in args.only for n in item.split(",") if n] or [*SCENARIOS, *LOCAL]
    if args.crafted_16mib:
        names.append("crafted_onnx_16mib")
    unknown = [n for n in names if n not in every]
    if unknown:
        parser.error(f"unknown scenario {', '.join(unknown)}; choose from {', '.join(every)}")
    with tempfile.TemporaryDirectory(prefix="npud-attacks-") as tmp:
        found = run(Context(quick=args.quick, workdir=Path(tmp)), names, args.seconds)
    print(format_table(found, quick=args.quick))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
