"""A /stats dump alone is evidence: one dump gives counts since Envoy started, two what moved between them.
Either names the classes its counters show and exits 1 when one is a failure; a healthy proxy's dump exits 0.
The dumps are real Envoy 1.40's, taken around one round of each lab scenario (tests/data/envoy-1.40/)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ..helpers import analyze_json
from ..plugins.test_classes_from_logs import CLASSES

DATA = Path(__file__).resolve().parent.parent / "data" / "envoy-1.40"

# scenario -> the (detector, severity) its counters show. A capture-only class (the collision, a SYN answered
# late) or one the pod's sidecar never sees fail (the caller's stale connection) moves no failure counter.
# The counters name what the logs do (tests/plugins/test_classes_from_logs.py), but for one: EADDRNOTAVAIL is a
# failed connect like any other to them (refused or unreachable, they say).
SHOWN = {**CLASSES, "port-exhaustion": {("upstream-refused", "error")}}


analyze = analyze_json


def shown(report: dict) -> set[tuple[str, str]]:
    return {(f["detector"], f["severity"]) for f in report["findings"] if f["severity"] != "info"}


@pytest.mark.parametrize("dumps", ["one", "two"])
@pytest.mark.parametrize("scenario", sorted(SHOWN))
def test_a_stats_dump_names_the_classes_its_counters_show(scenario, dumps):
    after = DATA / scenario / "stats-after.txt"
    paths = (after,) if dumps == "one" else (DATA / scenario / "stats-before.txt", after)
    code, report = analyze(*paths)
    assert shown(report) == SHOWN[scenario], json.dumps(report["findings"], indent=1)[:2000]
    assert code == (1 if any(sev == "error" for _, sev in SHOWN[scenario]) else 0)
    assert report["envoy"]["counters_since"] == ("Envoy's start" if dumps == "one" else "first dump")
    for f in report["findings"]:
        assert f["stands_on"] == ["counters"] and f["counters"]
        assert all(e["kind"] == "counter" for e in f["evidence"])
        assert ("since Envoy's start" if dumps == "one" else "between the first dump and the last") in f["title"]


ENVOY_DATA = Path(__file__).resolve().parent.parent / "envoy" / "data"


@pytest.mark.parametrize("sample", ["stats_sample.txt", "stats_sample_legacy.txt"])
def test_istio_requests_total_names_the_class_of_each_flag(sample, tmp_path):
    """Istio's standard metric is in its default stats inclusion list, where the cluster stats often are not: its
    response_flags label alone names the class (both namings Istio has used: istiocustom.* and reporter=.=)."""
    lines = [ln for ln in (ENVOY_DATA / sample).read_text().splitlines() if "istio_requests_total" in ln]
    assert lines
    dump = tmp_path / "stats.txt"
    dump.write_text("server.uptime: 3600\n" + "\n".join(lines) + "\n")
    code, report = analyze(dump)
    by_flag = {"UC": "stale-keepalive", "UF": "upstream-refused", "UT": "upstream-timeout", "UO":
               "circuit-breaker-overflow", "UH": "no-healthy-upstream", "UPE": "http-framing", "DC":
               "downstream-disconnect", "NR": "no-route", "DPE": "downstream-protocol-error", "UR": "upstream-goaway"}
    flags = {part.split("=.=")[-1] if "=.=" in part else part.split(".")[-1]
             for ln in lines for part in ln.split(";.;") if "response_flags" in part}
    flags |= {ln.split(".response_flags.")[1].split(".")[0] for ln in lines if ".response_flags." in ln}
    expected = {by_flag[f] for fl in flags for f in fl.split(",") if f in by_flag}
    assert expected and {f["detector"] for f in report["findings"]} == expected
    assert code == 1
    for f in report["findings"]:
        assert all("istio_requests_total{reporter=" in k for k in f["counters"])
        assert "1 h before the dump" in f["title"]


def test_two_dumps_are_read_in_the_order_of_their_uptime():
    """`analyze stats-*.txt`: the shell's glob puts stats-after before stats-before; server.uptime orders them."""
    before, after = DATA / "stale-keepalive" / "stats-before.txt", DATA / "stale-keepalive" / "stats-after.txt"
    code_a, given = analyze(before, after)
    code_b, globbed = analyze(after, before)
    assert (code_a, code_b) == (1, 1)
    assert [f["counters"] for f in globbed["findings"]] == [f["counters"] for f in given["findings"]]
    assert globbed["problems"] == []


def test_dumps_of_two_envoys_are_not_differenced(tmp_path):
    """A counter that went back between two dumps: another pod's Envoy, or this one restarted. The newest is
    read alone, since its start, and the report says why; no negative count reaches it."""
    refused = (DATA / "refused" / "stats-after.txt").read_text()
    other = tmp_path / "pod-a.txt"  # up longer, yet it counted fewer connections: not the same Envoy
    other.write_text(refused.replace("server.uptime: 20", "server.uptime: 920")
                     .replace("inbound|5000||;.upstream_cx_total: 1", "inbound|5000||;.upstream_cx_total: 0"))
    code, report = analyze(DATA / "refused" / "stats-after.txt", other)
    assert code == 1 and shown(report) == SHOWN["refused"]
    assert report["envoy"]["counters_since"] == "Envoy's start"
    (p,) = report["problems"]
    assert "went back" in p["what"] and "pod-a.txt is read" in p["what"]
    assert all(v >= 0 for c in report["envoy"]["counters_moved"].values() for v in c.values())


def test_two_dumps_of_one_uptime_are_read_in_the_order_their_counters_went():
    """server.uptime moves at a stats flush only: the mesh recording's caller dumps, a round apart, share it.
    Given after-then-before (a glob's order), they are still read as before-then-after, not as a restart."""
    root = DATA.parent / "envoy-1.40-mesh" / "framing" / "caller"
    _, report = analyze_json(root / "stats-after.txt", root / "stats-before.txt")
    assert not [p for p in report["problems"] if "went back" in p["what"]]
    moved = report["envoy"]["counters_moved"]["outbound|5000||framing.mesh31ev.svc.cluster.local"]
    assert moved["external.upstream_rq_502"] == 5
