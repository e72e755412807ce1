"""The deploy configuration parses, and configures services for an authenticated TLS bus."""

from __future__ import annotations

import argparse
import tomllib
from pathlib import Path

import msgspec
import yaml

from goodput.config import ServiceConfig, add_common_arguments, config_from_args

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"


def test_every_manifest_is_valid_yaml_with_kind_and_name() -> None:
    kustomization = yaml.safe_load((DEPLOY / "k8s" / "base" / "kustomization.yaml").read_text())
    for resource in kustomization["resources"]:
        for document in yaml.safe_load_all((DEPLOY / "k8s" / "base" / resource).read_text()):
            assert document["kind"] and document["metadata"]["name"]


def test_service_config_uses_credentials_and_tls() -> None:
    raw = tomllib.loads((DEPLOY / "k8s" / "base" / "goodput.toml").read_text())
    config = msgspec.convert(raw, ServiceConfig)
    assert config.bus.creds_file and config.bus.tls_ca_file
    assert not config.bus.insecure
    config.bus.check_security()  # authenticated: accepted although the host is remote


def test_flags_override_environment_override_file(tmp_path: Path, monkeypatch) -> None:
    file = tmp_path / "svc.toml"
    file.write_text('job = "from-file"\nlog_level = "debug"\n[options]\nx = 1\n')
    monkeypatch.setenv("GOODPUT_JOB", "from-env")
    monkeypatch.setenv("GOODPUT_LOG_LEVEL", "warning")
    parser = argparse.ArgumentParser()
    add_common_arguments(parser)
    config = config_from_args(parser.parse_args(["--config", str(file), "--job", "from-flag"]))
    assert (config.job, config.log_level, config.options) == ("from-flag", "warning", {"x": 1})


def test_a_typo_in_the_config_file_is_an_error(tmp_path: Path) -> None:
    file = tmp_path / "svc.toml"
    file.write_text('jobb = "typo"\n')
    parser = argparse.ArgumentParser()
    add_common_arguments(parser)
    try:
        config_from_args(parser.parse_args(["--config", str(file)]))
    except SystemExit as exc:
        assert "jobb" in str(exc)
    else:
        raise AssertionError("an unknown key was accepted")
