"""The pre-pass on bench/gen's traffic (bulk transfers, keep-alive HTTP, IPv4 and IPv6, every planted failure):
analyze's report is the same with it as without, and finds exactly what the generator planted. Not timed."""

from __future__ import annotations

import asyncio
import json
import shutil

import pytest

from kubectl_meshdoctor.commands.analyze import analyze
from kubectl_meshdoctor.core.pipeline import Pipeline
from kubectl_meshdoctor.frontends.report import render_json
from kubectl_meshdoctor.sources.files import CaptureArg
from tests.bench.test_gen import bench_run, gen

pytestmark = pytest.mark.skipif(shutil.which("tshark") is None, reason="reads captures through tshark")


def test_generated_traffic_gives_the_same_report_with_the_pre_pass(tmp_path, monkeypatch):
    gen.generate(tmp_path, 20_000, 3, jobs=1)
    paths = [tmp_path / f for f in gen.FILES.values()]
    reports = {}
    for on in ("0", "1"):
        monkeypatch.setenv("MESHDOCTOR_PREPASS", on)
        reports[on] = asyncio.run(analyze([CaptureArg.parse(str(p)) for p in paths], Pipeline.with_detectors()))
    without, with_ = reports["0"], reports["1"]
    assert with_.findings == without.findings
    assert with_.stats.frames_read == without.stats.frames_read and with_.problems == without.problems == []
    assert sum(with_.stats.frames_read.values()) == 20_000
    check = bench_run.check_findings(json.loads(render_json(with_)),
                                     json.loads((tmp_path / "manifest.json").read_text()))
    assert not bench_run.check_problems(check) and check["found"]
    assert not list(tmp_path.glob(".meshdoctor-chunks-*"))
