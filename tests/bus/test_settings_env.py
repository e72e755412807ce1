"""Bus settings travel through GOODPUT_NATS_* variables: one reader, and its inverse."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from goodput.bus import BusCredentialsError, BusSettings
from goodput.bus.settings import ENV_VARS, settings_from_env, settings_to_env, stream_replicas
from goodput.config import add_bus_arguments, bus_settings_from_args
from tests.nats_auth import Operator

FULL = BusSettings(
    url="tls://nats-a:4222,tls://nats-b:4222",
    creds_file="/etc/goodput/nats/goodput.creds",
    nkey_seed_file="/etc/goodput/nats/seed.nk",
    user="svc",
    password="s3cret",
    token="t0ken",
    tls_ca_file="/etc/goodput/tls/ca.crt",
    tls_cert_file="/etc/goodput/nats/client.crt",
    tls_key_file="/etc/goodput/nats/client.key",
    insecure=True,
    replicas=3,
)


@pytest.mark.parametrize(
    "settings",
    [FULL, BusSettings(), BusSettings(url="nats://10.0.0.5:4222", user="svc", password="pw")],
)
def test_the_environment_of_a_settings_reads_back_as_the_same_settings(
    settings: BusSettings,
) -> None:
    env = settings_to_env(settings)
    assert set(env) <= set(ENV_VARS.values())
    assert all(env.values()), "nothing empty is written"
    assert settings_from_env(env) == settings


def test_every_setting_has_a_variable() -> None:
    assert set(ENV_VARS) == set(BusSettings.__struct_fields__)
    assert set(settings_to_env(FULL)) == set(ENV_VARS.values())


def test_empty_or_missing_variables_leave_the_base_alone() -> None:
    base = BusSettings(url="nats://bus:4222", creds_file="/a.creds", insecure=True)
    env = {"GOODPUT_NATS_URL": "", "GOODPUT_NATS_CREDS": "", "GOODPUT_INSECURE": "no"}
    assert settings_from_env(env, base) == base
    assert settings_from_env({"GOODPUT_NATS_USER": "u"}, base).user == "u"
    for truthy in ("1", "true", "YES"):
        assert settings_from_env({"GOODPUT_INSECURE": truthy}).insecure


def test_flags_override_the_environment_which_overrides_the_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    creds = tmp_path / "x.creds"
    creds.write_text(Operator.create().user_creds())
    parser = argparse.ArgumentParser()
    add_bus_arguments(parser)
    monkeypatch.setenv("GOODPUT_NATS_URL", "nats://from-env:4222")
    monkeypatch.setenv("GOODPUT_NATS_USER", "env-user")
    monkeypatch.setenv("GOODPUT_NATS_PASSWORD", "env-pw")
    monkeypatch.setenv("GOODPUT_NATS_TOKEN", "env-token")
    file = BusSettings(url="nats://from-file:4222", user="file-user", tls_ca_file=str(creds))
    settings = bus_settings_from_args(
        parser.parse_args(["--nats-user", "flag-user", "--nats-creds", str(creds)]), file
    )
    assert settings == BusSettings(
        url="nats://from-env:4222",
        creds_file=str(creds),
        user="flag-user",
        password="env-pw",
        token="env-token",
        tls_ca_file=str(creds),
    )
    assert bus_settings_from_args(parser.parse_args(["--insecure"])).insecure
    with pytest.raises(BusCredentialsError, match="creds file"):
        bus_settings_from_args(parser.parse_args(["--nats-creds", str(tmp_path / "absent")]))


@pytest.mark.parametrize("raw", ["three", "-1", "6"])
def test_a_replica_count_out_of_range_is_one_clear_line(raw: str) -> None:
    with pytest.raises(ValueError, match=f"GOODPUT_NATS_REPLICAS='{raw}': expected 0"):
        settings_from_env({"GOODPUT_NATS_REPLICAS": raw})


def test_streams_are_r3_on_a_clustered_server_r1_alone_unless_configured() -> None:
    assert stream_replicas(0, clustered=True) == 3
    assert stream_replicas(0, clustered=False) == 1
    assert stream_replicas(5, clustered=True) == 5
    assert stream_replicas(1, clustered=True) == 1


def test_the_servers_ports_come_from_the_url() -> None:
    """What a process group's abort spares (``goodput.shim.group_sockets``): every server of a
    cluster URL, 4222 where a URL names no port."""
    assert BusSettings(url="nats://a:4222, tls://b:7422,nats://c").ports() == {4222, 7422}
    assert BusSettings(url="").ports() == frozenset()
