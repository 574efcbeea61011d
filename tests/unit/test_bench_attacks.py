"""The attacks bench's bookkeeping (bench/attacks.py): what runs in which order, and
how its fds row judges what is not the attacker's own. The attacks themselves need
root and two users: ``python -m bench.attacks``."""

from __future__ import annotations

import pytest

from bench import attacks
from bench.harness import Row


def test_every_attack_runs_once_and_hung_calls_last() -> None:
    """hung_calls gets the attacker's user refused for a minute: anything after it would
    fail to connect."""
    assert sorted(attacks.ORDER) == sorted([*attacks.SCENARIOS, *attacks.OPTIONAL])
    assert attacks.ORDER[-1] == "hung_calls"
    assert "crafted_onnx_16mib" not in attacks.SCENARIOS  # only with --crafted-16mib


def _rows(figures: dict[str, float]) -> dict[str, Row]:
    runs = [[1.0 + n * 0.032, 0.004, True] for n in range(40)]
    runs.append([1.5, 0.2, False])  # one failed, slow run during the attack
    found = attacks._scenario_rows("isolate_hog", runs, 0.0, 1.0, 3.0, figures)
    return {row.name.rsplit(".", 1)[1]: row for row in found}


FIGURES = {
    "attacker_processes": 4.0,
    "victim_isolate_refused": 0.0,
    "npud_rss_mib": 55.0,
    "quiet_rss_mib": 50.0,
    "npud_fds": 73.0,
    "quiet_fds": 42.0,
    "npud_fds_left": 0.0,
}


def test_the_attackers_own_fds_are_taken_off_npuds_and_shown_apart() -> None:
    rows = _rows({**FIGURES, "attacker_own_fds": 32.0})
    assert rows["fds"].ratio == pytest.approx((73 - 32) / 42)
    assert rows["fds"].figures["attacker_own_fds"] == 32
    assert "attacker_own_fds" not in rows["errors"].figures  # not the attack's result
    assert rows["errors"].ratio == 1
    assert rows["errors"].figures["attacker_processes"] == 4
    assert rows["worst"].ratio == pytest.approx(200)
    assert rows["rss"].ratio == pytest.approx(1.1)


def test_without_own_fds_the_whole_peak_counts() -> None:
    rows = _rows(dict(FIGURES))
    assert rows["fds"].ratio == pytest.approx(73 / 42)
    assert "attacker_own_fds" not in rows["fds"].figures


def test_an_unknown_scenario_is_refused_naming_the_choices(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as exit_:
        attacks.main(["--only", "nosuch"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "unknown scenario nosuch" in err
    assert "zero_stride" in err


def test_a_bound_shows_beside_the_fds_it_excuses() -> None:
    rows = _rows({**FIGURES, "attacker_own_fds": 31.0, "attacker_fds_bound": 68.0})
    assert rows["fds"].ratio == pytest.approx(1.0)
    assert rows["fds"].figures["attacker_fds_bound"] == 68
    assert "attacker_fds_bound" not in rows["errors"].figures
