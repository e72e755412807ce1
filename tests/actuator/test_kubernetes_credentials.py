"""How the bus credentials reach the Kubernetes backend's rank pods (mounted secrets, never a
plain value), against the API FAKE of ``kubernetes_fake`` and the deployed manifests."""

from __future__ import annotations

import json
import tomllib

import msgspec
import pytest
from kubernetes import client

from goodput.bus import BusSettings
from goodput.bus.settings import settings_from_env
from goodput.checkpoint.format.job_key import KEY_FILE_ENV
from goodput_services.actuator.kubernetes_options import KubernetesOptions, RankBus
from tests.actuator.kubernetes_fake import (
    DEPLOY,
    OPTIONS,
    _container_config,
    _env,
    _serialize,
    _start,
    _started_pod,
)


def _secret_of(pod: client.V1Pod, volume_name: str) -> client.V1SecretVolumeSource:
    return next(v for v in pod.spec.volumes if v.name == volume_name).secret


def _mount_of(pod: client.V1Pod, volume_name: str) -> client.V1VolumeMount:
    return next(m for m in pod.spec.containers[0].volume_mounts if m.name == volume_name)


async def test_rank_pods_get_the_actuators_credentials_from_mounted_secrets() -> None:
    # the actuator's own files may sit anywhere; in rank pods they are where the Secrets are
    settings = BusSettings(
        url="tls://goodput-nats.goodput.svc:4222",
        creds_file="/run/goodput/creds/actuator.creds",
        tls_ca_file="/run/goodput/ca/bundle.pem",
    )
    options = msgspec.structs.replace(OPTIONS, bus_url="tls://nats.example.internal:4222")
    pod, _ = await _started_pod(settings, options)
    env = _env(pod)
    assert env["GOODPUT_NATS_URL"] == "tls://nats.example.internal:4222"  # the override holds
    assert env["GOODPUT_NATS_CREDS"] == "/etc/goodput/nats/actuator.creds"
    assert env["GOODPUT_NATS_TLS_CA"] == "/etc/goodput/tls/ca.crt"
    creds = _secret_of(pod, "nats-creds")
    assert (creds.secret_name, creds.items) == ("goodput-nats-creds", None)
    ca = _secret_of(pod, "nats-tls")
    assert ca.secret_name == "goodput-nats-tls"
    assert [(i.key, i.path) for i in ca.items] == [("ca.crt", "ca.crt")]
    for name, path in (("nats-creds", "/etc/goodput/nats"), ("nats-tls", "/etc/goodput/tls")):
        mount = _mount_of(pod, name)
        assert (mount.mount_path, mount.read_only) == (path, True)
    # what the shim will read from that environment passes its own security check
    settings_from_env(env).check_security()


async def test_rank_pods_of_an_unauthenticated_bus_get_no_secret_volumes(rig) -> None:
    backend, api, _ = rig
    await backend.start_job(_start(nodes=1, spares=0, procs=1))
    pod = api.pod(1, 0)
    assert {v.name for v in pod.spec.volumes} == {"checkpoints", "dshm"}
    assert not any(k.startswith("GOODPUT_NATS_") and k != "GOODPUT_NATS_URL" for k in _env(pod))


async def test_a_password_reaches_rank_pods_only_through_a_secret_reference() -> None:
    settings = BusSettings(url="nats://nats.goodput.svc:4222", user="trainer", password="s3cret")
    with pytest.raises(SystemExit, match=r"password.*nats_auth_secret"):
        await _started_pod(settings)
    options = msgspec.structs.replace(OPTIONS, nats_auth_secret="goodput-nats-password")
    pod, backend = await _started_pod(settings, options)
    env = pod.spec.containers[0].env
    assert _env(pod)["GOODPUT_NATS_USER"] == "trainer"
    (password,) = [e for e in env if e.name == "GOODPUT_NATS_PASSWORD"]
    reference = password.value_from.secret_key_ref
    assert (password.value, reference.name, reference.key) == (
        None,
        "goodput-nats-password",
        "password",
    )
    assert "s3cret" not in json.dumps(_serialize(pod))
    assert backend.bus_settings.password == "s3cret"  # the actuator itself still has it


def test_the_deployed_actuator_hands_its_own_credential_paths_to_the_rank_pods(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The rank pods see the Secrets where the deployed actuator sees them, from the same names
    (the NATS credentials and the job's checkpoint key)."""
    bus = msgspec.convert(tomllib.loads((DEPLOY / "goodput.toml").read_text())["bus"], BusSettings)
    config, spec = _container_config("supervisor.yaml", "goodput-actuator", "actuator")
    deployed_env = {e["name"]: e["value"] for e in spec["containers"][0]["env"] if "value" in e}
    monkeypatch.setenv(KEY_FILE_ENV, deployed_env[KEY_FILE_ENV])
    options = KubernetesOptions.from_mapping(config.options["kubernetes"])
    rank_bus = RankBus.of(bus, options)
    assert rank_bus.env["GOODPUT_NATS_CREDS"] == bus.creds_file
    assert rank_bus.env["GOODPUT_NATS_TLS_CA"] == bus.tls_ca_file
    assert rank_bus.env[KEY_FILE_ENV] == deployed_env[KEY_FILE_ENV]
    # the same Secret at the same path as in the actuator's own pod
    secrets = {v["name"]: v["secret"]["secretName"] for v in spec["volumes"] if "secret" in v}
    deployed = {
        m["mountPath"]: secrets[m["name"]]
        for m in spec["containers"][0]["volumeMounts"]
        if m["name"] in secrets
    }
    ranks = {
        m.mount_path: v.secret.secret_name
        for v, m in zip(rank_bus.volumes, rank_bus.mounts, strict=True)
    }
    assert ranks == deployed
