"""Signing in with a creds file or an nkey seed over mutual TLS, against a real nats-server
(``secure_nats``: each test runs once per way), and every way it can fail said in one line."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import msgspec
import nkeys
import pytest

from goodput import schemas, subjects
from goodput.bus import Bus, BusCredentialsError, BusSettings
from goodput.bus.credentials import NKEYS_MISSING
from goodput.launch.exit_reason import REFUSED_EXIT_CODE
from goodput.shim.link import BusLink
from tests.nats_auth import Operator, new_key
from tests.secure_nats import SecureNats

JOB = "job-creds"
#: hides the nkeys package from the process, as an image built without nats-py[nkeys] did
WITHOUT_NKEYS = "import runpy, sys; sys.modules['nkeys'] = None; sys.argv[0] = 'x'; "


async def test_a_client_signs_in_provisions_and_round_trips(secure_nats: SecureNats) -> None:
    bus = await Bus.connect(secure_nats.settings(), name="test", initial_timeout_s=10)
    try:
        await bus.provision()
        await bus.emit(schemas.Signal(job=JOB, signal="hang", node="node-0"))
        stored = await bus.js.get_last_msg(subjects.EVENTS_STREAM, subjects.event(JOB, "signal"))
        assert schemas.decode_event(stored.data).job == JOB
    finally:
        await bus.close()


async def test_a_credential_the_server_does_not_know_is_refused_in_one_line(
    secure_nats: SecureNats,
) -> None:
    with pytest.raises(BusCredentialsError) as refused:  # at once: not retried as an outage
        await Bus.connect(
            secure_nats.settings(secure_nats.stranger), name="t", initial_timeout_s=0.01
        )
    message = str(refused.value)
    assert "refused" in message and "Authorization Violation" in message
    assert str(secure_nats.stranger) in message and "\n" not in message
    assert _seed(secure_nats.stranger) not in message


async def test_tls_the_server_refuses_is_one_line_at_once(secure_nats: SecureNats) -> None:
    """At once: on the first try, never retried as an outage (a deadline too short for a
    second try turns a retry into ``BusUnavailableError``). Without a certificate the TLS 1.3
    alert races a reset in about four tries in ten, so twenty tries meet the reset."""
    settings = secure_nats.settings()
    without_certificate = msgspec.structs.replace(settings, tls_cert_file="", tls_key_file="")
    other_ca = msgspec.structs.replace(settings, tls_ca_file=str(secure_nats.tls.client_cert))
    for wrong, expected in ((without_certificate, "certificate"), (other_ca, "verify failed")):
        for _ in range(20):
            with pytest.raises(BusCredentialsError, match=expected):
                await Bus.connect(wrong, name="t", initial_timeout_s=0.01)


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        ("no markers at all\n", "holds no user JWT"),
        ("-----BEGIN NATS USER JWT-----\neyJ.x.y\n------END NATS USER JWT------\n", "no valid"),
        (
            "-----BEGIN NATS USER JWT-----\neyJ.x.y\n-----BEGIN USER NKEY SEED-----\nSUnot\n",
            "no valid nkey seed",
        ),
    ],
)
def test_a_creds_file_nats_py_would_choke_on_is_one_line(
    tmp_path: Path, content: str, expected: str
) -> None:
    """nats-py's reader loops forever on a creds file without a JWT block: refused first."""
    creds = tmp_path / "broken.creds"
    creds.write_text(content)
    with pytest.raises(BusCredentialsError, match=expected):
        BusSettings(url="tls://bus:4222", creds_file=str(creds)).check_credentials()


def test_a_seed_that_is_not_a_users_is_refused(tmp_path: Path) -> None:
    seed = tmp_path / "account.nk"
    seed.write_text(new_key(nkeys.PREFIX_BYTE_ACCOUNT).seed.decode())
    with pytest.raises(BusCredentialsError, match="not a user's"):
        BusSettings(url="tls://bus:4222", nkey_seed_file=str(seed)).check_credentials()


def test_without_the_nkeys_package_the_check_says_what_to_install(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    creds = tmp_path / "goodput.creds"
    creds.write_text(Operator.create().user_creds())
    monkeypatch.setitem(sys.modules, "nkeys", None)
    with pytest.raises(BusCredentialsError, match=r"pip install 'nats-py\[nkeys\]'"):
        BusSettings(url="tls://bus:4222", creds_file=str(creds)).check_credentials()


@pytest.mark.parametrize(
    "program",
    [
        "runpy.run_module('goodput_services.sensor', run_name='__main__')",
        "from goodput.tools.cli.main import main; sys.exit(main(sys.argv[1:]))",
    ],
    ids=["service", "cli"],
)
def test_without_the_nkeys_package_a_process_ends_with_one_line(
    secure_nats: SecureNats, tmp_path: Path, program: str
) -> None:
    """A service and `goodput status`, in processes that lack nkeys: one line, no traceback."""
    args = ["status", "--once", "--job", JOB] if program.startswith("from") else []
    args += [*secure_nats.flags(), "--state-dir", str(tmp_path / "state")]
    result = subprocess.run(
        [sys.executable, "-c", WITHOUT_NKEYS + program, *args],
        capture_output=True,
        text=True,
        timeout=120,
    )
    # a service refuses the setting (its keeper would not restart it: exit 78); the CLI fails
    expected = REFUSED_EXIT_CODE if program.startswith("runpy") else 1
    assert result.returncode == expected, result.stderr
    assert "Traceback" not in result.stderr
    assert NKEYS_MISSING in result.stderr.strip().splitlines()[-1]


def _seed(path: Path) -> str:
    text = path.read_text()
    return text.split("NKEY SEED-----\n")[1].split("\n")[0] if "SEED" in text else text.strip()


def test_without_the_nkeys_package_a_rank_says_why_it_is_not_supervised(
    secure_nats: SecureNats, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The shim's connect path (its bus thread, as a rank runs it): one logged line."""
    monkeypatch.setitem(sys.modules, "nkeys", None)
    link = BusLink(
        settings=secure_nats.settings(),
        job=JOB,
        node="node-0",
        rank=0,
        heartbeat_period_s=1.0,
        on_command=lambda command: None,
    )
    try:
        deadline = time.monotonic() + 30
        while not link.failure and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        link.close()
    assert link.failure == NKEYS_MISSING and not link.connected.is_set()
    refusals = [r.getMessage() for r in caplog.records if "NOT supervised" in r.getMessage()]
    assert len(refusals) == 1 and NKEYS_MISSING in refusals[0]
