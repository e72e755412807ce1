"""The HTML/PNG report: files exist, PNGs are valid, the HTML needs nothing from outside."""

from __future__ import annotations

import base64
import json
import re
import struct
import zlib
from pathlib import Path

import pytest

from goodput.measure.accounting import compute_goodput, write_event_log
from goodput.measure.accounting.html import write_html_report
from goodput.tools.cli.main import main
from tests.accounting.scenario import EXPECTED_TOTAL, scenario_events
from tests.conftest import goodput_cli

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def png_size(data: bytes) -> tuple[int, int]:
    """Width and height after checking the signature and every chunk's CRC."""
    assert data.startswith(PNG_SIGNATURE)
    offset, chunks = len(PNG_SIGNATURE), []
    while offset < len(data):
        (length,) = struct.unpack(">I", data[offset : offset + 4])
        kind = data[offset + 4 : offset + 8]
        body = data[offset + 8 : offset + 8 + length]
        (crc,) = struct.unpack(">I", data[offset + 8 + length : offset + 12 + length])
        assert zlib.crc32(kind + body) == crc, kind
        chunks.append(kind)
        offset += 12 + length
    assert chunks[0] == b"IHDR" and chunks[-1] == b"IEND" and b"IDAT" in chunks
    header = data[16:24]
    return struct.unpack(">II", header)


def assert_self_contained(page: str) -> None:
    assert not re.search(r"""(src|href)\s*=\s*["'](?!data:)""", page, re.I)
    assert "<script" not in page.lower() and "<link" not in page.lower()
    assert "@import" not in page and "url(" not in page


def test_html_report_files(tmp_path: Path) -> None:
    report = compute_goodput(scenario_events())
    page_path = write_html_report(report, tmp_path / "out")
    out = tmp_path / "out"
    assert page_path == out / "report.html"
    for name in ("report.html", "timeline.png", "badput.png", "report.json"):
        assert (out / name).stat().st_size > 0, name
    for name in ("timeline.png", "badput.png"):
        width, height = png_size((out / name).read_bytes())
        assert width > 300 and height > 200
    page = page_path.read_text()
    assert_self_contained(page)
    inlined = [
        base64.b64decode(m) for m in re.findall(r'src="data:image/png;base64,([^"]+)"', page)
    ]
    assert inlined == [(out / "timeline.png").read_bytes(), (out / "badput.png").read_bytes()]
    assert "37.20 %" in page and "restart_reprovision" in page
    assert json.loads((out / "report.json").read_text())["total_s"] == pytest.approx(EXPECTED_TOTAL)


def test_job_names_are_escaped(tmp_path: Path) -> None:
    report = compute_goodput(scenario_events())
    report.job = "<img src=x onerror=alert(1)>"
    page = write_html_report(report, tmp_path).read_text()
    assert "<img src=x" not in page and "&lt;img src=x" in page


def test_cli_html_from_an_event_log(tmp_path: Path) -> None:
    log = tmp_path / "events.jsonl"
    write_event_log(log, scenario_events())
    result = goodput_cli("report", "--events", str(log), "--html", str(tmp_path / "html"))
    assert "37.20 %" in result.stdout
    assert "report.html" in result.stderr
    assert_self_contained((tmp_path / "html" / "report.html").read_text())
    png_size((tmp_path / "html" / "timeline.png").read_bytes())


def test_cli_rejects_a_broken_log(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    log = tmp_path / "events.jsonl"
    log.write_text("{broken\n")
    assert main(["report", "--events", str(log)]) == 1
    assert "events.jsonl:1" in capsys.readouterr().err
    assert main(["report", "--events", str(log), "--export", str(tmp_path / "x")]) == 1
    assert "--export" in capsys.readouterr().err
