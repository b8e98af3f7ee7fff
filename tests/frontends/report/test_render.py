"""The report writers on a recorded lab capture: the JSON contract of DESIGN.md, and readable text and Markdown."""

import asyncio
import json
from pathlib import Path

import pytest

from kubectl_meshdoctor.commands.analyze import analyze
from kubectl_meshdoctor.core.pipeline import Pipeline
from kubectl_meshdoctor.frontends.report import render_json, render_markdown, render_text
from kubectl_meshdoctor.sources.files import CaptureArg

from ...helpers import prefiltered

DATA = Path(__file__).parent.parent.parent / "data"


@pytest.fixture(scope="module")
def report():
    args = [CaptureArg.parse(str(DATA / "lab-collision-eth0.pcap")), CaptureArg.parse(str(DATA / "lab-collision-lo.pcap"))]
    return asyncio.run(analyze(args, Pipeline.with_detectors()))


def test_json_follows_the_design_contract(report):
    d = json.loads(render_json(report))
    assert d["tool"] == "kubectl-meshdoctor" and d["source"]["kind"] == "pcap" and len(d["source"]["files"]) == 2
    assert d["stats"]["packets"] == prefiltered(DATA / "lab-collision-eth0.pcap", DATA / "lab-collision-lo.pcap") and d["stats"]["flows"] > 0 and d["stats"]["duration_s"] > 0
    (f,) = d["findings"]
    assert set(f) >= {"detector", "severity", "title", "envoy_flags", "flow", "evidence", "explanation",
                      "remediation", "response_code_details"}
    assert set(f["flow"]) == {"client", "server", "iface"}
    assert set(f["evidence"][0]) == {"source", "iface", "frame", "ts", "what", "src", "dst", "flags", "payload_len",
                                     "kind"}
    assert f["evidence"][0]["kind"] in ("packet", "access-log", "envoy-log", "counter", "spec")
    assert f["stands_on"] and set(f["stands_on"]) <= {"packets", "access-log", "envoy-log", "counters", "spec"}
    assert (f["evidence"][0]["flags"], f["evidence"][1]["flags"]) == ("S", ".")  # SYN, challenge ACK
    assert isinstance(f["evidence"][0]["frame"], int) and isinstance(f["evidence"][0]["ts"], float)
    assert report.exit_code() == 1


def test_text_and_markdown_name_the_frames_and_the_fix(report):
    text = render_text(report)
    assert "ERROR tuple-collision [UC,UF,URX]" in text and "frame 20: challenge ACK" in text
    md = render_markdown(report)
    assert "| error | `tuple-collision` | UC,UF,URX | 1 |" in md
    assert "| frame 20 | challenge ACK" in md and "```yaml" in md and "excludeInboundPorts" in md
    ladder = md.split("```text\n", 1)[1].split("```", 1)[0].splitlines()
    syn = next(line for line in ladder if "#19 SYN" in line)
    ack = next(line for line in ladder if "#20 challenge ACK" in line)
    assert "S :40811→:5002" in syn and syn.index("│") < syn.index("▶")  # client -> sidecar
    assert ". :5002→:40811" in ack and "◀" in ack and ack.index("◀") < ack.index(". :5002")  # sidecar -> client


def test_a_multi_line_evidence_value_stays_indented_under_its_line():
    """A YAML annotation quoted as evidence (hold-application's proxy.istio.io/config) printed flush left."""
    import yaml

    from kubectl_meshdoctor.core.pipeline import PipelineStats
    from kubectl_meshdoctor.lint import lint_pod
    from kubectl_meshdoctor.core.report_model import LintSource, Report

    pod = yaml.safe_load((Path(__file__).parent.parents[1] / "lint" / "data" / "classic.yaml").read_text())
    pod["metadata"]["annotations"]["proxy.istio.io/config"] = "proxyStatsMatcher:\n  inclusionPrefixes:\n  - x\n"
    report = Report(LintSource(("shop/p",)), PipelineStats(), lint_pod(pod))
    row = next(line for line in render_markdown(report).splitlines() if "proxyStatsMatcher:" in line)
    assert row.startswith("| ") and row.endswith(" |") and "<br>  inclusionPrefixes:<br>" in row  # one table row
    text = render_text(report)
    at = text.index("proxyStatsMatcher:")
    following = text[at:].splitlines()[1:3]
    assert following == [" " * 16 + "  inclusionPrefixes:", " " * 16 + "  - x"], following


@pytest.mark.parametrize("case, said", [("framing", "the run's, for all 4 problems that name it"),
                                         ("refused", "the run's)")])
def test_a_cluster_counter_several_problems_name_is_said_to_be_theirs_together(case, said):
    """Issue 32, item 6: each framing problem claimed the cluster's whole upstream_cx_protocol_error; the counter
    is the cluster's, so the report says how many problems share it (a counter of one problem stays its own)."""
    import subprocess
    import sys

    data = Path(__file__).resolve().parents[2] / "data" / "envoy-1.40" / case
    for output in ("text", "markdown"):
        out = subprocess.run([sys.executable, "-m", "kubectl_meshdoctor", "analyze", str(data), "-o", output],
                             capture_output=True, text=True, timeout=120).stdout
        counters = [line for line in out.splitlines() if "counter (" in line]
        assert counters and all(said in line for line in counters), counters


def test_a_live_streams_frames_read_show_beside_the_packets_analysed():
    """A new-user trial: a mesh watch said `refused-caller/lo 402, refused/lo 134`, no eth0 at all, though each
    eth0 capture held 67 frames (the pure ACKs of a pooled mTLS connection, which the lean prefilter skips). The
    headline now names every stream read, with what was read when fewer were analysed."""
    from kubectl_meshdoctor.core.pipeline import IfaceStats, PipelineStats
    from kubectl_meshdoctor.core.report_model import CaptureCounts, LiveSource, PodCapture, Report

    stats = PipelineStats(packets=402, by_iface={"lo": IfaceStats(402, 1.0, 9.0)}, frames_read={"lo": 402,
                                                                                                 "eth0": 67})
    capture = PodCapture("meshdoctor-abc", False, ("lo", "eth0"),
                         {"lo": CaptureCounts(402, 0, 402, 4096), "eth0": CaptureCounts(67, 0, 67, 5120)},
                         "lean", "local")
    head = render_text(Report(LiveSource(("refused",), "shop", capture), stats, [])).splitlines()[0]
    assert "packets analysed (eth0 0 (of 67 read), lo 402)" in head, head
