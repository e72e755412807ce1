"""The rank environment: what the actuator writes is what the shim reads, knobs stay unset
unless set, and a malformed variable is named."""

from __future__ import annotations

import pytest

from goodput import schemas
from goodput.launch.rank_env import (
    NCCL_ERROR_HANDLING,
    VARIABLES,
    RankEnv,
    RankEnvError,
    format_step_windows,
    knobs,
    nccl_error_handling,
)
from goodput.launch.standby_channel import decode_assignment, encode_assignment
from goodput.shim.trainer import ShimConfig, TrainerShim


def test_what_is_written_reads_back() -> None:
    written = RankEnv(
        rank=3,
        local_rank=1,
        group_rank=1,
        world_size=4,
        local_world_size=2,
        master_addr="10.0.0.1",
        master_port=29511,
        restart_count=2,
        job="j1",
        node="node-1",
        attempt=3,
        num_dp_replicas=2,
        num_nodes_per_dp=1,
        traceparent="00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
        ckpt_dir="/ckpt",
        ckpt_every=20,
        ckpt_mode="torch-save",
        heartbeat_period_s=0.25,
        enable_fault_injection=True,
        device=5,
        numerics_every=5,
        fingerprint_every=20,
        skip_steps="41-45,90-90",
        launched_ns=1_764_000_000_000_000_000,
    )
    env = written.to_env()
    assert env["RANK"] == "3" and env["GOODPUT_JOB"] == "j1" and env["GOODPUT_DEVICE"] == "5"
    assert env["GOODPUT_ENABLE_FAULT_INJECTION"] == "1"
    assert RankEnv.from_env(env) == written


def test_unset_knobs_are_not_written_and_readers_keep_their_defaults(monkeypatch) -> None:
    env = RankEnv(rank=1, world_size=2, job="j2").to_env()
    assert "GOODPUT_CKPT_EVERY" not in env and "GOODPUT_CKPT_MODE" not in env
    for variable in VARIABLES.values():
        monkeypatch.delenv(variable, raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    config = ShimConfig.from_env()
    assert (config.job, config.rank, config.world_size) == ("j2", 1, 2)
    assert (config.ckpt_every, config.ckpt_mode) == (ShimConfig().ckpt_every, "async")


def test_knobs_write_only_what_is_given() -> None:
    assert knobs(ckpt_every=10, enable_fault_injection=True) == {
        "GOODPUT_CKPT_EVERY": "10",
        "GOODPUT_ENABLE_FAULT_INJECTION": "1",
    }
    with pytest.raises(RankEnvError, match="ckpt_evry"):
        knobs(ckpt_evry=10)


def test_a_malformed_variable_is_named() -> None:
    with pytest.raises(RankEnvError, match="GOODPUT_CKPT_EVERY='often'"):
        RankEnv.from_env({"GOODPUT_CKPT_EVERY": "often"})
    with pytest.raises(RankEnvError, match="GOODPUT_CKPT_MODE"):
        RankEnv.from_env({"GOODPUT_CKPT_MODE": "pickle"})
    with pytest.raises(RankEnvError, match="GOODPUT_FINGERPRINT_EVERY='0'"):
        RankEnv.from_env({"GOODPUT_FINGERPRINT_EVERY": "0"})


@pytest.mark.parametrize("bad", ["45-41", "0-3", "41", "41-45,", "a-b", "41-45;90-95"])
def test_a_skipped_window_that_does_not_parse_is_named(bad: str) -> None:
    with pytest.raises(RankEnvError, match=f"GOODPUT_SKIP_STEPS={bad!r}"):
        RankEnv.from_env({"GOODPUT_SKIP_STEPS": bad})


def test_the_skipped_windows_reach_the_shim(monkeypatch) -> None:
    for variable in VARIABLES.values():
        monkeypatch.delenv(variable, raising=False)
    windows = (schemas.StepWindow(41, 45), schemas.StepWindow(90, 90))
    monkeypatch.setenv(VARIABLES["skip_steps"], format_step_windows(windows))
    config = ShimConfig.from_env()
    assert config.skip_steps == windows
    shim = TrainerShim(config, install_signal_handlers=False)
    assert [s for s in range(100) if shim.skips_data(s)] == [41, 42, 43, 44, 45, 90]


def test_the_numerics_periods_reach_the_shim_and_must_nest(monkeypatch) -> None:
    for variable in VARIABLES.values():
        monkeypatch.delenv(variable, raising=False)
    for key, value in knobs(numerics_every=5, fingerprint_every=20).items():
        monkeypatch.setenv(key, value)
    config = ShimConfig.from_env()
    assert (config.numerics_every, config.fingerprint_every) == (5, 20)
    monkeypatch.setenv(VARIABLES["fingerprint_every"], "12")
    with pytest.raises(RankEnvError, match="GOODPUT_FINGERPRINT_EVERY=12 is not a multiple"):
        ShimConfig.from_env()


def test_a_standby_assignment_is_a_rank_env_and_a_standby_cannot_train_as_a_rank(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assignment = RankEnv(rank=1, world_size=2, master_addr="127.0.0.1", master_port=1, node="n1")
    line = encode_assignment(assignment)
    assert line.endswith(b"\n") and decode_assignment(line) == assignment
    with pytest.raises(RankEnvError, match="not a standby assignment"):
        decode_assignment(b'{"rank": "one"}\n')
    assert RankEnv.from_env({VARIABLES["standby"]: "1"}).standby is True
    monkeypatch.setenv(VARIABLES["standby"], "1")
    with pytest.raises(RankEnvError, match=r"goodput\.shim\.run_job"):
        ShimConfig.from_env()


def test_nccl_error_handling_fills_only_what_the_environment_leaves_unset() -> None:
    assert nccl_error_handling({}) == NCCL_ERROR_HANDLING
    # torch's default (3) kills a rank whose peer died, and with 2 the watchdog aborts too:
    # torch 2.13 documents _abort_process_group (goodput's abort) with the watchdog's off
    assert NCCL_ERROR_HANDLING["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "0"
    assert nccl_error_handling({"TORCH_NCCL_ASYNC_ERROR_HANDLING": "1"}) == {}
