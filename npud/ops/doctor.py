"""``npud doctor``: check the NPU installation and explain each problem with its fix.

One line per check (``OK``, ``WARN``, ``FAIL``, ``SKIP``), then a summary; the
exit status is 0 when nothing FAILs and 1 otherwise. The checks themselves
live in :mod:`npud.ops.doctor_checks`; this module loads the configuration, runs
them in order, decides what the report says at the top, and prints it.
docs/doctor.md describes every check.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import sys
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Final, NoReturn

from npu_client import SOCKET_ENV
from npu_protocol import DaemonStatus
from npud.ops import cli
from npud.ops.config import DEFAULT_CONFIG, Config, ConfigError, load_config
from npud.ops.doctor_checks import (
    DEFAULT_QAIRT_ROOT,
    Accounts,
    Finding,
    Status,
    Target,
    check_daemon,
    check_device_nodes,
    check_dsp_libraries,
    check_firmware,
    check_qairt,
    check_remoteproc_state,
    check_runtime_pm,
    check_shell,
    check_signing_key,
    check_unsigned_pd,
    npu_present,
)

PROG: Final = "npud doctor"
QAIRT_ENV: Final = "QAIRT_ROOT"

DESCRIPTION: Final = """\
Check that the NPU can be used through npud, and explain what is wrong: the
FastRPC device nodes, the CDSP remoteproc (state, firmware version, runtime
PM), the signed DSP shell and its key, the QAIRT and DSP libraries, and the
daemon itself. One line per check, with the fix for each problem.

On a machine without an NPU it says so at the top: npud then runs on its
emulator, and the device checks are skipped.
"""

EPILOG: Final = f"""\
paths: every file is looked up under --root: the device nodes and paths of the
configuration (shell, key, DSP library path, daemon.socket) and ${QAIRT_ENV}
(default {DEFAULT_QAIRT_ROOT}). --config, --socket and ${SOCKET_ENV} are used as
given. Under a --root other than / any file stands for a device node.

exit status: 0 when no check FAILs (WARN and SKIP allowed), 1 when one does, 64
for a bad command line, 141 when stdout is closed early (npud doctor | head -1). A
machine without an NPU is not a failure: npud runs there on its emulator, and the
report says so (a stopped daemon is then a WARN).
"""


@dataclass(frozen=True)
class Report:
    """What doctor found, in the order it looked."""

    findings: tuple[Finding, ...]
    npu_present: bool
    headline: str
    """One sentence for the top of the report; empty when the machine has an NPU."""
    uses: str
    """The backend npud runs on, or will run on when started: ``kernel`` or ``emulator``;
    ``none`` when it will refuse to start (``backend.kind = "kernel"`` without an NPU)."""

    @property
    def failed(self) -> bool:
        return any(finding.status is Status.FAIL for finding in self.findings)

    @property
    def exit_status(self) -> int:
        return 1 if self.failed else 0

    def counts(self) -> dict[str, int]:
        tally = Counter(finding.status for finding in self.findings)
        return {status.value: tally[status] for status in Status}

    @property
    def verdict(self) -> str:
        """The report in one sentence: the summary line's conclusion."""
        counts = self.counts()
        if not self.npu_present:
            if counts[Status.FAIL]:
                return self.headline + " Fix the FAIL lines."
            if counts[Status.WARN]:
                return self.headline + " Read the WARN lines; the device checks are skipped."
            return self.headline + " The device checks are skipped."
        if counts[Status.FAIL]:
            return "the NPU is not usable until the FAIL lines are fixed."
        if counts[Status.WARN]:
            return "the NPU is usable; read the WARN lines."
        return "the NPU is ready."

    def summary(self) -> str:
        tally = ", ".join(f"{count} {status}" for status, count in self.counts().items())
        return f"summary: {tally}: {self.verdict}"


def diagnose(
    root: Path,
    *,
    config_path: Path | None = None,
    socket: str | None = None,
    environ: Mapping[str, str] | None = None,
    timeout: float = 5.0,
) -> Report:
    """Run every check against the installation under ``root``.

    ``config_path`` defaults to ``<root>/etc/npud/npud.toml`` (defaults if it
    does not exist); ``socket`` to ``$NPUD_SOCKET``, else ``daemon.socket``
    under ``root``. ``environ`` supplies those variables and ``$QAIRT_ROOT``
    (default: the process environment). ``timeout`` bounds the daemon check.
    """
    env = os.environ if environ is None else environ
    config, config_finding = _load_config(root, config_path)
    socket_path = socket or env.get(SOCKET_ENV) or str(root / config.daemon.socket.lstrip("/"))
    target = Target(
        root=root,
        config=config,
        socket=socket_path,
        qairt_root=env.get(QAIRT_ENV) or DEFAULT_QAIRT_ROOT,
    )
    present = npu_present(target)
    findings = [_judge_backend_choice(config_finding, config, present)]
    findings += check_device_nodes(target, Accounts.of(target))
    if present:
        findings += check_remoteproc_state(target)
        findings += check_firmware(target)
        findings += check_runtime_pm(target)
        key_finding, key_usable = check_signing_key(target)
        findings += [
            key_finding,
            check_shell(target, key_usable),
            check_qairt(target),
            check_dsp_libraries(target),
        ]
    else:
        why = "no NPU on this machine"
        findings += [
            Finding(check, Status.SKIP, why)
            for check in (
                "CDSP remoteproc",
                "CDSP firmware",
                "CDSP runtime PM",
                "shell signing key",
                "DSP shell",
                "QAIRT runtime",
                "DSP libraries",
            )
        ]
    daemon_finding, status = check_daemon(target, timeout=timeout)
    if not present and daemon_finding.status is Status.FAIL and status is None:
        # Without an NPU a stopped daemon is news, not a fault of the machine.
        daemon_finding = replace(daemon_finding, status=Status.WARN)
    findings.append(daemon_finding)
    # About the device's firmware: on a machine without an NPU it would judge the emulator.
    unsigned = check_unsigned_pd(status) if status is not None and present else None
    if unsigned is not None:
        findings.append(unsigned)
    headline = "" if present else _no_npu_headline(config, status)
    return Report(
        findings=tuple(findings),
        npu_present=present,
        headline=headline,
        uses=_backend_used(config, present, status),
    )


def _load_config(root: Path, given: Path | None) -> tuple[Config, Finding]:
    path = given if given is not None else root / DEFAULT_CONFIG.lstrip("/")
    if given is None and not path.exists():
        config = Config()
        return config, Finding("config", Status.OK, f"no {path}: the defaults apply")
    renamed: list[str] = []
    try:
        config = load_config(path, warn=renamed.append)
    except ConfigError as exc:
        return Config(), Finding(
            "config",
            Status.FAIL,
            f"{exc}; the checks below use the defaults",
            "fix the key named above (config/npud.toml lists every key with its default)",
        )
    if renamed:
        return config, Finding(
            "config", Status.WARN, "; ".join(renamed), "give the keys named above their new names"
        )
    return config, Finding("config", Status.OK, f"{path}")


def _judge_backend_choice(found: Finding, config: Config, present: bool) -> Finding:
    """The config line, with what ``backend.kind`` means on this machine."""
    kind = config.backend.kind
    if found.status is not Status.OK:
        return found
    detail = f"{found.detail}; backend {kind}"
    if present and kind == "emulator":
        return Finding(
            "config",
            Status.WARN,
            detail + ": npud does not use this machine's NPU",
            'set [backend] kind = "auto" or "kernel" and restart npud',
        )
    if not present and kind == "kernel":
        return Finding(
            "config",
            Status.FAIL,
            detail + ": there is no NPU, so npud refuses to start",
            'set [backend] kind = "auto" to run on the emulator',
        )
    return Finding("config", Status.OK, detail)


def _backend_used(config: Config, present: bool, status: DaemonStatus | None) -> str:
    if status is not None:
        return status.backend
    kind = config.backend.kind
    if kind == "auto":
        return "kernel" if present else "emulator"
    if kind == "kernel" and not present:
        return "none"
    return kind


def _no_npu_headline(config: Config, status: DaemonStatus | None) -> str:
    if status is not None:
        return f"No NPU on this machine: npud is running on the {status.backend}."
    kind = config.backend.kind
    if kind == "kernel":
        return (
            "No NPU on this machine, and backend.kind = kernel: npud will not start "
            "(backend auto would use the emulator)."
        )
    return f"No NPU on this machine: npud will use the emulator (backend {kind})."


# --- Output -----------------------------------------------------------------------------


def format_finding(finding: Finding) -> str:
    line = f"{finding.status.value:<4} {finding.check}: {finding.detail}"
    if finding.fix and finding.status in (Status.WARN, Status.FAIL):
        line += f" — fix: {finding.fix}"
    return line


def format_report(report: Report) -> str:
    lines = [report.headline] if report.headline else []
    lines += [format_finding(finding) for finding in report.findings]
    lines.append(report.summary())
    return "\n".join(lines) + "\n"


def report_json(report: Report) -> str:
    """The report as one JSON object: the verdict and summary, then each check.

    ``{"verdict", "npu_present", "uses", "exit_status", "summary": {"OK": n, ...},
    "checks": [{"check", "status", "detail", "fix"}, ...]}``; ``fix`` is null if none.
    """
    document = {
        "verdict": report.verdict,
        "npu_present": report.npu_present,
        "uses": report.uses,
        "exit_status": report.exit_status,
        "summary": report.counts(),
        "checks": [
            {
                "check": finding.check,
                "status": finding.status.value,
                "detail": finding.detail,
                "fix": finding.fix or None,
            }
            for finding in report.findings
        ],
    }
    return json.dumps(document, indent=2, ensure_ascii=False) + "\n"


# --- Command line -----------------------------------------------------------------------


class _Parser(argparse.ArgumentParser):
    """Usage errors as one line on stderr, exit status 64 (EX_USAGE)."""

    def error(self, message: str) -> NoReturn:
        self.exit(cli.EX_USAGE, f"{self.prog}: error: {message} (see --help)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog=PROG,
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--root",
        type=Path,
        default=Path("/"),
        metavar="DIR",
        help="the installation to check (default: /, the running system)",
    )
    parser.add_argument(
        "--config",
        type=Path,
        default=None,
        metavar="PATH",
        help=f"npud's configuration (default: ROOT{DEFAULT_CONFIG} if it exists, else defaults)",
    )
    parser.add_argument(
        "--socket",
        default=None,
        metavar="PATH",
        help=f"npud's socket (default: ${SOCKET_ENV}, else daemon.socket of the config)",
    )
    parser.add_argument(
        "--json",
        action="store_true",
        help="print the report as one JSON object: verdict, summary and the checks",
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the doctor with ``argv``; returns the exit status (the epilog)."""
    return cli.run(lambda: _main(argv))


def _main(argv: Sequence[str] | None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help (0) or a usage error (64), already printed
        return cli.parse_status(exc)
    root: Path = args.root
    if not root.is_dir():
        print(f"{PROG}: error: --root {root} is not a directory", file=sys.stderr)
        return cli.EX_USAGE
    report = diagnose(root.resolve(), config_path=args.config, socket=args.socket)
    # A fix line carries "—"; a non-UTF-8 terminal gets a "?" rather than a traceback.
    if isinstance(sys.stdout, io.TextIOWrapper):
        sys.stdout.reconfigure(errors="replace")
    sys.stdout.write(report_json(report) if args.json else format_report(report))
    sys.stdout.flush()
    return report.exit_status
