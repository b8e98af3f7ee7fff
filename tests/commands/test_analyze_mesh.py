"""Both hops of a real mesh (tests/data/envoy-1.40-mesh: the lab's caller sidecar talking Istio mTLS to the pod's
sidecar, real Envoy 1.40 at both; -retry503: with Istio < 1.24's default retry of a 503). `analyze` on the caller
pod's files alone, on the server pod's alone, and on both directories: each names what its side can show, and
together each failing request is one finding at the hop that failed, quoting both sidecars' lines, with nothing
invented (no `access-log` or `syn-timeout` finding)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kubectl_meshdoctor.envoy.access_log import parse_line

from ..helpers import analyze_json
from ..mesh_expected import EXPECTED, HOP_LEGS, NOT_YET_ALONE, NOT_YET_BOTH, invented

DATA = Path(__file__).resolve().parent.parent / "data"
CASES = sorted(EXPECTED)


def _params(not_yet: dict) -> list:
    return [pytest.param(c, id="/".join(c), marks=[pytest.mark.xfail(strict=True, reason=not_yet[c])]
                         if c in not_yet else []) for c in CASES]


BOTH_CASES = _params(NOT_YET_BOTH)
ALONE_CASES = _params(NOT_YET_ALONE)


def named(report: dict) -> set[tuple[str, str]]:
    return {(f["detector"], f["severity"]) for f in report["findings"] if f["severity"] in ("error", "warning")}


def _code(classes) -> int:
    return 1 if any(c[1] == "error" for c in classes) else 0


@pytest.mark.parametrize("case", ALONE_CASES)
def test_each_pod_alone_names_what_its_side_shows(case):
    caller, server, _ = EXPECTED[case]
    for side, want in (("caller", caller), ("server", server)):
        code, report = analyze_json(DATA.joinpath(*case, side))
        assert named(report) == want, (side, [f["title"] for f in report["findings"]])
        assert code == _code(want)


@pytest.mark.parametrize("case", BOTH_CASES)
def test_both_pods_make_one_finding_a_request_at_the_hop_that_failed(case):
    _, _, both = EXPECTED[case]
    root = DATA.joinpath(*case)
    code, report = analyze_json(root / "caller", root / "server")
    found = {(f["detector"], f["severity"], f["pod"]) for f in report["findings"]
             if f["severity"] in ("error", "warning")}
    assert found == both, [f["title"] for f in report["findings"]]
    assert code == _code(both)
    assert not {f["detector"] for f in report["findings"]} & invented(case)
    # every failing line of either sidecar is quoted, and each caller line by one finding (a UF line names no
    # connection of its own, so each refused connect's finding on lo may quote all of the round's UF lines)
    failing = {side: [line for line in (root / side / "istio-proxy.log").read_text().splitlines()
                      if (e := parse_line(line)) is not None
                      and (e.code >= 500 or {"DC", "DPE", "UC"} & set(e.flags))]
               if (root / side / "istio-proxy.log").exists() else []  # a pod without a sidecar: captures only
               for side in ("caller", "server")}
    quoted = [line for f in report["findings"] for line in f.get("access_log", ())]
    assert set(failing["caller"] + failing["server"]) <= set(quoted)
    assert all(quoted.count(line) == 1 for line in failing["caller"])


@pytest.mark.parametrize("case", [pytest.param(c, id="/".join(c)) for c in CASES if not any(EXPECTED[c])])
def test_a_healthy_recording_holds_a_round_that_ran(case):
    """The healthy cases' empty expectations mean something: their round ran, and each request was answered 200 at
    each hop, once (no failure a retry hid)."""
    root = DATA.joinpath(*case)
    result = json.loads((root / "round.json").read_text())
    assert not result["errors"] and result["http_ok"] and {status for _, status, _ in result["http"]} <= {200}
    for side in ("caller", "server"):
        entries = [e for e in map(parse_line, (root / side / "istio-proxy.log").read_text().splitlines()) if e]
        assert sum(e.code == 200 for e in entries) == result["http_ok"], side


def test_a_joined_finding_says_what_the_other_sidecar_logged():
    root = DATA / "envoy-1.40-mesh" / "refused"
    _, report = analyze_json(root / "caller", root / "server")
    (f,) = [f for f in report["findings"] if f["severity"] == "error"]
    (hop,) = f["details"]["hops"]
    assert (hop["pod"], hop["role"], hop["logged"]) == ("caller", "caller", "503 - via_upstream")
    assert hop["cluster"].startswith("outbound|5000||refused.")
    assert "pod caller's sidecar" in f["explanation"] and len(f["access_log"]) == 2


@pytest.mark.parametrize("case", [c for c in CASES if c[1] in HOP_LEGS], ids="/".join)
def test_each_finding_names_its_leg_of_the_path(case):
    """Every error and warning of both pods read together names its hop, as the table says; a joined finding
    names the other pod too."""
    root = DATA.joinpath(*case)
    dirs = [root / side for side in ("caller", "server") if (root / side / "istio-proxy.log").exists()]
    _, report = analyze_json(*dirs)
    for f in report["findings"]:
        if f["severity"] in ("error", "warning") and f["detector"] in HOP_LEGS[case[1]]:
            assert f["hop"]["leg"] in HOP_LEGS[case[1]][f["detector"]], (f["detector"], f["hop"])
            # the recordings' pods are named after their place; "" where the finding's evidence does not tell
            assert f["hop"]["role"] in ("", f["pod"])
            if f.get("details", {}).get("hops"):
                assert f["hop"]["also"] == sorted({h["pod"] for h in f["details"]["hops"]} - {f["pod"]})
