"""Both hops of a real mesh (tests/data/envoy-1.40-mesh: the lab's caller sidecar talking Istio mTLS to the pod's
sidecar, real Envoy 1.40 at both; -retry503: with Istio < 1.24's default retry of a 503). `analyze` on the caller
pod's files alone, on the server pod's alone, and on both directories: each names what its side can show, and
together each failing request is one finding at the hop that failed, quoting both sidecars' lines, with nothing
invented (no `access-log` or `syn-timeout` finding)."""

from __future__ import annotations

from pathlib import Path

import pytest

from kubectl_meshdoctor.envoy.access_log import parse_line

from ..helpers import analyze_json

DATA = Path(__file__).resolve().parent.parent / "data"
NEXT = ("next-hop", "error")

# (recordings, scenario) -> what the caller's files name, what the server's name, and, read together, each
# (detector, severity, pod) of the findings.
EXPECTED = {
    ("envoy-1.40-mesh", "refused"): ({NEXT}, {("upstream-refused", "error")},
                                     {("upstream-refused", "error", "server")}),
    ("envoy-1.40-mesh", "framing"): ({NEXT}, {("http-framing", "error")}, {("http-framing", "error", "server")}),
    ("envoy-1.40-mesh", "stale-keepalive"): ({NEXT}, {("stale-keepalive", "error")},
                                             {("stale-keepalive", "error", "server")}),
    ("envoy-1.40-mesh", "goaway"): ({NEXT}, {("upstream-goaway", "error")}, {("upstream-goaway", "error", "server")}),
    # the caller's route timeout (504 UT) is the server's 0 DC; the caller's own clients giving up are DC at both
    ("envoy-1.40-mesh", "slow-app"): ({("upstream-timeout", "error"), ("downstream-disconnect", "warning")},
                                      {("downstream-disconnect", "warning")},
                                      {("upstream-timeout", "error", "caller"),
                                       ("downstream-disconnect", "warning", "caller")}),
    # the pod's sidecar closed an idle mTLS connection the caller's pool then reused: 503 UC at the caller; the
    # server's eth0 shows it too (close_notify, then RST with the request unread), and both captures of that one
    # connection are one finding, the caller's, which quotes its 503 UC
    ("envoy-1.40-mesh", "downstream-idle"): ({("stale-keepalive", "error")}, {("stale-keepalive", "error")},
                                             {("stale-keepalive", "error", "caller")}),
    # the caller's sidecar answers 426/403/400 itself: the server never sees those requests
    ("envoy-1.40-mesh", "http10"): ({("downstream-protocol-error", "error")}, set(),
                                    {("downstream-protocol-error", "error", "caller")}),
    # the DestinationRule and VirtualService are the caller's: it answers 503 UO, 503 UH, 404 NR itself, and the
    # pod's sidecar never sees those requests (its log holds only the requests that passed)
    ("envoy-1.40-mesh", "overflow"): ({("circuit-breaker-overflow", "error")}, set(),
                                      {("circuit-breaker-overflow", "error", "caller")}),
    ("envoy-1.40-mesh", "outlier"): ({("no-healthy-upstream", "error")}, set(),
                                     {("no-healthy-upstream", "error", "caller")}),
    ("envoy-1.40-mesh", "no-route"): ({("no-route", "warning")}, set(), {("no-route", "warning", "caller")}),
    # a caller told tls DISABLE at a STRICT pod: its plaintext connection reset unread (both ends' eth0 show it),
    # the caller's 503 UC for the request it had written, the pod's listener's NR filter_chain_not_found
    ("envoy-1.40-mesh", "mtls-strict"): ({("tls-mismatch", "error")}, {("tls-mismatch", "error")},
                                         {("tls-mismatch", "error", "server")}),
    # the caller's mTLS to a pod without a sidecar: 503 URX,UF TLS_error WRONG_VERSION_NUMBER; the pod has captures
    # only, and its eth0 shows each ClientHello answered in plaintext
    ("envoy-1.40-mesh", "tls-to-plaintext"): ({("tls-mismatch", "error")}, {("tls-mismatch", "error")},
                                              {("tls-mismatch", "error", "caller")}),
    # the pod's sidecar ran out of source ports to the app (EADDRNOTAVAIL, 503 UF); the caller relays its 503s
    ("envoy-1.40-mesh", "port-exhaustion"): ({NEXT}, {("source-port-exhaustion", "error")},
                                             {("source-port-exhaustion", "error", "server")}),
    ("envoy-1.40-mesh", "healthy-http"): (set(), set(), set()),
    ("envoy-1.40-mesh", "healthy"): (set(), set(), set()),
    ("envoy-1.40-mesh-retry503", "refused"): ({NEXT}, {("upstream-refused", "error")},
                                              {("upstream-refused", "error", "server")}),
    # the retry answered: the user saw 200, the server logged the UC; the caller's counters say retries hid it
    ("envoy-1.40-mesh-retry503", "stale-keepalive"): ({("next-hop", "warning")}, {("stale-keepalive", "error")},
                                                      {("stale-keepalive", "error", "server"),
                                                       ("next-hop", "warning", "caller")}),
}
CASES = sorted(EXPECTED)
# What the product does not yet do with a recording, read together (each a strict xfail: it fails today)
NOT_YET = {
    ("envoy-1.40-mesh", "outlier"): "no finding quotes the app's five 500s (logged at both hops) that made the "
                                    "caller eject its only endpoint: no-healthy-upstream quotes only its 503 UH lines",
}
NOT_YET.update({
    ("envoy-1.40-mesh", "mtls-strict"): "the caller's 503 UC is left as an unexplained access-log finding, not folded "
                                        "into the tls-mismatch of the connection the pod reset, and read together that "
                                        "connection is two tls-mismatch findings (one per end of the veth)",
})
NOT_YET.update({
    ("envoy-1.40-mesh", "tls-to-plaintext"): "read together, each of the three attempts' connections is a "
                                             "tls-mismatch in both pods' eth0 (neither quotes the caller's "
                                             "URX,UF line, which stays a finding of its own), not one finding",
})
NOT_YET_ALONE = {
    ("envoy-1.40-mesh", "mtls-strict"): "the caller's files alone: its 503 UC is an unexplained access-log finding "
                                        "beside the tls-mismatch its eth0 capture shows",
}


def _params(not_yet: dict) -> list:
    return [pytest.param(c, id="/".join(c), marks=[pytest.mark.xfail(strict=True, reason=not_yet[c])]
                         if c in not_yet else []) for c in CASES]


BOTH_CASES = _params(NOT_YET)
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
    assert not {f["detector"] for f in report["findings"]} & {"access-log", "syn-timeout"}
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


def test_a_joined_finding_says_what_the_other_sidecar_logged():
    root = DATA / "envoy-1.40-mesh" / "refused"
    _, report = analyze_json(root / "caller", root / "server")
    (f,) = [f for f in report["findings"] if f["severity"] == "error"]
    (hop,) = f["details"]["hops"]
    assert (hop["pod"], hop["role"], hop["logged"]) == ("caller", "caller", "503 - via_upstream")
    assert hop["cluster"].startswith("outbound|5000||refused.")
    assert "pod caller's sidecar" in f["explanation"] and len(f["access_log"]) == 2
