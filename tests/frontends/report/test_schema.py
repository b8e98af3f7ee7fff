"""The JSON report against docs/DESIGN.md's schema, field by field: every field the page lists for the report, its
source, stats, problems, findings, evidence and groups is there with the type the page gives it, for a report of a
lint (spec) finding, of a live run and of analyze. The schema is read from the page itself (its example and the
prose under it), so the page and the report cannot drift apart without this failing."""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path

import pytest
import yaml

from kubectl_meshdoctor.commands.analyze import analyze, analyze_pods
from kubectl_meshdoctor.core.envoy_debug_report import EnvoyDebugReport
from kubectl_meshdoctor.core.findings import COUNTER, PACKET, SPEC
from kubectl_meshdoctor.core.pipeline import Pipeline, PipelineStats
from kubectl_meshdoctor.core.report_model import (CaptureCounts, KernelSide, LintSource, LiveSource, LogLinesRead,
                                                  PodCapture, Report, SidecarSide)
from kubectl_meshdoctor.lint import lint_pods
from kubectl_meshdoctor.frontends.report import render_json
from kubectl_meshdoctor.sources.files import CaptureArg

ROOT = Path(__file__).resolve().parent.parents[2]
DATA = ROOT / "tests" / "data"
DESIGN = (ROOT / "docs" / "DESIGN.md").read_text()
NUMBER = (int, float)


def design_example() -> dict:
    """The report example of docs/DESIGN.md's "Report (`-o json`)" section."""
    section = DESIGN[DESIGN.index("## Report (`-o json`)"):]
    return json.loads(re.search(r"```json\n(.*?)```", section, re.S).group(1))


EXAMPLE = design_example()
# The page's prose: these finding fields are there "only when set", `stands_on` always; a group over pods has
# `pods` instead of `pod` and `server`; a problem has `cut_after_frame` for a capture cut short; `envoy` and
# `kernel` appear for live runs (and offline when Envoy's files were read).
FINDING_ONLY_WHEN_SET = {"pod", "details", "access_log", "envoy_log", "counters", "variant", "fixes"}
GROUP_ONLY_WHEN_SET = {"pod", "server", "pods", "counters"}
PROBLEM_ONLY_WHEN_SET = {"cut_after_frame"}
EVIDENCE_KINDS = {"packet", "access-log", "envoy-log", "counter", "spec"}
SOURCE_KINDS = {"pcap", "files", "live", "lint"}
# Per source kind, the fields the prose names (`files` only with --write-pcap, `per_pod` only for several pods).
SOURCE_FIELDS = {"pcap": {"files": list}, "files": {"files": list, "kinds": dict},
                 "live": {"pods": list, "namespace": str, "container": str, "interfaces": list, "captures": dict,
                          "capture_filter": str},
                 "lint": {"pods": list}}
# An analyze that names pods (the prose under `source.kind`): its pods, and each one's own source.
FILES_PODS_FIELDS = {"pods": list, "per_pod": list}
FILES_PER_POD_FIELDS = {"pod": str, "files": list, "interfaces": dict}
ENVOY_LOG_COUNTS = ("access_log_lines", "log_lines", "component_log_entries", "envoy_log_facts", "other_log_lines")


def type_of(example) -> tuple[type, ...]:
    if isinstance(example, bool):
        return (bool,)
    if isinstance(example, NUMBER):
        return NUMBER
    return (type(example),)


def check_fields(got: dict, example: dict, optional: set[str], where: str) -> list[str]:
    """Each field of ``example`` in ``got`` with the example's type (None allowed where the page shows null)."""
    out = []
    for key, value in example.items():
        if key not in got:
            if key not in optional:
                out.append(f"{where}.{key}: missing")
            continue
        if value is None or got[key] is None:
            continue
        if not isinstance(got[key], type_of(value)):
            out.append(f"{where}.{key}: {type(got[key]).__name__}, the page gives {type(value).__name__}")
    return out


def check_report(d: dict) -> list[str]:
    """Every difference between the JSON report ``d`` and the schema docs/DESIGN.md gives."""
    bad = check_fields(d, EXAMPLE, {"envoy", "kernel"}, "report")
    src = d["source"]
    if src["kind"] not in SOURCE_KINDS:
        bad.append(f"source.kind: {src['kind']}")
    else:
        bad += [f"source.{k}: missing or not {t.__name__}" for k, t in SOURCE_FIELDS[src["kind"]].items()
                if not isinstance(src.get(k), t)]
    if src["kind"] in ("pcap", "files") and ("pods" in src or "per_pod" in src):
        bad += [f"source.{k}: missing or not {t.__name__}" for k, t in FILES_PODS_FIELDS.items()
                if not isinstance(src.get(k), t)]
        for i, pod in enumerate(src.get("per_pod") or []):
            bad += [f"source.per_pod[{i}].{k}: missing or not {t.__name__}" for k, t in FILES_PER_POD_FIELDS.items()
                    if not isinstance(pod.get(k), t)]
            if pod.get("kind") not in ("pcap", "files") or (pod["kind"] == "files") != isinstance(pod.get("kinds"),
                                                                                                  dict):
                bad.append(f"source.per_pod[{i}].kind: {pod.get('kind')} (kinds: {pod.get('kinds')})")
        if [p.get("pod") for p in src.get("per_pod") or []] != src.get("pods"):
            bad.append("source.pods: not the per_pod entries' pods")
    bad += check_fields(d["stats"], EXAMPLE["stats"], set(), "stats")
    bad += [f"stats.interfaces.{k}" for k, v in d["stats"]["interfaces"].items() if not isinstance(v["packets"], int)]
    for i, p in enumerate(d["problems"]):
        bad += check_fields(p, EXAMPLE["problems"][0], PROBLEM_ONLY_WHEN_SET, f"problems[{i}]")
    if "kernel" in d:
        bad += [f"kernel.{k}" for k, v in d["kernel"].items() if not isinstance(v, int)]
    if "envoy" in d:
        sides = list(d["envoy"]["per_pod"].values()) if "per_pod" in d["envoy"] else [d["envoy"]]
        for side in sides:
            bad += [f"envoy.{k}: missing or not a count" for k in ENVOY_LOG_COUNTS if not isinstance(side.get(k), int)]
            if "counters_moved" in side:
                bad += check_fields(side, {"counters_moved": {}}, set(), "envoy")
    finding_example, evidence_example = EXAMPLE["findings"][0], EXAMPLE["findings"][0]["evidence"][0]
    for i, f in enumerate(d["findings"]):
        bad += check_fields(f, finding_example, FINDING_ONLY_WHEN_SET, f"findings[{i}]")
        if not isinstance(f.get("stands_on"), list):
            bad.append(f"findings[{i}].stands_on: missing")
        if "flow" in f:
            bad += check_fields(f["flow"], finding_example["flow"], set(), f"findings[{i}].flow")
        for j, e in enumerate(f["evidence"]):
            bad += check_fields(e, evidence_example, set(), f"findings[{i}].evidence[{j}]")
            if e.get("kind") not in EVIDENCE_KINDS:
                bad.append(f"findings[{i}].evidence[{j}].kind: {e.get('kind')}")
    for i, g in enumerate(d["groups"]):
        bad += check_fields(g, EXAMPLE["groups"][0], GROUP_ONLY_WHEN_SET, f"groups[{i}]")
        if not ("pods" in g or "server" in g):
            bad.append(f"groups[{i}]: neither pods nor server")
        bad += [f"groups[{i}].instances: {n}" for n in g["instances"] if not 0 <= n < len(d["findings"])]
    return bad


def test_the_schema_is_read_from_the_page():
    """The example holds every section and the fields of a finding the contract names."""
    assert {"tool", "version", "source", "stats", "problems", "findings", "groups"} <= set(EXAMPLE)
    assert {"detector", "severity", "title", "flow", "evidence", "envoy_flags", "ts"} <= set(EXAMPLE["findings"][0])
    assert {"source", "iface", "frame", "ts", "what"} <= set(EXAMPLE["findings"][0]["evidence"][0])


@pytest.fixture(scope="module")
def analyzed() -> dict:
    args = [CaptureArg.parse(str(DATA / n)) for n in ("lab-collision3m-lo.pcap", "lab-collision3m-eth0.pcap",
                                                      "lab-collision3m-access.log")]
    return json.loads(render_json(asyncio.run(analyze(args, Pipeline.with_detectors()))))


def test_an_analyze_report_follows_the_page(analyzed):
    assert check_report(analyzed) == []
    assert analyzed["source"]["kind"] == "files" and analyzed["findings"]
    assert any(e["kind"] == PACKET and e["frame"] > 0 for f in analyzed["findings"] for e in f["evidence"])


def test_an_analyze_report_of_envoy_dumps_follows_the_page():
    """/stats and /clusters dumps beside the log: counter evidence, whose frame is the page's 0."""
    d = asyncio.run(analyze([CaptureArg.parse(str(DATA / "envoy-1.40" / "outlier" / n))
                             for n in ("istio-proxy.log", "stats-after.txt", "clusters.txt")],
                            Pipeline.with_detectors()))
    out = json.loads(render_json(d))
    assert check_report(out) == []
    counters = [e for f in out["findings"] for e in f["evidence"] if e["kind"] == COUNTER]
    assert counters and all(e["frame"] == 0 for e in counters)
    assert {"clusters", "counters_moved", "counters_since"} <= set(out["envoy"])


def test_an_analyze_report_of_two_pods_follows_the_page(tmp_path):
    """analyze over pods (FILE:POD/IFACE here): `pods`, `per_pod` with each pod's files and interfaces, findings
    that name their pod, interfaces as `pod/iface`, each pod's Envoy side under `envoy.per_pod`."""
    args = [CaptureArg.parse(f"{DATA / a}:{pod}/{iface}") for a, pod, iface in (
        ("lab-collision-lo.pcap", "server", "lo"), ("lab-collision-eth0.pcap", "server", "eth0"),
        ("lab-framing-mixed-lo.pcap", "caller", "lo"))]
    args.append(CaptureArg.parse(f"{DATA / 'lab-framing-mixed-access.log'}:caller/"))
    report = asyncio.run(analyze_pods(args, lambda pod: Pipeline.with_detectors(pod=pod)))
    d = json.loads(render_json(report))
    assert check_report(d) == []
    assert d["source"]["pods"] == ["server", "caller"]
    assert d["source"]["per_pod"][0]["interfaces"] == {str(DATA / "lab-collision-lo.pcap"): "lo",
                                                       str(DATA / "lab-collision-eth0.pcap"): "eth0"}
    assert {f["pod"] for f in d["findings"]} == {"server", "caller"}
    assert set(d["stats"]["interfaces"]) == {"server/lo", "server/eth0", "caller/lo"}
    assert list(d["envoy"]["per_pod"]) == ["caller"]
    broken = {**d, "source": {**d["source"], "per_pod": [{"kind": "pcap", "files": []}]}}
    assert "source.per_pod[0].pod: missing or not str" in check_report(broken)  # the check itself can fail


def test_a_lint_report_follows_the_page():
    pods = [yaml.safe_load((ROOT / "tests" / "lint" / "data" / f"{n}.yaml").read_text())
            for n in ("classic", "native-probe-port")]
    findings = lint_pods(pods)
    d = json.loads(render_json(Report(LintSource(("shop/classic", "shop/native")), PipelineStats(), findings)))
    assert check_report(d) == [] and d["source"] == {"kind": "lint", "pods": ["shop/classic", "shop/native"]}
    assert d["findings"] and all(f["flow"]["client"] == "-" and f["flow"]["iface"] == "" for f in d["findings"])
    assert all(e["kind"] == SPEC and e["frame"] == 0 for f in d["findings"] for e in f["evidence"])


def test_a_live_report_follows_the_page(analyzed):
    """A watch's report from the typed parts watch_pod builds (commands/watch/live.py): its source, the sidecar's
    and the kernel's sides, with the findings of a recorded capture."""
    args = [CaptureArg.parse(str(DATA / n)) for n in ("lab-collision-lo.pcap", "lab-collision-eth0.pcap")]
    run = asyncio.run(analyze(args, Pipeline.with_detectors()))
    source = {"kind": "live", "pods": ["collision"], "namespace": "shop", "container": "meshdoctor-abc",
              "container_reused": False, "interfaces": ["lo", "eth0"],
              "captures": {"lo": {"captured": 16, "dropped_by_kernel": 0, "frames_read": 16, "bytes": 4096},
                           "eth0": {"captured": 21, "dropped_by_kernel": 0, "frames_read": 21, "bytes": 5120}},
              "capture_filter": "lean", "dissect": "local"}
    envoy = {"version": "1.40.0", "counters_moved": {"inbound|5002||": {"upstream_cx_connect_fail": 1}},
             "access_log_lines": 3, "log_lines": 9, "component_log_entries": 0, "envoy_log_facts": 0,
             "other_log_lines": 6, "debug": EnvoyDebugReport("collision", asked=True, wanted=("pool",))}
    capture = PodCapture("meshdoctor-abc", False, ("lo", "eth0"),
                         {"lo": CaptureCounts(16, 0, 16, 4096), "eth0": CaptureCounts(21, 0, 21, 5120)},
                         "lean", "local")
    sidecar = SidecarSide("1.40.0", {"inbound|5002||": {"upstream_cx_connect_fail": 1}}, LogLinesRead(3, 9, 0, 0, 6),
                          EnvoyDebugReport("collision", asked=True, wanted=("pool",)))
    report = Report(LiveSource(("collision",), "shop", capture), run.stats, run.findings, run.problems,
                    envoy=sidecar, kernel=KernelSide({"TcpExtTCPChallengeACK": 1}))
    d = json.loads(render_json(report))
    assert check_report(d) == []
    assert d["source"] == source  # the page's fields, each with the value the typed parts hold
    assert {k: v for k, v in d["envoy"].items() if k != "debug"} == {k: v for k, v in envoy.items()
                                                                       if k != "debug"}
    assert d["envoy"]["debug"]["pod"] == "collision" and d["kernel"] == {"TcpExtTCPChallengeACK": 1}


def test_a_field_the_page_lists_and_the_report_lacks_is_named():
    """The check itself can fail: a report without a finding's flow or an evidence's frame is caught."""
    d = {"tool": "kubectl-meshdoctor", "version": "0", "source": {"kind": "lint", "pods": []},
         "stats": EXAMPLE["stats"], "problems": [], "groups": [],
         "findings": [{**EXAMPLE["findings"][0], "stands_on": ["packets"]}]}
    del d["findings"][0]["flow"]
    d["findings"][0]["evidence"] = [{k: v for k, v in EXAMPLE["findings"][0]["evidence"][0].items() if k != "frame"}]
    bad = check_report(d)
    assert "findings[0].flow: missing" in bad and "findings[0].evidence[0].frame: missing" in bad
