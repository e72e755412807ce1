"""The job's checkpoint key: manifests signed when sealed, refused unsigned or forged."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import msgspec
import pytest

from goodput.checkpoint.engine import CheckpointEngine, NoCheckpointError, verify_files
from goodput.checkpoint.engine.events import CheckpointRestored
from goodput.checkpoint.format import (
    Manifest,
    ManifestError,
    read_manifest,
    read_manifest_bytes,
    step_dir,
    write_manifest,
)
from goodput.checkpoint.format.job_key import (
    KEY_FILE_ENV,
    JobKeyError,
    adopt_stack_key,
    create_key_file,
    key_env,
    load_key,
    stack_key_env,
)
from goodput.checkpoint.format.manifest import is_authenticated
from goodput.state_dir import StateDir

from .helpers import assert_bit_exact, make_state


@pytest.fixture
def job_key(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> bytes:
    path = create_key_file(tmp_path / "state" / "ckpt.key")
    monkeypatch.setenv(KEY_FILE_ENV, str(path))
    return load_key(str(path))


def test_a_new_key_file_is_private_random_and_kept_across_restarts(tmp_path: Path) -> None:
    path = create_key_file(tmp_path / "a" / "ckpt.key")
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    key = path.read_bytes()
    assert len(key.strip()) == 64 and create_key_file(path).read_bytes() == key
    assert create_key_file(tmp_path / "b" / "ckpt.key").read_bytes() != key
    assert key_env(path) == {KEY_FILE_ENV: str(path.absolute())}
    short = tmp_path / "short.key"
    short.write_text("secret\n")
    with pytest.raises(JobKeyError, match=r"short\.key: expected 32 to 4096 bytes"):
        load_key(str(short))


def _steps(root: Path, events: list[object]) -> CheckpointEngine:
    engine = CheckpointEngine(root, min_file_bytes=4096, listener=events.append)
    engine.save(make_state(1), 1).wait()
    engine.save(make_state(2), 2).wait()
    return engine


def test_signed_manifests_restore_and_a_forgery_without_the_key_falls_back(
    tmp_path: Path, job_key: bytes
) -> None:
    events: list[object] = []
    engine = _steps(tmp_path / "ckpt", events)
    newest = step_dir(tmp_path / "ckpt", 2)
    assert is_authenticated(read_manifest(newest))
    assert engine.restore()[0] == 2
    # a forger edits the manifest and re-seals it: without the key, or with another job's
    manifest = msgspec.json.decode(read_manifest_bytes(newest), type=Manifest)
    manifest.metadata["forged"] = True
    for key in (None, b"k" * 32):
        write_manifest(newest, manifest, key=key)
        with pytest.raises(ManifestError, match=r"not signed with the job.s key|MAC mismatch"):
            read_manifest(newest)
        assert verify_files(newest)
        step, restored = engine.restore()
        assert step == 1
        assert_bit_exact(make_state(1), restored)
        fallback = [e for e in events if isinstance(e, CheckpointRestored)][-1].fallbacks[0]
        assert fallback.step == 2 and ("not signed" in fallback.reason or "MAC" in fallback.reason)
    # a reader without a key has nothing to check the MAC with
    assert read_manifest(newest, key=None).metadata == {"forged": True}


def test_unsigned_checkpoints_are_refused_once_a_key_is_configured(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = _steps(tmp_path / "ckpt", [])
    # unkeyed manifests are byte for byte what they were before keys existed
    assert b"manifest_hmac_sha256" not in read_manifest_bytes(step_dir(tmp_path / "ckpt", 2))
    monkeypatch.setenv(KEY_FILE_ENV, str(create_key_file(tmp_path / "ckpt.key")))
    with pytest.raises(NoCheckpointError, match="not signed with the job's key"):
        engine.restore()


def test_a_configured_key_that_cannot_be_read_restores_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = _steps(tmp_path / "ckpt", [])
    monkeypatch.setenv(KEY_FILE_ENV, os.fspath(tmp_path / "missing.key"))
    with pytest.raises(NoCheckpointError, match=r"checkpoint key .*missing\.key"):
        engine.restore()


def test_a_stack_makes_its_key_once_and_tools_beside_it_adopt_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # recorded first, so that what adopt_stack_key sets is undone after the test
    monkeypatch.setenv(KEY_FILE_ENV, "")
    monkeypatch.delenv(KEY_FILE_ENV)
    state = tmp_path / "state"
    env = stack_key_env(state)
    assert env == {KEY_FILE_ENV: str(StateDir(state).ckpt_key)}
    assert stack_key_env(state) == env and load_key(env[KEY_FILE_ENV])
    assert adopt_stack_key(tmp_path / "elsewhere") is None and KEY_FILE_ENV not in os.environ
    assert adopt_stack_key(state) == env[KEY_FILE_ENV] == os.environ[KEY_FILE_ENV]
    mine = create_key_file(tmp_path / "mine.key")  # a key the user configured wins
    monkeypatch.setenv(KEY_FILE_ENV, str(mine))
    assert stack_key_env(state) == key_env(mine) and adopt_stack_key(state) == str(mine)
    broken = tmp_path / "broken"
    broken.mkdir()
    StateDir(broken).ckpt_key.write_text("short\n")
    monkeypatch.delenv(KEY_FILE_ENV)
    with pytest.raises(SystemExit, match=r"^cannot set up the checkpoint key: .*ckpt\.key"):
        stack_key_env(broken)
