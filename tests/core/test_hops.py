"""Both hops of one request (core/hops.py): the caller's sidecar passing on the server sidecar's failure is folded
into the server-side finding, joined by x-request-id or the hop's four-tuple; anything else stays apart. The lines
are Istio's TEXT format (envoy/istio_formats.py) as the two sidecars of a mesh write them."""

from __future__ import annotations

import pytest

from kubectl_meshdoctor.core.findings import Finding, NoFlow, Severity
from kubectl_meshdoctor.core.hops import join_hops
from kubectl_meshdoctor.envoy.istio_formats import TEXT_FORMATS

from ..envoy.render import render_text
from ..helpers import analyze_json

T0 = 1764770498.768
CALLER_SOURCE = "10.244.2.5:51234"  # the caller sidecar's side of the mTLS connection to the server pod


def caller_line(code: int, flags: tuple[str, ...], details: str, request_id: str | None, dt: float = 0.0) -> str:
    return render_text(TEXT_FORMATS[0].format, {
        "ts": T0 + dt, "method": "GET", "path": "/orders", "protocol": "HTTP/1.1", "code": code, "flags": flags,
        "details": details, "bytes_sent": 98, "duration_ms": 3, "request_id": request_id,
        "upstream_host": "10.244.1.23:5000", "upstream_cluster": "outbound|5000||orders.shop.svc.cluster.local",
        "upstream_local": CALLER_SOURCE, "downstream_local": "10.96.14.2:5000",
        "downstream_remote": "10.244.2.5:40100"})


def server_refused(request_id: str | None, remote: str = CALLER_SOURCE, dt: float = 0.002) -> str:
    return render_text(TEXT_FORMATS[0].format, {
        "ts": T0 + dt, "method": "GET", "path": "/orders", "protocol": "HTTP/1.1", "code": 503, "flags": ("UF",),
        "details": "upstream_reset_before_response_started{remote_connection_failure|delayed_connect_error:"
                   "_Connection_refused}", "bytes_sent": 98, "duration_ms": 0, "request_id": request_id,
        "upstream_host": "10.244.1.23:5000", "upstream_cluster": "inbound|5000||",
        "downstream_local": "10.244.1.23:5000", "downstream_remote": remote})


def analyzed(tmp_path, caller: list[str], server: list[str]) -> list[dict]:
    (tmp_path / "caller.log").write_text("\n".join(caller) + "\n")
    (tmp_path / "server.log").write_text("\n".join(server) + "\n")
    rc, report = analyze_json(tmp_path / "caller.log", tmp_path / "server.log")
    assert rc == 1
    return [f for f in report["findings"] if f["severity"] == "error"]


@pytest.mark.parametrize("joined_by", ["x-request-id", "four-tuple"])
def test_the_callers_relayed_503_folds_into_the_server_sidecars_finding(tmp_path, joined_by):
    rid = "0f6d1e52-8c7a-9a3e-b7c4-2d5e8f1a6b90" if joined_by == "x-request-id" else None
    caller = caller_line(503, ("URX",), "via_upstream", rid)
    found = analyzed(tmp_path, [caller], [server_refused(rid)])
    assert [f["detector"] for f in found] == ["upstream-refused"]
    f = found[0]
    assert len(f["access_log"]) == 2 and caller in f["access_log"]
    assert f["details"]["hops"][0]["logged"] == "503 URX via_upstream"
    assert f["details"]["hops"][0]["cluster"] == "outbound|5000||orders.shop.svc.cluster.local"
    assert "passed on" in f["explanation"]


def test_another_request_stays_the_callers_own_finding(tmp_path):
    found = analyzed(tmp_path, [caller_line(503, ("URX",), "via_upstream", "aaaa")], [server_refused("bbbb")])
    assert sorted(f["detector"] for f in found) == ["next-hop", "upstream-refused"]
    assert all(len(f["access_log"]) == 1 for f in found)


def test_without_request_ids_another_connection_or_another_time_is_not_joined(tmp_path):
    found = analyzed(tmp_path, [caller_line(503, ("URX",), "via_upstream", None)],
                     [server_refused(None, remote="10.244.2.5:51999"), server_refused(None, dt=60.0)])
    assert sorted(f["detector"] for f in found) == ["next-hop", "upstream-refused", "upstream-refused"]


def test_a_failure_of_the_callers_own_is_not_folded(tmp_path):
    """The caller's sidecar failing its own hop (a reset on its pooled mTLS connection: 503 UC) is its finding,
    even for a request the server pod also logged."""
    rid = "0f6d1e52-8c7a-9a3e-b7c4-2d5e8f1a6b90"
    caller = caller_line(503, ("UC",), "upstream_reset_before_response_started{connection_termination}", rid)
    found = analyzed(tmp_path, [caller], [server_refused(rid)])
    assert len(found) == 2 and any(caller in f["access_log"] and len(f["access_log"]) == 1 for f in found)


def test_two_pods_directories_join_the_callers_line_to_the_servers_finding(tmp_path):
    """`analyze caller/ server/`: each pod runs through a pipeline of its own; the join spans them."""
    rid = "0f6d1e52-8c7a-9a3e-b7c4-2d5e8f1a6b90"
    (tmp_path / "frontend").mkdir()
    (tmp_path / "orders").mkdir()
    caller = caller_line(503, ("URX",), "via_upstream", rid)
    (tmp_path / "frontend" / "istio-proxy.log").write_text(caller + "\n")
    (tmp_path / "orders" / "istio-proxy.log").write_text(server_refused(rid) + "\n")
    rc, report = analyze_json(tmp_path / "frontend", tmp_path / "orders")
    found = [f for f in report["findings"] if f["severity"] == "error"]
    assert rc == 1 and [(f["detector"], f["pod"]) for f in found] == [("upstream-refused", "orders")]
    assert caller in found[0]["access_log"] and found[0]["details"]["hops"][0]["pod"] == "frontend"
    assert "pod frontend's sidecar" in found[0]["explanation"]



def test_requests_relayed_alike_are_told_once():
    """A server finding that explains two requests (one refused connection, logged twice), each passed on by the
    caller: both caller lines are joined, and what the caller logged is said once, not once per request."""
    rids = ("0f6d1e52-8c7a-9a3e-b7c4-2d5e8f1a6b90", "1a2b3c4d-8c7a-9a3e-b7c4-2d5e8f1a6b91")
    servers = tuple(server_refused(rid, dt=0.002 + i * 0.5) for i, rid in enumerate(rids))
    server = Finding("upstream-refused", Severity.ERROR, "refused", NoFlow("counter", "inbound|5000||"), (), envoy_flags=("UF",),
                     explanation="Refused.", pod="server", ts=T0, access_log=servers)
    callers = [Finding("next-hop", Severity.ERROR, "relayed", NoFlow("counter", "outbound|5000||orders"), (), explanation="Relayed.", pod="caller",
                       ts=T0 + i * 0.5, access_log=(caller_line(503, ("URX",), "via_upstream", rid, dt=i * 0.5),))
               for i, rid in enumerate(rids)]
    (joined,) = join_hops([server, *callers])
    assert [h["request_id"] for h in joined.details["hops"]] == list(rids)
    assert len(joined.access_log) == 4
    assert joined.explanation.count("which logged the same request as") == 1, joined.explanation
