"""A bus other hosts can reach must be authenticated, unless the operator says otherwise."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from goodput.bus import Bus, BusSettings, EmbeddedNats, InsecureBusError
from goodput.bus.embedded import free_port, nats_server_binary
from goodput.state_dir import StateDir
from tests.processes import stop


@pytest.mark.parametrize(
    "url", ["nats://10.0.0.5:4222", "nats://127.0.0.1:4222,nats://nats.example.com:4222"]
)
def test_non_loopback_without_auth_is_refused(url: str) -> None:
    with pytest.raises(InsecureBusError, match="--nats-creds"):
        BusSettings(url=url).check_security()


@pytest.mark.parametrize(
    "settings",
    [
        BusSettings(url="nats://127.0.0.1:4222"),
        BusSettings(url="nats://localhost:4222"),
        BusSettings(url="nats://10.0.0.5:4222", insecure=True),
        BusSettings(url="nats://10.0.0.5:4222", creds_file="/etc/goodput/nats.creds"),
        BusSettings(url="nats://10.0.0.5:4222", user="svc", password="secret"),
    ],
)
def test_loopback_explicit_opt_in_or_credentials_are_accepted(settings: BusSettings) -> None:
    settings.check_security()


def test_a_service_on_an_unauthenticated_remote_bus_exits_with_a_clear_message() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "goodput_services.sensor", "--nats-url", "nats://10.255.255.1:4222"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode != 0
    assert "without authentication" in result.stderr


def test_missing_credentials_file_is_reported() -> None:
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "goodput_services.sensor",
            "--nats-url",
            "nats://10.255.255.1:4222",
            "--nats-creds",
            "/nonexistent/x.creds",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode != 0
    assert "does not exist" in result.stderr


async def test_user_password_authentication_against_a_real_server(tmp_path: Path) -> None:
    port = free_port()
    config = tmp_path / "auth.conf"
    config.write_text(
        f'listen: "127.0.0.1:{port}"\njetstream {{ store_dir: "{tmp_path / "js"}" }}\n'
        'authorization { user: "svc", password: "s3cret" }\n'
    )
    server = subprocess.Popen([nats_server_binary(), "-c", str(config)], stderr=subprocess.DEVNULL)
    try:
        good = await Bus.connect(
            BusSettings(url=f"nats://127.0.0.1:{port}", user="svc", password="s3cret"), name="t"
        )
        await good.provision()
        await good.close()
        with pytest.raises(Exception, match=r"(?i)authorization|unavailable"):
            await Bus.connect(
                BusSettings(url=f"nats://127.0.0.1:{port}"), name="t", initial_timeout_s=2
            )
    finally:
        stop(server)


def test_embedded_server_listens_on_loopback_only(tmp_path: Path) -> None:
    with EmbeddedNats(StateDir(tmp_path)) as server:
        assert server.url.startswith("nats://127.0.0.1:")
        log = (tmp_path / "nats-server.log").read_text()
        assert "Listening for client connections on 127.0.0.1:" in log
