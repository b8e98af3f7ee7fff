"""Issue 32: `-o text` to a terminal is wrapped to the terminal's width with hanging indents; a fix's YAML stays
YAML (its comments go on as comments) and a quoted access-log line stays one line (it is copied and searched for as
written: the terminal's own soft wrap keeps it one line when copied). Piped, the report is as before (the golden
reports). On a real pseudo-terminal (tests/lab/terminal.py), and through the renderer with a width."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from kubectl_meshdoctor.commands.analyze import analyze
from kubectl_meshdoctor.core.pipeline import Pipeline
from kubectl_meshdoctor.core.report_model import Report
from kubectl_meshdoctor.frontends.report import RENDERERS, render_text
from kubectl_meshdoctor.sources.files import CaptureArg

from ...lab.terminal import Terminal

DATA = Path(__file__).parent.parent.parent / "data"
FILES = [str(DATA / f) for f in ("lab-framing-mixed-eth0.pcap", "lab-framing-mixed-lo.pcap",
                                 "lab-framing-mixed-access.log")]
PLUGIN = str(Path(sys.executable).parent / "kubectl-meshdoctor")


def on_terminal(cols: int) -> list[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}  # the terminal's own size
    term = Terminal.start([PLUGIN, "analyze", *FILES], env, rows=24, cols=cols)
    assert term.wait(120) == 1  # errors found
    text = term.out.decode().replace("\r\n", "\n")
    return text[text.index("kubectl-meshdoctor "):].splitlines()  # after the progress line (stderr)


@pytest.mark.parametrize("cols", [80, 160])
def test_text_on_a_terminal_fits_its_width_but_the_lines_to_copy(cols):
    lines = on_terminal(cols)
    findings = json.loads(subprocess.run([PLUGIN, "analyze", "-o", "json", *FILES], capture_output=True,
                                         check=False).stdout)["findings"]
    quoted = {line for f in findings for line in f.get("access_log", ())}
    assert quoted
    shown = [row.split("access log: ", 1)[1] for row in lines if row.startswith("      access log: ")]
    assert shown and all(line in quoted for line in shown)  # each access-log line whole, on one line
    long = [row for row in lines if len(row) > cols]
    assert all(row.startswith("      access log: ") for row in long), long  # nothing else passes the width
    why = [i for i, row in enumerate(lines) if row.startswith("  why: ")]
    assert why and all(lines[i + 1].startswith("       ") for i in why)  # goes on under its own text
    # The fix's YAML block still parses as YAML, its wrapped comments comments.
    start = next(i for i, row in enumerate(lines) if row.startswith("    keeps: "))
    block = []
    for row in lines[start + 1:]:
        if not row.startswith("    "):
            break
        if not row.startswith("      "):  # the keeps/costs lines' own continuation is not YAML
            block.append(row[4:])
    assert block and all(b.startswith("#") or not b.strip() for b in block[:3])
    yaml.safe_load("\n".join(block))
    if cols == 80:
        assert any(row.startswith("    #     ") for row in lines)  # a comment wrapped as a comment


def test_piped_text_is_as_the_renderer_gives_it():
    piped = subprocess.run([PLUGIN, "analyze", *FILES], capture_output=True, check=False, text=True).stdout
    report = asyncio.run(analyze([CaptureArg.parse(f) for f in FILES], Pipeline.with_detectors()))
    assert piped == RENDERERS["text"](report)
    assert any(len(row) > 80 and row.startswith("       ") for row in piped.splitlines())  # the 118-column prose


def test_hostile_text_is_escaped_before_it_is_wrapped():
    report = asyncio.run(analyze([CaptureArg.parse(f) for f in FILES], Pipeline.with_detectors()))
    f = report.findings[0]
    hostile = dataclasses.replace(f, title="GET /\x1b]0;owned\x07 " + "\u202eevil " * 20 + "x" * 90,
                                  access_log=("[2026] \"GET /\x1b[2J HTTP/1.1\" 502 UPE " + "y" * 100,))
    text = render_text(Report(report.source, report.stats, [hostile]), 60)
    assert "\x1b" not in text and "\u202e" not in text and "\\x1b]0;owned\\x07" in text
    rows = text.splitlines()
    assert all(len(row) <= 60 for row in rows if "access log: " not in row)
    assert any(row.startswith("      access log: [2026] \"GET /\\x1b[2J HTTP/1.1\" 502 UPE y") for row in rows)
    assert [row for row in rows if "xxxxx" in row][0].startswith("  ")  # the long word cut, indented
