"""The Kubernetes backend's options, and how rank pods reach the bus with the actuator's credentials.

The shim reaches the bus as the actuator does: the Secrets holding the actuator's NATS
credential files and TLS CA are mounted read-only into every rank pod and ``GOODPUT_NATS_*``
point at them; a password or token is never written into a pod spec (``secretKeyRef`` only).
The job's checkpoint key likewise: its Secret is mounted and ``GOODPUT_CKPT_KEY_FILE`` names it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec
from kubernetes import client, config

from goodput.bus import BusSettings
from goodput.bus.settings import ENV_VARS, FILE_FIELDS, SECRET_FIELDS, settings_to_env
from goodput.checkpoint.format.job_key import key_env, key_file_from_env

#: the key of the checkpoint-key Secret, and the file's name where it is mounted
CKPT_KEY_ITEM = "key"


class KubernetesOptions(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """The actuator's ``kubernetes`` option table (``--set 'kubernetes={image="…"}'``)."""

    #: the rank image of a job whose StartJob names none ("": every job must name one); the
    #: StartJob's argv is its command
    image: str = ""
    namespace: str = "goodput"
    #: the nodes the job may use, as a label selector; sorted by name, the first N run the job
    #: and the next S wait as spares
    node_selector: str = "goodput.dev/pool=gpu"
    service_account: str = "goodput-trainer"
    image_pull_policy: str = "IfNotPresent"
    #: the rendezvous ports are this one plus the attempt modulo 64 (a survivor restarting in
    #: process still holds its previous attempt's store port); a NetworkPolicy must allow them
    master_port: int = 29500
    #: GPUs each rank pod requests unless its StartJob says (0: none, e.g. CPU-only clusters)
    gpus_per_rank: int = 0
    gpu_resource: str = "nvidia.com/gpu"
    #: as in a pod spec (``tolerationSeconds`` an integer), checked by the client's model
    tolerations: list[dict[str, str | int]] = msgspec.field(
        default_factory=lambda: [
            {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
        ]
    )
    #: the node's checkpoint directory on the host, and where rank pods see it; the node's
    #: checkpoint tier must use the same directory as its state directory
    checkpoint_host_path: str = "/mnt/stateful_partition/goodput-checkpoints"
    checkpoint_mount_path: str = "/var/lib/goodput"
    #: the bus as the rank pods reach it; empty: the actuator's own bus URL
    bus_url: str = ""
    #: the Secret holding the files the actuator authenticates with (creds file, nkey seed,
    #: client certificate and key) under the same file names, mounted read-only here in each
    #: rank pod; used only when the actuator has such a file
    nats_creds_secret: str = "goodput-nats-creds"
    nats_creds_mount_path: str = "/etc/goodput/nats"
    #: the Secret and key holding the CA that verifies the NATS server, mounted here; used only
    #: when the actuator has a CA file (empty secret: the CA comes from ``nats_creds_secret``)
    nats_tls_secret: str = "goodput-nats-tls"
    nats_tls_ca_key: str = "ca.crt"
    nats_tls_mount_path: str = "/etc/goodput/tls"
    #: a Secret with key ``password`` (and/or ``token``) when the actuator authenticates with
    #: a password or token: rank pods read it through ``secretKeyRef``, never in clear text
    nats_auth_secret: str = ""
    #: the Secret holding the job's checkpoint key (key ``key``), mounted read-only here in each
    #: rank pod with ``GOODPUT_CKPT_KEY_FILE`` pointing at it; used only when the actuator has
    #: a key (its own ``GOODPUT_CKPT_KEY_FILE``, from the same Secret)
    ckpt_key_secret: str = "goodput-ckpt-key"
    ckpt_key_mount_path: str = "/etc/goodput/ckpt-key"
    #: how long ranks asked to stop (SIGTERM: save and exit) may take
    stop_grace_s: int = 60
    #: how long past its grace period a deleted pod may take to go; a pod still there then
    #: (its node never confirms: no kubelet) is reported lost and its node suspect
    delete_margin_s: float = 15.0
    #: credentials: in a pod the service account's (in-cluster), else this kubeconfig
    kubeconfig: str = ""
    context: str = ""

    @classmethod
    def from_mapping(cls, options: dict[str, Any]) -> KubernetesOptions:
        try:
            parsed = msgspec.convert(options, cls, strict=False)
        except msgspec.ValidationError as exc:
            raise SystemExit(f"invalid kubernetes option: {exc}") from exc
        if parsed.gpus_per_rank < 0:
            raise SystemExit("invalid kubernetes option: gpus_per_rank must not be negative")
        if not 0 <= parsed.delete_margin_s < float("inf"):
            raise SystemExit("invalid kubernetes option: delete_margin_s must be finite, >= 0")
        for toleration in parsed.tolerations:
            try:
                client.V1Toleration.model_validate(toleration)
            except ValueError as exc:  # pydantic's ValidationError is a ValueError
                raise SystemExit(f"invalid kubernetes toleration {toleration}: {exc}") from exc
        return parsed

    def api_client(self) -> client.ApiClient:
        """Credentials: in a pod the service account's (in-cluster), else the kubeconfig."""
        try:
            if not self.kubeconfig and "KUBERNETES_SERVICE_HOST" in os.environ:
                configuration = client.Configuration()
                config.load_incluster_config(client_configuration=configuration)
                return client.ApiClient(configuration)
            return config.new_client_from_config(
                config_file=self.kubeconfig or None, context=self.context or None
            )
        except config.ConfigException as exc:
            raise SystemExit(f"no Kubernetes credentials: {exc}") from exc


@dataclass
class RankBus:
    """How rank pods reach the bus: the actuator's settings, with files from mounted Secrets."""

    #: plain ``GOODPUT_NATS_*`` values (URL, user, paths inside the pod)
    env: dict[str, str]
    #: password/token through ``secretKeyRef``
    secret_env: list[client.V1EnvVar]
    volumes: list[client.V1Volume]
    mounts: list[client.V1VolumeMount]

    @classmethod
    def of(cls, settings: BusSettings, options: KubernetesOptions) -> RankBus:
        """Refuses (SystemExit) what rank pods could not be given without a Secret to hold it."""
        paths: dict[str, str] = {}
        volumes: list[client.V1Volume] = []
        mounts: list[client.V1VolumeMount] = []
        from_creds = [f for f in FILE_FIELDS if getattr(settings, f)]
        if settings.tls_ca_file and options.nats_tls_secret:
            from_creds.remove("tls_ca_file")
            key = options.nats_tls_ca_key
            paths["tls_ca_file"] = f"{options.nats_tls_mount_path.rstrip('/')}/{key}"
            volumes.append(_secret_volume("nats-tls", options.nats_tls_secret, [key]))
            mounts.append(_read_only_mount("nats-tls", options.nats_tls_mount_path))
        if from_creds:
            if not options.nats_creds_secret:
                raise SystemExit(
                    "the actuator reaches NATS with "
                    + ", ".join(f"{f.replace('_', ' ')} {getattr(settings, f)}" for f in from_creds)
                    + "; rank pods need them too: name the Secret holding them (same file names) "
                    "with kubernetes.nats_creds_secret"
                )
            for field in from_creds:
                name = Path(getattr(settings, field)).name
                paths[field] = f"{options.nats_creds_mount_path.rstrip('/')}/{name}"
            volumes.append(_secret_volume("nats-creds", options.nats_creds_secret, None))
            mounts.append(_read_only_mount("nats-creds", options.nats_creds_mount_path))
        secrets = [f for f in SECRET_FIELDS if getattr(settings, f)]
        if secrets and not options.nats_auth_secret:
            raise SystemExit(
                f"the actuator reaches NATS with a {' and a '.join(secrets)}, which the kubernetes "
                "backend does not write into pod specs: put it in a Secret (key "
                f"{', '.join(repr(f) for f in secrets)}) and name it with "
                "kubernetes.nats_auth_secret, or authenticate with a creds file"
            )
        secret_env = [
            client.V1EnvVar(
                name=ENV_VARS[field],
                value_from=client.V1EnvVarSource(
                    secret_key_ref=client.V1SecretKeySelector(
                        name=options.nats_auth_secret, key=field
                    )
                ),
            )
            for field in secrets
        ]
        rank_settings = msgspec.structs.replace(
            settings,
            url=options.bus_url or settings.url,
            password="",
            token="",
            **paths,
        )
        env = settings_to_env(rank_settings)
        if key_file_from_env():
            if not options.ckpt_key_secret:
                raise SystemExit(
                    "the actuator has a checkpoint key (GOODPUT_CKPT_KEY_FILE); rank pods need it"
                    " too: name the Secret holding it (key 'key') with kubernetes.ckpt_key_secret"
                )
            volumes.append(_secret_volume("ckpt-key", options.ckpt_key_secret, [CKPT_KEY_ITEM]))
            mounts.append(_read_only_mount("ckpt-key", options.ckpt_key_mount_path))
            env.update(key_env(f"{options.ckpt_key_mount_path.rstrip('/')}/{CKPT_KEY_ITEM}"))
        return cls(env, secret_env, volumes, mounts)


def _secret_volume(name: str, secret: str, keys: list[str] | None) -> client.V1Volume:
    items = [client.V1KeyToPath(key=k, path=k) for k in keys] if keys else None
    return client.V1Volume(
        name=name, secret=client.V1SecretVolumeSource(secret_name=secret, items=items)
    )


def _read_only_mount(name: str, path: str) -> client.V1VolumeMount:
    return client.V1VolumeMount(name=name, mount_path=path, read_only=True)
