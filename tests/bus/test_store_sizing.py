"""The stores' sizing formula (goodput.bus.store_sizing): by hand, and against a real server."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from goodput import subjects
from goodput.bus import Bus
from goodput.bus.message_sizes import (
    PUBLISH_HEADERS,
    command_bytes,
    event_bytes,
    kv_bytes,
    sample_commands,
    sample_events,
)
from goodput.bus.store_sizing import (
    DEFAULT_SCALE,
    MIB,
    SCALE_ENV,
    StoreScale,
    StoreScaleError,
    events_rate,
    parse_scale,
    scale_from_env,
    scale_to_env,
    store_limits,
)
from goodput.tools.bench.store import measure

SMALL = StoreScale(
    nodes=2,
    ranks_per_node=4,
    step_s=2.0,
    checkpoint_s=100.0,
    host_report_s=4.0,
    restarts_per_hour=2.0,
    keep_h=10.0,
)


def test_the_publish_headers_are_counted_as_nats_py_writes_them() -> None:
    # "NATS/1.0\r\n" + "Nats-Msg-Id: <32>\r\n" + "traceparent: <55>\r\n" + "\r\n"
    assert PUBLISH_HEADERS == 10 + (13 + 32 + 2) + (13 + 55 + 2) + 2 == 129


def test_the_formula_by_hand() -> None:
    """A schema that grows changes these sizes: then update docs/BENCHMARKS.md's table too."""
    sizes = {kind: event_bytes(event) for kind, event in sample_events(SMALL.widths).items()}
    assert sizes == {
        "steps": 504,
        "host_health": 1066,
        "ckpt_saved": 321,
        "ckpt_persisted": 391,
        "ckpt_replicated": 371,
        "ckpt_backed_up": 438,
        "rank_exited": 338,
        "rank_started": 321,
        "ckpt_restored": 363,
        "training_plan": 406,
        "run_started": 428,
    }
    # 2 nodes / 2 s x 504 (a node's 4 ranks' steps rolled up in one event; a step's and
    # checkpoint's subject names its rank: 2 bytes more at rank 7, 6 at 16,383)
    # + 2 nodes / 4 s x 1,066
    # + (8 x (321 + 391) + 2 x (371 + 438)) / 100 s
    # + 2 restarts / 3600 s x (8 x (338 + 321 + 363 + 406) + 428)
    by_hand = 504 + 533 + 7314 / 100 + 2 * 11852 / 3600
    assert events_rate(SMALL) == pytest.approx(by_hand) == pytest.approx(1116.7244)
    limits = store_limits(SMALL)
    # 1116.72 B/s x 10 h x 3600 s x 1.25 = 50,252,600 B: 47.9 MiB, under the 64 MiB floor
    assert limits.streams["GP_EVENTS"] == 64 * MIB
    # 2 restarts/h x 10 h x 2 nodes x (15,932 + 493 + 4,407) B = 0.8 MB: the 64 MiB floor
    commands = {kind: command_bytes(*sent) for kind, sent in sample_commands(SMALL.widths).items()}
    assert commands == {"launch_ranks": 15932, "signal_ranks": 493, "keep_standbys": 4407}
    assert limits.streams["GP_CMDS"] == 64 * MIB
    assert limits.streams["GP_DLQ"] == 256 * MIB
    assert set(limits.buckets.values()) == {8 * MIB}  # every bucket at its floor
    # (64 + 64 + 256 + 6 x 8) MiB = 432 MiB x 1.10 = 475.2 MiB, rounded up to 476
    assert limits.server_bytes == 476 * MIB


def test_the_fleet_of_issue_36() -> None:
    """2,048 nodes x 8 ranks stepping every second: 3.33 MB/s, 288 GB a day (8.21 MB/s and
    710 GB with a StepDone per rank, before the rollup per node)."""
    big = StoreScale(nodes=2048, ranks_per_node=8)
    steps = event_bytes(sample_events(big.widths)["steps"])
    assert steps == 777  # 8 ranks' steps: a rank's own StepDone is 395 bytes
    # 2,048 x 777 + 1,024 x 1,673 + (16,384 x 730 + 2,048 x 821) / 600
    # + (16,384 x 1,454 + 430) / 3600
    by_hand = 2_048 * 777 + 1_024 * 1_673 + 13_641_728 / 600 + 23_822_766 / 3600
    assert events_rate(big) == pytest.approx(by_hand)
    limits = store_limits(big)
    assert limits.streams["GP_EVENTS"] >= by_hand * 24 * 3600  # a day at least
    assert limits.server_bytes >= sum(limits.streams.values()) + sum(limits.buckets.values())


async def test_every_size_is_what_a_real_server_accounts(tmp_path: Path) -> None:
    """`goodput bench store`'s measurement: the formula's bytes are the server's, to the byte."""
    result = await measure(SMALL, tmp_path)
    assert len(result["messages"]) == 14
    for kind, sizes in result["messages"].items():
        assert sizes["server"] == sizes["formula"], kind


def test_the_scale_travels_in_the_environment() -> None:
    assert scale_from_env({}) is None
    assert scale_from_env(scale_to_env(SMALL)) == SMALL
    assert parse_scale("nodes=64, keep_h=6") == StoreScale(nodes=64, keep_h=6.0)


@pytest.mark.parametrize(
    ("text", "names"),
    [
        ("nodes=0", "nodes"),
        ("nodez=4", "nodez"),
        ("nodes", "KEY=VALUE"),
        ("keep_h=-1", "keep_h"),
        ("step_s=nan", "step_s"),
        ("ranks_per_node=eight", "ranks_per_node"),
    ],
)
def test_a_bad_scale_is_one_line_naming_the_field(text: str, names: str) -> None:
    with pytest.raises(StoreScaleError, match=names) as caught:
        scale_from_env({SCALE_ENV: text})
    assert "\n" not in str(caught.value)


def test_the_kubernetes_nats_store_holds_the_default_scale() -> None:
    """deploy/k8s/base/nats/nats.conf's max_file_store is what `goodput bench store` prints for
    the default scale (services there are told none), and its volume is larger."""
    root = Path(__file__).resolve().parents[2] / "deploy" / "k8s" / "base"
    conf = (root / "nats" / "nats.conf").read_text()
    [mib] = re.findall(r"^\s*max_file_store:\s*(\d+)M\s*$", conf, re.MULTILINE)
    assert int(mib) * MIB == store_limits(DEFAULT_SCALE).server_bytes
    [gib] = re.findall(r"storage:\s*(\d+)Gi", (root / "nats.yaml").read_text())
    assert int(gib) * 1024 * MIB > int(mib) * MIB


async def test_a_kv_record_is_what_the_server_accounts(bus: Bus) -> None:
    stream = f"KV_{subjects.DONE_BUCKET}"
    key = subjects.kv_key("job", "agent-node-7", "c" * 32)
    before = (await bus.js.stream_info(stream)).state.bytes
    await (await bus.kv(subjects.DONE_BUCKET)).put(key, b"v" * 300)
    after = (await bus.js.stream_info(stream)).state.bytes
    assert after - before == kv_bytes(subjects.DONE_BUCKET, key, b"v" * 300)
