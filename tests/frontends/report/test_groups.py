"""Issue 16: reports read like a diagnosis, not a log. Alike findings are one group with a count, first and last
seen and a rate; the text and markdown reports describe each group once (a screenful at most), with the run's
counters once; `-o json` keeps every instance and adds the groups."""

from __future__ import annotations

import asyncio
import json
from dataclasses import replace
from pathlib import Path

import pytest

from kubectl_meshdoctor.commands.analyze import analyze
from kubectl_meshdoctor.core.findings import FlowRef, Severity
from kubectl_meshdoctor.core.groups import group_findings
from kubectl_meshdoctor.core.pipeline import Pipeline
from kubectl_meshdoctor.core.report_model import Report
from kubectl_meshdoctor.frontends.report import render_json, render_markdown, render_text
from kubectl_meshdoctor.sources.files import CaptureArg

DATA = Path(__file__).parent.parent.parent / "data"
SCREENFUL = 40  # rows: what a terminal shows without scrolling, near enough
COLUMNS = 120


def rows(text: str) -> int:
    """The terminal rows ``text`` takes at COLUMNS columns (a long line wraps)."""
    return sum(max(1, -(-len(line) // COLUMNS)) for line in text.splitlines())
COUNTERS = {"upstream_cx_destroy": 88, "TcpExtTCPChallengeACK": 88}


@pytest.fixture(scope="module")
def collision():
    args = [CaptureArg.parse(str(DATA / "lab-collision-eth0.pcap"))]
    return asyncio.run(analyze(args, Pipeline.with_detectors()))


def repeated(base: Report, n: int, every_s: float = 2.0) -> Report:
    """``base``'s finding ``n`` times, from ``n`` client ports, one every ``every_s`` seconds, each carrying the
    run's counters as the pipeline attaches them."""
    f = base.findings[0]
    many = [replace(f, flow=FlowRef(f"198.18.1.1:{40000 + i}", f.flow.server, "eth0"), ts=f.ts + i * every_s,
                    counters=dict(COUNTERS)) for i in range(n)]
    return Report(base.source, base.stats, many)


def test_alike_findings_are_one_group_with_count_times_and_rate(collision):
    report = repeated(collision, 88)
    (g,) = group_findings(report.findings)
    assert g.count == 88 and g.newest.flow.client == "198.18.1.1:40087"
    assert g.last_ts - g.first_ts == pytest.approx(87 * 2.0)
    assert g.rate_per_min == pytest.approx(87 * 60 / 174)
    assert g.span_text() == "88 times in 2 min 54 s (30.0/min)"
    assert g.counters == COUNTERS


def test_what_differs_makes_its_own_group(collision):
    f = collision.findings[0]
    other_port = replace(f, flow=FlowRef(f.flow.client, "198.18.1.2:5003", "eth0"))
    other_flags = replace(f, envoy_flags=("UF",))
    other_variant = replace(f, variant="SYN for 198.18.1.2:5002 dropped")
    other_pod = replace(f, pod="elsewhere")
    warning = replace(f, severity=Severity.WARNING)
    groups = group_findings([f, replace(f, ts=f.ts + 1), other_port, other_flags, other_variant, other_pod, warning])
    assert sorted(g.count for g in groups) == [1, 1, 1, 1, 1, 2]
    assert groups[-1].newest.severity is Severity.WARNING  # most severe first


def test_the_text_report_gives_each_group_a_screenful_and_the_counters_once(collision):
    text = render_text(repeated(collision, 88))
    assert text.splitlines()[1] == "verdict: 1 failure problem (1 error, 0 warnings): tuple-collision"
    body = text.split("\n\n", 1)[1].strip("\n")  # the group's block, after the headline, verdict, not-seen line
    assert rows(body) <= SCREENFUL, body
    assert "seen 88 times in 2 min 54 s (30.0/min)" in text
    assert text.count("counter (the run's): upstream_cx_destroy +88") == 1
    assert text.count("TcpExtTCPChallengeACK") == 1
    assert text.count("fix:") == 1 and text.count("why:") == 1
    assert "newest, flow: 198.18.1.1:40087 ->" in text and "and 82 more (-o json lists" in text


def test_the_markdown_report_has_one_row_per_group_and_a_bounded_instances_table(collision):
    md = render_markdown(repeated(collision, 88))
    rows = [line for line in md.splitlines() if line.startswith("| error |")]
    assert len(rows) == 1 and "| 88 |" in rows[0] and "challenge ACK to a SYN for 198.18.1.2:5002" in rows[0]
    assert "Instances (10 newest of 88" in md and "| 88 |" in md and "| 78 |" not in md
    assert md.count("`upstream_cx_destroy` +88") == 1


def test_json_keeps_every_instance_and_adds_the_groups(collision):
    doc = json.loads(render_json(repeated(collision, 88)))
    assert len(doc["findings"]) == 88
    (g,) = doc["groups"]
    assert g["count"] == 88 and g["instances"] == list(range(88)) and g["detector"] == "tuple-collision"
    assert g["variant"] == "challenge ACK to a SYN for 198.18.1.2:5002" == doc["findings"][0]["variant"]
    assert g["counters"] == COUNTERS and g["envoy_flags"] == ["UC", "UF", "URX"]
    assert g["first_ts"] < g["last_ts"] and g["rate_per_min"] == pytest.approx(30.0, abs=0.01)


def test_the_three_minute_recording_reads_as_one_problem_a_screenful_long():
    """The lab's 3-minute collision with its access log (tests/data/README.md): 90 findings, one group."""
    files = ["lab-collision3m-eth0.pcap", "lab-collision3m-lo.pcap", "lab-collision3m-access.log"]
    report = asyncio.run(analyze([CaptureArg.parse(str(DATA / f)) for f in files], Pipeline.with_detectors()))
    (g,) = group_findings(report.findings)
    assert g.count == 90 == len(report.findings) and g.newest.detector == "tuple-collision"
    text = render_text(report)
    assert text.splitlines()[1] == "verdict: 1 failure problem (1 error, 0 warnings): tuple-collision"
    body = text.split("\n\n", 1)[1].strip("\n")  # the group's block, after the headline, verdict, not-seen line
    assert rows(body) <= SCREENFUL, body
    assert text.count("fix:") == 1 and "seen 90 times in 2 min" in text and "and 84 more" in text
    assert len(json.loads(render_json(report))["groups"]) == 1


def test_a_time_no_clock_can_show_still_gives_every_report(collision):
    """A pcapng whose interface says its timestamps are seconds (if_tsresol=0) gives times near 1e18."""
    f = replace(collision.findings[0], ts=1e18)
    report = Report(collision.source, collision.stats, [f, replace(f, ts=1e18 + 5)])
    assert "1000000000000000000.000 s" in render_text(report) and "| 2 |" in render_markdown(report)
