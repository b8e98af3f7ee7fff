"""The pre-pass's fast path on bench/gen's traffic (bulk transfers, keep-alive HTTP, short connections, IPv4 and
IPv6, every planted failure; and issue 34's short, h2c and mTLS mixes): analyze's report of the pod's two files,
and the event stream of each file read alone, are the same with MESHDOCTOR_FASTPATH=0 and =1, in chunks of a few
thousand records. Not timed."""

from __future__ import annotations

import asyncio
import shutil

import pytest

from kubectl_meshdoctor.commands.analyze import analyze
from kubectl_meshdoctor.core.pipeline import Pipeline
from kubectl_meshdoctor.sources import read_plan
from kubectl_meshdoctor.sources.files import CaptureArg
from tests.bench.test_gen import gen
from tests.sources.test_fastpath import same_stream

pytestmark = pytest.mark.skipif(shutil.which("tshark") is None, reason="reads captures through tshark")


def _report(paths, fast: str, monkeypatch):
    monkeypatch.setenv("MESHDOCTOR_PREPASS", "1")
    monkeypatch.setenv("MESHDOCTOR_FASTPATH", fast)
    return asyncio.run(analyze([CaptureArg.parse(str(p)) for p in paths], Pipeline.with_detectors()))


def test_generated_traffic_gives_the_same_report_and_events_with_the_fast_path(tmp_path, monkeypatch):
    gen.generate(tmp_path, 20_000, 5, jobs=1)
    paths = [tmp_path / f for f in gen.FILES.values()]
    without, with_ = (_report(paths, fast, monkeypatch) for fast in "01")
    assert with_.findings == without.findings and with_.findings
    assert with_.stats == without.stats and with_.problems == without.problems
    monkeypatch.setattr(read_plan, "PREPASS_CHUNK_PACKETS", 3_000)
    for p in paths:
        assert len(same_stream(p, monkeypatch)) > 1_000


@pytest.mark.parametrize("mix", ("short", "h2c", "mtls"))
def test_each_mix_gives_the_same_report_with_the_fast_path(tmp_path, monkeypatch, mix):
    """Issue 34's other mixes: one request a connection, h2c's many streams, mTLS records on eth0. Findings with
    their frames, counts and problems are the same whether tshark or the fast path decides the records."""
    pytest.importorskip("h2", reason="bench extra not installed: pip install -e '.[bench]'")
    gen.generate(tmp_path, 20_000, 5, jobs=1, mix=mix)
    paths = [tmp_path / f for f in gen.FILES.values()]
    without, with_ = (_report(paths, fast, monkeypatch) for fast in "01")
    assert with_.findings == without.findings and len(with_.findings) == 15
    assert with_.stats == without.stats and with_.problems == without.problems
