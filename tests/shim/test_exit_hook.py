"""A rank that dies of a CUDA fault outside the shim's loop still exits with its code (86: a
poisoned context, 87: out of GPU memory) and its reason (``goodput.shim.exit_hook``), through
the sitecustomize its launcher puts first on PYTHONPATH (``rank_env.with_rank_boot``).

Real interpreters run tests/shim/cuda_exit_script.py; its CUDA context is the named fake of
tests/shim/fake_cuda.py (no GPU here), which raises what torch 2.13 raises."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from goodput.launch.rank_env import EXIT_CODES, RANK_BOOT_DIR, VARIABLES, with_rank_boot

SCRIPT = Path(__file__).with_name("cuda_exit_script.py")


def _run(scenario: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(SCRIPT), scenario],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def _launched(**extra: str) -> dict[str, str]:
    """The environment a launcher gives a rank: the job named, the boot directory first."""
    base = {k: v for k, v in os.environ.items() if k != VARIABLES["job"]}
    return with_rank_boot({**base, VARIABLES["job"]: "job-cuda", **extra})


def test_the_boot_directory_goes_first_once_and_keeps_the_jobs_path() -> None:
    env = with_rank_boot({"PYTHONPATH": f"/opt/job{os.pathsep}{RANK_BOOT_DIR}"})
    assert env["PYTHONPATH"].split(os.pathsep) == [str(RANK_BOOT_DIR), "/opt/job"]
    assert with_rank_boot({})["PYTHONPATH"] == str(RANK_BOOT_DIR)
    assert (RANK_BOOT_DIR / "sitecustomize.py").is_file()


@pytest.mark.parametrize(
    ("scenario", "fault", "words"),
    [
        ("import-assert", "cuda-context", "device-side assert triggered"),
        ("wrapped", "cuda-context", "an illegal memory access was encountered"),
        ("loop-oom", "cuda-oom", "out of GPU memory: CUDA out of memory"),
    ],
)
def test_a_cuda_fault_outside_the_loop_exits_with_its_code_and_reason(
    scenario: str, fault: str, words: str
) -> None:
    done = _run(scenario, _launched())
    assert done.returncode == EXIT_CODES[fault], done.stderr[-2000:]
    lines = done.stderr.strip().splitlines()
    # the traceback as Python prints it, then the reason as the log's last line
    assert "Traceback (most recent call last)" in done.stderr
    assert "leaving for a cold restart" in lines[-1] and words in lines[-1]
    assert done.stdout == f"scenario {scenario}\n"  # flushed, not lost to os._exit


def test_anything_else_keeps_pythons_exit() -> None:
    plain = _run("plain", _launched())
    assert plain.returncode == 1 and "ValueError: a bug of the script's own" in plain.stderr
    assert "leaving for a cold restart" not in plain.stderr
    # a fault the script handles itself ends as the script says
    assert _run("caught-exit", _launched()).returncode == 3


def test_a_process_goodput_did_not_launch_is_not_hooked() -> None:
    env = _launched()
    del env[VARIABLES["job"]]
    done = _run("import-assert", env)
    assert done.returncode == 1 and "leaving for a cold restart" not in done.stderr


def test_the_sitecustomize_it_shadows_still_runs(tmp_path: Path) -> None:
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    marker = tmp_path / "ran"
    (theirs / "sitecustomize.py").write_text(f"open({str(marker)!r}, 'w').write('yes')\n")
    env = _launched()
    env["PYTHONPATH"] += os.pathsep + str(theirs)
    done = _run("import-assert", env)
    assert marker.read_text() == "yes"
    assert "Error in sitecustomize" not in done.stderr
    assert done.returncode == EXIT_CODES["cuda-context"], done.stderr[-2000:]


def test_a_linked_boot_directory_is_the_same_one_and_runs_once(tmp_path: Path) -> None:
    """The rank image links the boot directory to /opt/goodput/rank-boot while a node agent
    in it names the real one: both on the path, the hook runs, and only once."""
    link = tmp_path / "rank-boot"
    link.symlink_to(RANK_BOOT_DIR)
    env = _launched()
    env["PYTHONPATH"] = os.pathsep.join([str(link), env["PYTHONPATH"]])
    done = _run("import-assert", env)
    assert done.returncode == EXIT_CODES["cuda-context"], done.stderr[-2000:]
    assert done.stderr.count("leaving for a cold restart") == 1
    assert "Error in sitecustomize" not in done.stderr  # e.g. each visiting the other
