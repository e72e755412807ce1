"""Scenario files: validation of every kind of bad file, Poisson plans, a real run."""

from __future__ import annotations

import json
import signal
import statistics
from pathlib import Path

import pytest

from goodput.tools.chaos import ScenarioError, parse_scenario, plan
from goodput.tools.chaos import spec as faults
from goodput.tools.chaos.scenario import load_scenario
from tests.chaos.conftest import VictimJob
from tests.conftest import goodput_cli, refused_in_one_line

GOOD = """
duration_s = 120
seed = 7
time_compression = 1440

[[faults]]
kind = "kill-rank"
at_s = 10
rank = 1

[[faults]]
kind = "fail-node"
rate_per_day = 5
clear_after_s = 20

[[faults]]
kind = "slow-rank"
at_s = 30
factor = 1.5
duration_s = 60

[[faults]]
kind = "host-fault"
fault = "thermal"
node = "node-1"
at_s = 0
"""


def test_a_good_scenario_parses_into_fault_structs():
    scenario = parse_scenario(GOOD)
    assert scenario.seed == 7 and scenario.time_compression == 1440
    kinds = [type(f) for f in scenario.faults]
    assert kinds == [faults.KillRank, faults.FailNode, faults.SlowRank, faults.HostFault]
    assert scenario.faults[0].rank == 1 and scenario.faults[2].factor == 1.5
    assert scenario.faults[1].node is None, "no node: a random one when it fires"


BAD_FILES = {
    "not toml": ("duration_s = = 3", "not valid TOML"),
    "unknown fault": (
        'duration_s = 5\n[[faults]]\nkind = "meteor"\nat_s = 1',
        "unknown fault 'meteor'",
    ),
    "no kind": ("duration_s = 5\n[[faults]]\nat_s = 1", "faults[0] has no kind"),
    "missing duration": ('[[faults]]\nkind = "kill-rank"\nat_s = 1', "duration_s"),
    "no faults": ("duration_s = 5", "faults"),
    "empty faults": ("duration_s = 5\nfaults = []", "length"),
    "missing fault field": (
        'duration_s = 5\n[[faults]]\nkind = "kill-service"\nat_s = 1',
        "service",
    ),
    "negative at_s": ('duration_s = 5\n[[faults]]\nkind = "kill-rank"\nat_s = -1', "at_s"),
    "negative duration": (
        'duration_s = -5\n[[faults]]\nkind = "kill-rank"\nat_s = 1',
        "duration_s",
    ),
    "negative rate": ('duration_s = 5\n[[faults]]\nkind = "kill-rank"\nrate_per_day = -2', "rate"),
    "neither time": ('duration_s = 5\n[[faults]]\nkind = "kill-rank"', "exactly one of"),
    "both times": (
        'duration_s = 5\n[[faults]]\nkind = "kill-rank"\nat_s = 1\nrate_per_day = 3',
        "exactly one of",
    ),
    "after the end": ('duration_s = 5\n[[faults]]\nkind = "kill-rank"\nat_s = 9', "after the end"),
    "unknown field": (
        'duration_s = 5\n[[faults]]\nkind = "kill-rank"\nat_s = 1\nrnak = 2',
        "rnak",
    ),
    "wrong type": ('duration_s = 5\n[[faults]]\nkind = "kill-rank"\nat_s = 1\nrank = "one"', "int"),
    "factor not above 1": (
        'duration_s = 5\n[[faults]]\nkind = "slow-rank"\nat_s = 1\nfactor = 0.5',
        "factor",
    ),
    "clear on an unclearable fault": (
        'duration_s = 5\n[[faults]]\nkind = "kill-rank"\nat_s = 1\nclear_after_s = 2',
        "clear_after_s only applies",
    ),
}


@pytest.mark.parametrize("name", BAD_FILES)
def test_every_kind_of_bad_file_is_refused_with_the_reason(name: str):
    text, reason = BAD_FILES[name]
    with pytest.raises(ScenarioError) as caught:
        parse_scenario(text, "bad.toml")
    assert reason in str(caught.value) and "bad.toml" in str(caught.value)


POISSON = """
duration_s = 600
seed = {seed}
time_compression = 1440
[[faults]]
kind = "kill-rank"
rate_per_day = 5
[[faults]]
kind = "gpu-xid"
rate_per_day = 2
"""


def times(seed: int) -> list[tuple[float, str]]:
    return [(p.at_s, p.fault.kind) for p in plan(parse_scenario(POISSON.format(seed=seed)))]


def test_poisson_plan_is_deterministic_for_a_seed():
    assert times(11) == times(11)
    assert times(11) != times(12)
    planned = times(11)
    assert planned == sorted(planned) and all(0 <= t < 600 for t, _ in planned)


def test_poisson_rate_follows_the_compressed_day():
    # 5/day at 1440× over 600 s: 5 × 1440 × 600 / 86400 = 50 expected kill-rank faults
    counts = [sum(kind == "kill-rank" for _, kind in times(seed)) for seed in range(40)]
    assert 40 <= statistics.mean(counts) <= 60


def test_editing_one_entry_does_not_move_the_others():
    base = parse_scenario(POISSON.format(seed=3))
    more = parse_scenario(POISSON.format(seed=3).replace("rate_per_day = 2", "rate_per_day = 9"))
    kills = [[p.at_s for p in plan(s) if p.fault.kind == "kill-rank"] for s in (base, more)]
    assert kills[0] == kills[1]


async def test_a_bad_scenario_fails_before_anything_fires(victim_job: VictimJob, tmp_path: Path):
    path = tmp_path / "bad.toml"
    path.write_text(
        'duration_s = 5\n[[faults]]\nkind = "kill-rank"\nat_s = 0\nrank = 0\n'
        '[[faults]]\nkind = "kill-rank"\nat_s = -3\n'
    )
    result = await victim_job.cli("run", str(path))
    assert result.returncode == 2
    assert "bad.toml" in result.stderr and "at_s" in result.stderr
    assert all(p.poll() is None for p in victim_job.ranks.values()), "nothing fired"


async def test_a_scenario_runs_its_faults_on_time_and_goes_on_after_a_failure(
    victim_job: VictimJob, tmp_path: Path
):
    path = tmp_path / "scenario.toml"
    path.write_text(
        "duration_s = 2\nseed = 1\n"
        '[[faults]]\nkind = "kill-rank"\nat_s = 0.2\nrank = 3\n'
        '[[faults]]\nkind = "kill-rank"\nat_s = 0.4\nrank = 9\n'
        '[[faults]]\nkind = "hang-rank"\nat_s = 0.6\nrank = 1\nclear_after_s = 0.5\n'
    )
    result = await victim_job.cli("run", str(path), "--json")
    assert result.returncode == 1, "one fault failed"
    fired = [json.loads(line) for line in result.stdout.splitlines()]
    assert [(f["fault"], f["ok"], f["clear"]) for f in fired] == [
        ("kill-rank", True, False),
        ("kill-rank", False, False),
        ("hang-rank", True, False),
        ("hang-rank", True, True),
    ]
    assert [f["planned_s"] for f in fired] == [0.2, 0.4, 0.6, 1.1]
    assert all(f["t_s"] >= f["planned_s"] for f in fired)
    assert "4 fault(s) fired, 1 failed" in result.stderr
    assert victim_job.ranks[3].wait(10) == -signal.SIGKILL


@pytest.mark.slow  # the `goodput` CLI starts slowly (other subcommands import torch)
async def test_dry_run_prints_the_plan(victim_job: VictimJob, tmp_path: Path):
    path = tmp_path / "scenario.toml"
    path.write_text(POISSON.format(seed=5))
    result = await victim_job.cli("run", str(path), "--dry-run", "--json")
    assert result.returncode == 0, result.stderr
    planned = [json.loads(line) for line in result.stdout.splitlines()]
    assert [(p["planned_s"], p["fault"]) for p in planned] == times(5)


def test_the_documented_example_is_a_valid_scenario():
    from goodput.tools.chaos import scenario as scenario_module

    doc = scenario_module.__doc__ or ""
    example = doc.split("```toml")[1].split("```")[0]
    parsed = parse_scenario(example, "docstring")
    assert [f.kind for f in parsed.faults] == ["kill-rank", "fail-node"]


#: files that once gave a traceback or a hang; each must fail with one line naming file and field
REFUSED_BY_THE_CLI = {
    "kind is a list": (b'duration_s = 5\n[[faults]]\nkind = ["kill-rank"]\nat_s = 1', "kind"),
    "not UTF-8": (b'duration_s = 5\n[[faults]]\nkind = "kill-rank"\nat_s = 1 # \xff\xfe', "UTF-8"),
    "infinite rate": (
        b'duration_s = 5\n[[faults]]\nkind = "kill-rank"\nrate_per_day = inf',
        "rate_per_day",
    ),
    "enormous rate": (
        b'duration_s = 5\n[[faults]]\nkind = "kill-rank"\nrate_per_day = 1e15',
        "rate_per_day",
    ),
    "infinite Poisson duration": (
        b'duration_s = inf\n[[faults]]\nkind = "kill-rank"\nrate_per_day = 5',
        "duration_s",
    ),
    "too many planned": (
        b'duration_s = 86400\ntime_compression = 1e6\n[[faults]]\nkind = "kill-rank"\n'
        b"rate_per_day = 5",
        "at most",
    ),
    "nan at_s": (b'duration_s = 5\n[[faults]]\nkind = "kill-rank"\nat_s = nan', "at_s"),
    "too many faults": (
        b"duration_s = 5\n" + b'[[faults]]\nkind = "kill-rank"\nat_s = 1\n' * 1001,
        "faults",
    ),
}


@pytest.mark.timeout(10)
@pytest.mark.parametrize("name", REFUSED_BY_THE_CLI)
def test_a_file_that_once_crashed_or_hung_is_refused(name: str, tmp_path: Path):
    content, field = REFUSED_BY_THE_CLI[name]
    path = tmp_path / "bad.toml"
    path.write_bytes(content)
    with pytest.raises(ScenarioError) as caught:
        plan(load_scenario(path))
    assert "bad.toml" in str(caught.value) and field in str(caught.value)


@pytest.mark.slow  # the `goodput` CLI starts slowly
@pytest.mark.timeout(150)
@pytest.mark.parametrize("name", REFUSED_BY_THE_CLI)
def test_the_cli_refuses_a_bad_scenario_in_one_line(name: str, tmp_path: Path):
    content, field = REFUSED_BY_THE_CLI[name]
    path = tmp_path / "bad.toml"
    path.write_bytes(content)
    result = goodput_cli(
        "chaos", "run", str(path), "--state-dir", str(tmp_path / "none"), timeout=110, check=False
    )
    refused_in_one_line(result, "bad.toml", field, code=2)
