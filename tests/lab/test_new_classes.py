"""The four failure classes a sidecar's Istio policy causes, with real Envoy 1.40 in the lab: a connectionPool's
circuit breaker (503 UO), every endpoint ejected (503 UH), no route (404 NR), and TLS on one side only (0 NR
filter_chain_not_found, 503 UF TLS_error). Each round's access-log line is asserted as Envoy wrote it, with the
counters that moved (/stats through the pod's admin port), /clusters' health flags for the ejection, and the
wire where it tells (no SYN for the overflowed request); then each of the class's fixes (lab/fixes.py LAB_FIXES),
applied as istiod renders it, serves the round with no failure flag in the log."""

from __future__ import annotations

from pathlib import Path

import pytest

from meshdoctor_lab.scenario_fixes import lab_fix
from kubectl_meshdoctor.envoy.access_log import parse_line
from meshdoctor_lab import lab
from meshdoctor_lab.applied_fixes import LAB_FIXES
from meshdoctor_lab.scenarios.pod_admin import admin
from meshdoctor_lab.scenarios.table import OUTLIER_AFTER, OUTLIER_CONSECUTIVE_5XX, OVERFLOW_SLOW
from meshdoctor_lab.state import LabState

from ..waiting import wait_until
from .test_lab_scenarios import _capture, _frames, _show
from .lab_names import lab_name

pytestmark = pytest.mark.lab

FAILING = ("overflow", "outlier", "no-route", "mtls-strict", "tls-to-plaintext")
CASES = [(scenario, fix.name) for scenario in FAILING for fix in LAB_FIXES[scenario]]
_SIDECAR = "127.0.0.6"
_FIN, _SYN, _RST, _ACK = 0x01, 0x02, 0x04, 0x10
_BODY = "upstream connect error or disconnect/reset before headers. reset reason: "
TLS_ERROR = "TLS_error:|268435703:SSL_routines:OPENSSL_internal:WRONG_VERSION_NUMBER:TLS_error_end"


def fixed_pod(scenario: str, fix: str) -> str:
    return f"{scenario}-{fix}"


@pytest.fixture(scope="module")
def policy_lab(tmp_path_factory) -> LabState:
    name = lab_name("n")
    pods = [*FAILING, *(f"{fixed_pod(s, f)}={s}" for s, f in CASES)]
    state = lab.up(name, tmp_path_factory.mktemp("lab") / name, pods, drivers=False, apiserver=False,
                   fixes={fixed_pod(s, f): lab_fix(s, f) for s, f in CASES})
    try:
        yield state
    finally:
        lab.down(state.state_dir)


def stats(state: LabState, pod: str) -> dict[str, int]:
    """The pod's Envoy counters and gauges (/stats), by name."""
    out = {}
    for line in admin(state.pod(pod).netns, "/stats").splitlines():
        name, _, value = line.rpartition(": ")
        if value.strip().isdigit():
            out[name] = int(value)
    return out


def moved(before: dict[str, int], after: dict[str, int], suffix: str) -> int:
    """How much the one stat ending in ``suffix`` moved (it must exist once)."""
    (name,) = [n for n in after if n.endswith(suffix)]
    return after[name] - before.get(name, 0)


class Round:
    """One round of a pod's scenario: its result, the access-log lines Envoy wrote for it (waited for), and the
    pod's stats before and after."""

    def __init__(self, state: LabState, pod: str, lines: int, tmp_path: Path | None = None) -> None:
        log = lab.access_log_path(state, pod)
        at = log.stat().st_size
        self.before = stats(state, pod)
        if tmp_path is None:
            self.result = lab.trigger_round(state, pod)
        else:
            with _capture(state.pod(pod), tmp_path) as pcaps:
                self.result = lab.trigger_round(state, pod)
            self.pcaps = pcaps

        def written() -> list[str]:
            with open(log, "rb") as f:
                f.seek(at)
                found = [x for x in f.read().decode("utf-8", "replace").splitlines() if x.startswith("[")]
            return found if len(found) >= lines else []
        self.lines = wait_until(f"{lines} access-log lines of {pod}", 10, written)
        self.after = stats(state, pod)

    def line(self, needle: str) -> str:
        (found,) = [x for x in self.lines if needle in x]
        return found


def test_overflow_is_answered_by_the_circuit_breaker_without_dialling(policy_lab, tmp_path):
    pod = policy_lab.pod("overflow")
    r = Round(policy_lab, "overflow", 3, tmp_path)
    slow = f"/slow/{OVERFLOW_SLOW}"
    assert sorted(r.result.http) == sorted([
        ("/overflow", 503, _BODY + "overflow"), (f"{slow} (holds the connection)", 200, ""),
        (f"{slow} (queued for the connection)", 200, "")]), r.result
    line = r.line("GET /overflow ")
    # UO, the overflow reset, an 81-byte local reply; no upstream host was picked, no connection made
    assert ' 503 UO upstream_reset_before_response_started{overflow} - "-" 0 81 ' in line, line
    assert f'"{pod.pod_ip}:5000" "-" inbound|5000|| - {pod.pod_ip}:5000 {pod.client_ip}:' in line, line
    assert moved(r.before, r.after, "inbound|5000||;.upstream_rq_pending_overflow") == 1
    assert moved(r.before, r.after, "inbound|5000||;.upstream_cx_overflow") >= 1  # the queued one wanted a second
    assert moved(r.before, r.after, "inbound|5000||;.upstream_cx_total") == 1
    lo = _frames(r.pcaps["lo"])
    syns = [f for f in lo if f.src == _SIDECAR and (f.dst, f.dport) == (pod.pod_ip, 5000)
            and f.flags & (_SYN | _ACK) == _SYN]
    assert len(syns) == 1, _show(lo)  # maxConnections 1: one connection, and none for the overflowed request
    assert not [f for f in lo if f.payload.startswith(b"GET /overflow ")], _show(lo)


def test_every_endpoint_ejected_leaves_no_healthy_upstream(policy_lab):
    pod = policy_lab.pod("outlier")
    r = Round(policy_lab, "outlier", OUTLIER_CONSECUTIVE_5XX + OUTLIER_AFTER)
    assert r.result.errors == (), r.result
    assert [s for _, s, _ in r.result.http] == [500] * OUTLIER_CONSECUTIVE_5XX + [503] * OUTLIER_AFTER
    cluster = f"outbound|5000||outlier.{policy_lab.namespace}.svc.cluster.local"
    burst = [x for x in r.lines if "GET /status/500 " in x]
    assert len(burst) == OUTLIER_CONSECUTIVE_5XX and all(" 500 - via_upstream - " in x for x in burst), burst
    for i in range(OUTLIER_AFTER):
        line = r.line(f"GET /after-burst/{i} ")
        assert ' 503 UH no_healthy_upstream - "-" 0 19 ' in line, line
        assert f'"{pod.pod_ip}:5000" "-" {cluster} - ' in line, line  # no host to send to
    # /clusters: the only host is ejected; the counters say by the consecutive-5xx detector, all of it enforced
    flags = [x for x in admin(pod.netns, "/clusters").splitlines() if x.startswith(f"{cluster}::{pod.pod_ip}:5000::")]
    assert f"{cluster}::{pod.pod_ip}:5000::health_flags::/failed_outlier_check" in flags, flags
    for stat in ("ejections_detected_consecutive_5xx", "ejections_enforced_consecutive_5xx",
                 "ejections_enforced_total"):
        assert moved(r.before, r.after, f"{cluster};.outlier_detection.{stat}") == 1, stat
    assert r.after[f"cluster.{cluster};.outlier_detection.ejections_active"] == 1
    assert moved(r.before, r.after, f"{cluster};.upstream_cx_none_healthy") == OUTLIER_AFTER


def test_a_path_outside_the_virtualservice_matches_no_route(policy_lab):
    pod = policy_lab.pod("no-route")
    r = Round(policy_lab, "no-route", 2)
    assert r.result.http == (("/v1/ok", 200, ""), ("/other", 404, "")), r.result
    line = r.line("GET /other ")
    assert ' 404 NR route_not_found - "-" 0 0 ' in line, line
    assert f'"{pod.pod_ip}:5000" "-" - - {pod.pod_ip}:5000 ' in line, line  # no cluster, no host
    assert " 200 - via_upstream " in r.line("GET /v1/ok ")
    assert moved(r.before, r.after, "inbound_0.0.0.0_5000;.no_route") == 1


def test_a_plaintext_caller_at_a_strict_port_finds_no_filter_chain(policy_lab, tmp_path):
    pod = policy_lab.pod("mtls-strict")
    r = Round(policy_lab, "mtls-strict", 2, tmp_path)
    assert [e.split(":")[0] for e in r.result.errors] == ["GET /plaintext"], r.result  # closed on it
    assert r.result.http == (("/mtls (mTLS)", 200, ""),), r.result  # the mesh caller is served
    line = r.line(" filter_chain_not_found ")
    # the listener's own log: no request was read, so no method, path or protocol; only the addresses
    assert line.split("] ", 1)[1].startswith('"- - -" 0 NR filter_chain_not_found - "-" 0 0 '), line
    assert f" - - {pod.pod_ip}:5000 {pod.client_ip}:" in line, line
    mtls = r.line("GET /mtls ")
    assert " 200 - via_upstream " in mtls
    assert f" outbound_.5000_._.mtls-strict.{policy_lab.namespace}.svc.cluster.local " in mtls  # the SNI
    assert moved(r.before, r.after, "listener.0.0.0.0_15006.no_filter_chain_match") == 1
    assert moved(r.before, r.after, "listener.0.0.0.0_15006.ssl.handshake") == 1
    # on eth0: the plaintext request, then the pod's RST (the tls_inspector only peeked at it: closed unread)
    eth0 = _frames(r.pcaps["eth0"])
    request = next(f for f in eth0 if f.payload.startswith(b"GET /plaintext "))
    back = [f for f in eth0 if f.number > request.number and f.is_((pod.pod_ip, 5000), (request.src, request.sport))]
    assert [f for f in back if f.flags & _RST] and not [f for f in back if f.payload or f.flags & _FIN], _show(eth0)


def test_mtls_to_a_plaintext_app_fails_its_tls_handshake(policy_lab, tmp_path):
    pod = policy_lab.pod("tls-to-plaintext")
    r = Round(policy_lab, "tls-to-plaintext", 1, tmp_path)
    assert r.result.http == (("/tls-origination", 503, _BODY + "remote connection failure"),), r.result
    cluster = f"outbound|5000||tls-to-plaintext.{policy_lab.namespace}.svc.cluster.local"
    line = r.line("GET /tls-origination ")
    assert (f' 503 UF upstream_reset_before_response_started{{remote_connection_failure|{TLS_ERROR}}} - '
            f'"{TLS_ERROR}" 0 98 ') in line, line
    assert f'"{pod.pod_ip}:5000" {cluster} - {pod.pod_ip}:5000 ' in line, line  # a host, no local address
    for stat in ("ssl.connection_error", "upstream_cx_connect_fail", "upstream_rq_pending_failure_eject"):
        assert moved(r.before, r.after, f"{cluster};.{stat}") == 1, stat
    # on lo: the sidecar's ClientHello (a TLS handshake record) answered by the app's plaintext 400
    lo = _frames(r.pcaps["lo"])
    hello = [f for f in lo if f.src == _SIDECAR and f.payload[:1] == b"\x16"]
    answer = [f for f in lo if (f.src, f.sport) == (pod.pod_ip, 5000) and f.payload.startswith(b"HTTP/1.1 400 ")]
    assert len(hello) == 1 and len(answer) == 1 and hello[0].number < answer[0].number, _show(lo)
    # ... and the sidecar gives up on it with a fatal protocol_version alert (70); the connection then ends, by
    # FIN and RST in whichever order the app's close and the alert cross
    sidecar = [f for f in lo if f.number > answer[0].number and (f.dst, f.dport) == (pod.pod_ip, 5000)]
    assert [f.payload for f in sidecar if f.payload] == [bytes.fromhex("15030100020246")], _show(lo)
    assert [f for f in lo if f.number > answer[0].number and f.flags & (_FIN | _RST)], _show(lo)


def _served(result) -> bool:
    """Every request of the round answered 200, but the app's own 500s (the outlier round's burst)."""
    return not result.errors and all(status == 200 for label, status, _ in result.http
                                     if not label.startswith("/status/500"))


@pytest.mark.parametrize(("scenario", "fix"), CASES)
def test_each_fix_serves_the_round_with_no_failure_flag(policy_lab, scenario, fix):
    pod = fixed_pod(scenario, fix)
    lines = {"overflow": 3, "outlier": OUTLIER_CONSECUTIVE_5XX + OUTLIER_AFTER, "no-route": 2,
             "mtls-strict": 2, "tls-to-plaintext": 1}[scenario]
    r = Round(policy_lab, pod, lines)
    assert _served(r.result) and r.result.http_ok > 0, r.result
    flagged = [x for x in r.lines if (entry := parse_line(x)) is not None and entry.flags]
    assert flagged == [], flagged
    if fix == "max-ejection-percent":  # the detector fired, but ejecting the only host would pass 50 %
        cluster = f"outbound|5000||{pod}.{policy_lab.namespace}.svc.cluster.local"
        assert moved(r.before, r.after, f"{cluster};.outlier_detection.ejections_overflow") == 1
    if fix == "min-health-percent":  # ejected, and routed to anyway: Envoy's panic mode
        cluster = f"outbound|5000||{pod}.{policy_lab.namespace}.svc.cluster.local"
        assert moved(r.before, r.after, f"{cluster};.lb_healthy_panic") >= OUTLIER_AFTER
