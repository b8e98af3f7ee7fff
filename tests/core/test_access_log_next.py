"""An access-log line no packet explains (core/correlate.py's own finding): what it says when no capture was read
at all, and, for a caller's line (an outbound cluster), which pod the capture it asks for is of: the upstream's,
found by %UPSTREAM_HOST%'s IP, not the pod that logged it."""

from __future__ import annotations

from pathlib import Path

from ..helpers import analyze_json

DATA = Path(__file__).resolve().parent.parent / "data"
# A caller sidecar's line in Istio's default access-log format (istio/istio, the mesh config's default
# accessLogFormat: ... %UPSTREAM_HOST% %UPSTREAM_CLUSTER% %UPSTREAM_LOCAL_ADDRESS% %DOWNSTREAM_LOCAL_ADDRESS%
# %DOWNSTREAM_REMOTE_ADDRESS% ...): its connect to the next pod failed and the retries were spent.
CALLER_UF = ('[2026-12-05T06:20:11.123Z] "GET /reviews/1 HTTP/1.1" 503 UF,URX '
             'upstream_reset_before_response_started{connection_failure} - "-" 0 91 2 - "-" "curl/8.5.0" '
             '"5f0c2a0e-1c1f-4d7e-9d55-1a2b3c4d5e6f" "reviews:9080" "10.244.1.17:9080" '
             'outbound|9080||reviews.shop.svc.cluster.local - 10.96.12.34:9080 10.244.2.8:51234 - default\n')
SERVER_UF = CALLER_UF.replace("outbound|9080||reviews.shop.svc.cluster.local", "inbound|9080||").replace(
    '"10.244.1.17:9080" inbound', '"127.0.0.1:9080" inbound')


def _only(report: dict) -> dict:
    (f,) = [f for f in report["findings"] if f["detector"] == "access-log"]
    return f


def test_a_caller_line_asks_for_the_upstream_pods_capture_by_its_ip_and_namespace(tmp_path):
    ticket = tmp_path / "ticket.txt"
    ticket.write_text(CALLER_UF)
    _, report = analyze_json(ticket)
    f = _only(report)
    assert "No capture was read with it" in f["explanation"]
    assert "on the upstream pod (10.244.1.17)" in f["remediation"]
    assert "kubectl get pods -A -o wide --field-selector status.podIP=10.244.1.17" in f["remediation"]
    assert "kubectl meshdoctor watch -n shop pod/<that pod>" in f["remediation"]


def test_a_server_line_asks_for_this_pods_capture(tmp_path):
    ticket = tmp_path / "ticket.txt"
    ticket.write_text(SERVER_UF)
    _, report = analyze_json(ticket)
    f = _only(report)
    assert f["remediation"].startswith("# What to capture next: capture lo")
    assert "status.podIP" not in f["remediation"] and "upstream pod" not in f["remediation"]


def test_with_a_capture_read_the_line_says_no_packet_of_it_explains_it(tmp_path):
    ticket = tmp_path / "ticket.txt"
    ticket.write_text(CALLER_UF)
    _, report = analyze_json(ticket, DATA / "lab-collision-eth0.pcap")
    f = _only(report)
    assert "No packet in the capture explains it" in f["explanation"]
    assert "No capture was read" not in f["explanation"]
