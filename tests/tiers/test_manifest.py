import json
from pathlib import Path

import pytest

from goodput.checkpoint.format import (
    FORMAT,
    FileEntry,
    Manifest,
    ManifestError,
    build_manifest,
    committed_steps,
    encode_manifest,
    parse_manifest,
    read_manifest,
    write_manifest,
)


def test_reads_engine_manifest_and_keeps_unknown_keys_verbatim(tmp_path: Path, ckpt) -> None:
    manifest = ckpt.make(tmp_path, 7, {"a.bin": b"abc", "sub/b.bin": b"defg"})
    assert manifest.step == 7
    assert [(f.name, f.size) for f in manifest.files] == [("a.bin", 3), ("sub/b.bin", 4)]
    assert manifest.to_bytes() == (tmp_path / "step-0000000007" / "manifest.json").read_bytes()
    assert json.loads(manifest.to_bytes())["metadata"]["engine"] == "test"


def _sealed(name: str = "a", fmt: str = FORMAT) -> bytes:
    entry = FileEntry(name=name, size=1, xxh3_128="0")
    return encode_manifest(Manifest(format=fmt, step=1, kind="files", files=[entry]))


@pytest.mark.parametrize(
    "data",
    [
        _sealed(fmt="other/1"),
        json.dumps({"format": FORMAT, "step": "1", "kind": "files", "files": []}).encode(),
        json.dumps(
            {"format": FORMAT, "step": 1, "kind": "files", "files": [{"name": "a"}]}
        ).encode(),
        _sealed("../x"),
        _sealed("/etc/x"),
        _sealed(".tmp"),
        # well-formed, but not sealed: the manifest's own checksum is checked by every reader
        json.dumps({"format": FORMAT, "step": 1, "kind": "files", "files": []}).encode(),
        _sealed().replace(b'"step": 1', b'"step": 2'),
    ],
)
def test_rejects_bad_manifests(data: bytes) -> None:
    with pytest.raises(ManifestError):
        parse_manifest(data)


def test_rejects_non_json() -> None:
    with pytest.raises(ManifestError):
        parse_manifest(b"\xff{not json")


def test_lists_only_committed_checkpoints(tmp_path: Path, ckpt) -> None:
    ckpt.make(tmp_path, 2, {"a": b"1"})
    ckpt.make(tmp_path, 10, {"a": b"2"})
    (tmp_path / "step-0000000011").mkdir()  # no manifest yet: not a checkpoint
    (tmp_path / ".tmp-step-0000000012").mkdir()
    (tmp_path / "step-0000000013").mkdir()
    (tmp_path / "step-0000000013" / "manifest.json").write_text("{truncated")
    assert [step for step, _ in committed_steps(tmp_path)] == [2, 10]


def test_write_manifest_round_trips(tmp_path: Path, ckpt) -> None:
    original = ckpt.make(tmp_path / "src", 3, {"x": b"xyz"})
    built = build_manifest(3, original.files)
    write_manifest(tmp_path / "dst", built)
    assert read_manifest(tmp_path / "dst").files == original.files
    assert [p.name for p in (tmp_path / "dst").iterdir()] == ["manifest.json"]
