"""What every benchmark module shares: rows, rounds, ratios with their spread, output.

A benchmark module measures something beside a baseline *in the same run*,
interleaved round by round (one round runs both, in alternating order), and
reports rows. A row's ratio is the median of the per-round ratios; its spread
is their interquartile range. Absolute figures go along as ``figures`` (the
medians behind the ratio, in the unit their name says); on a shared machine
they mean less than the ratio. See bench/README.md.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Literal, Protocol

REPO_ROOT = Path(__file__).resolve().parent.parent


@dataclasses.dataclass(frozen=True)
class Goal:
    """A target for the ratio (``figure="ratio"``) or for one of the figures."""

    figure: str
    limit: float
    direction: Literal["at_most", "at_least"] = "at_most"

    def met(self, row: Row) -> bool | None:
        value = row.ratio if self.figure == "ratio" else row.figures.get(self.figure)
        if value is None or math.isnan(value):
            return None
        return value <= self.limit if self.direction == "at_most" else value >= self.limit

    def __str__(self) -> str:
        sign = "<=" if self.direction == "at_most" else ">="
        return f"{self.figure} {sign} {self.limit:g}"


@dataclasses.dataclass(frozen=True)
class Row:
    """One line of the table: a ratio, its spread, and the figures behind it."""

    name: str
    what: str
    """What the ratio divides by what, e.g. "npud p50 / floor p50"."""
    ratio: float
    q1: float
    q3: float
    rounds: int
    figures: dict[str, float]
    goal: Goal | None = None

    @property
    def goal_met(self) -> bool | None:
        return self.goal.met(self) if self.goal is not None else None

    def as_json(self) -> dict[str, object]:
        return {
            "name": self.name,
            "what": self.what,
            "ratio": self.ratio,
            "iqr": [self.q1, self.q3],
            "rounds": self.rounds,
            "figures": self.figures,
            "goal": None if self.goal is None else str(self.goal),
            "goal_met": self.goal_met,
        }


def ratio_row(
    name: str,
    what: str,
    ratios: Sequence[float],
    figures: dict[str, float],
    goal: Goal | None = None,
) -> Row:
    """A row from per-round ratios: their median and interquartile range."""
    if not ratios:
        raise ValueError(f"{name}: no rounds were measured")
    q1, median, q3 = quartiles(ratios)
    return Row(name, what, median, q1, q3, len(ratios), figures, goal)


def quartiles(values: Sequence[float]) -> tuple[float, float, float]:
    """(first quartile, median, third quartile); one value is all three."""
    if len(values) == 1:
        return values[0], values[0], values[0]
    q1, median, q3 = statistics.quantiles(values, n=4, method="inclusive")
    return q1, median, q3


def median(values: Sequence[float]) -> float:
    return statistics.median(values)


def interleave(
    rounds: int, subject: Callable[[], float], baseline: Callable[[], float]
) -> tuple[list[float], list[float]]:
    """Run both ``rounds`` times, alternating which goes first; their results in round order."""
    subjects: list[float] = []
    baselines: list[float] = []
    for index in range(rounds):
        if index % 2:
            baselines.append(baseline())
            subjects.append(subject())
        else:
            subjects.append(subject())
            baselines.append(baseline())
    return subjects, baselines


@dataclasses.dataclass
class Context:
    """What a module is given: how long to run, where to put files, where to report progress."""

    quick: bool
    workdir: Path

    def rounds(self, full: int, quick: int) -> int:
        return quick if self.quick else full

    def progress(self, message: str) -> None:
        print(f"  {message}", file=sys.stderr, flush=True)


class UnavailableError(RuntimeError):
    """What a module needs is not installed or built here (an optional build, a package);
    the message says what and how to get it. ``python -m bench`` shows the module
    skipped, with the message, and goes on; a module named with ``--only`` fails."""


class Benchmark(Protocol):
    """A benchmark module: ``NAME``, ``SUMMARY`` and ``rows``."""

    NAME: str
    SUMMARY: str

    def rows(self, ctx: Context) -> list[Row]: ...


def counted(count: int, noun: str, plural: str | None = None) -> str:
    """``1 client process``, ``4 client processes``: the noun agrees with the count."""
    return f"{count} {noun if count == 1 else plural or noun + 's'}"


def format_table(rows: Sequence[Row], *, quick: bool = False) -> str:
    """The rows as an aligned text table. ``quick``: a smoke run's, whose few rounds
    are no figures, so no goal is judged met or not."""
    header = ("benchmark", "ratio", "IQR", "rounds", "goal", "what / figures")
    lines = [header]
    for row in rows:
        if row.goal is None:
            goal = ""
        elif quick:
            goal = f"{row.goal} (not judged: --quick)"
        else:
            goal = f"{row.goal} ({'met' if row.goal_met else 'NOT met'})"
        figures = ", ".join(f"{key} {_number(value)}" for key, value in row.figures.items())
        lines.append(
            (
                row.name,
                f"{row.ratio:.3g}",
                f"{row.q1:.3g}-{row.q3:.3g}",
                str(row.rounds),
                goal,
                f"{row.what}: {figures}",
            )
        )
    widths = [max(len(line[column]) for line in lines) for column in range(len(header) - 1)]
    return "\n".join(
        "  ".join(cell.ljust(width) for cell, width in zip(line, widths, strict=False))
        + "  "
        + line[-1]
        for line in lines
    )


def _number(value: float) -> str:
    return f"{value:.4g}"


def timestamp() -> str:
    return time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
