"""The attacks bench's bookkeeping (bench/attacks.py): what runs in which order, as which
user, and how its fds row judges what is not the attacker's own; and, as root, that a
scenario whose attacker npud refuses afterwards (as it rightly does a user it dropped
three times) leaves the next scenario's attacker free to connect. The whole bench:
``python -m bench.attacks``."""

from __future__ import annotations

import os
import tomllib
from pathlib import Path

import pytest

import npu_client
from bench import attacks
from bench.attacks_scenarios import TEST_URI, Scenario
from bench.harness import REPO_ROOT, Context, Row


def test_every_attack_runs_once_each_as_a_user_of_its_own() -> None:
    """npud refuses a user it dropped three times for a minute (fault_loop's and the
    stray_fds ones' attackers are), and throttles then refuses one whose calls hung:
    a scenario after such a one, run as the same user, could not connect."""
    assert sorted(attacks.ORDER) == sorted([*attacks.SCENARIOS, *attacks.OPTIONAL])
    assert "crafted_onnx_16mib" not in attacks.SCENARIOS  # only with --crafted-16mib
    uids = attacks.attacker_uids(attacks.ORDER)
    assert list(uids) == attacks.ORDER
    assert len(set(uids.values())) == len(attacks.ORDER)
    assert attacks.VICTIM not in uids.values()
    assert uids[attacks.ORDER[0]] == attacks.ATTACKER
    assert all(65519 < uid < attacks.VICTIM for uid in uids.values())  # no system user's


def test_the_config_allows_the_victim_and_every_attacker() -> None:
    uids = list(attacks.attacker_uids(attacks.ORDER).values())
    config = tomllib.loads(attacks._shipped_config(uids))
    assert config["access"]["allow_uids"] == [attacks.VICTIM, *uids]
    # the penalties stay as shipped: the bench measures npud as users get it
    shipped = tomllib.loads((REPO_ROOT / "config" / "npud.toml").read_text())
    for key in ("dropped_connections_before_refusal", "dropped_connection_penalty_s"):
        assert config["daemon"][key] == shipped["daemon"][key]


def test_more_scenarios_than_attacker_uids_or_one_named_twice_are_refused() -> None:
    names = [f"s{n}" for n in range(attacks.ATTACKER_UIDS + 1)]
    with pytest.raises(ValueError, match="the attackers' uids are 13"):
        attacks.attacker_uids(names)
    with pytest.raises(ValueError, match="named twice"):
        attacks.attacker_uids(["fault_loop", "stray_fds", "fault_loop"])


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


# --- as root: a refused attacker does not refuse the next scenario's ------------------------


def dropped_three_times(path: Path, seconds: float) -> dict[str, float]:
    """npu_test.fault until npud drops the connection (refused NOT_PERMITTED
    ``refused_requests_before_drop`` times), on three connections: the shipped
    ``dropped_connections_before_refusal``; then one more Hello, which npud refuses."""
    for _ in range(3):
        with npu_client.connect(str(path), name="dropped") as npu:
            handle = npu.open(TEST_URI)
            for _ in range(10_000):  # a bound, not a wait: 64 refusals drop it
                try:
                    handle.invoke(5)
                except npu_client.NotPermitted as exc:
                    if "refused_requests_before_drop" in exc.message:
                        break
                except npu_client.NpuConnectionError:
                    break
            else:
                raise AssertionError("npud never dropped the faulting connection")
    try:
        npu_client.connect(str(path), name="after").close()
    except npu_client.NotPermitted:
        return {"attacker_refused_after": 1.0}
    return {"attacker_refused_after": 0.0}


def connects(path: Path, seconds: float) -> dict[str, float]:
    with npu_client.connect(str(path), name="next"):
        return {"attacker_connected": 1.0}


@pytest.mark.skipif(os.geteuid() != 0, reason="the attack bench runs clients as other users")
def test_a_scenario_after_one_whose_user_npud_refuses_still_runs(tmp_path: Path) -> None:
    """The bench's failure under ``python -m bench``: fault_loop's attacker, dropped
    three times, was refused for a minute, and the next scenario's quiet window, run as
    the same user, could not connect ("a child of the attack bench ended without an
    answer"). npud's refusal stands (the first scenario sees it); the next scenario's
    attacker is another user."""
    scenarios: dict[str, Scenario] = {
        "dropped_three_times": dropped_three_times,
        "connects": connects,
    }
    found = attacks._through_npud(Context(quick=True, workdir=tmp_path), scenarios, 0.2)
    rows = {row.name: row for row in found}
    assert sorted(rows) == sorted(
        f"attacks.{name}.{what}" for name in scenarios for what in ("errors", "worst", "rss", "fds")
    )
    assert rows["attacks.dropped_three_times.errors"].figures["attacker_refused_after"] == 1
    assert rows["attacks.connects.errors"].figures["attacker_connected"] == 1
