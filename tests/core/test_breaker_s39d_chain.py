"""Breaker s39d: issue 31's chain (gateway -> a -> b) where the failure is at the far end, b's app, and every
hop before it passes the answer on (`via_upstream`), as Envoy logs a relayed 5xx (Envoy docs,
configuration/http/http_conn_man/response_code_details: `via_upstream`)."""

from __future__ import annotations

from ..helpers import analyze_json
from .hop_lines import Pod, inbound, outbound

GATEWAY = Pod("gateway", "10.244.0.5", 8080, "gateway")
A = Pod("a", "10.244.1.23", 5000, "a")
B = Pod("b", "10.244.2.40", 8080, "b")
RID = "5d0c9a44-1e7b-4b1f-9a55-0c1f2e3d4b61"


def test_a_failure_at_the_chains_far_end_is_one_finding_quoting_every_hop(tmp_path):
    """b's sidecar cannot reach b's app (503 UF); a's sidecar passes it on (503 via_upstream), a's app answers its
    caller with it (a's inbound 503 via_upstream), the gateway passes that on. One finding, b's, quotes the four
    lines gateway, a, a, b (DESIGN.md: a caller's relayed 5xx goes into the finding of the hop that answered it,
    through any pod whose app passed the answer of its own call on)."""
    gateway = outbound(GATEWAY, A, 503, "-", RID, 0.0, 41000, duration_ms=10)
    a_in = inbound(GATEWAY, A, 503, "-", RID, 0.001, 41000, duration_ms=8)
    a_out = outbound(A, B, 503, "-", RID, 0.002, 52000, duration_ms=5)
    b_in = inbound(A, B, 503, "UF", RID, 0.003, 52000, duration_ms=1)
    chain = [gateway, a_in, a_out, b_in]
    for pod, logged in (("gateway", [gateway]), ("a", [a_in, a_out]), ("b", [b_in])):
        (tmp_path / pod).mkdir()
        (tmp_path / pod / "istio-proxy.log").write_text("".join(f"{line}\n" for line in logged))
    _, report = analyze_json(tmp_path / "gateway", tmp_path / "a", tmp_path / "b")
    quoting = [f for f in report["findings"] if set(f.get("access_log", ())) & set(chain)]
    assert [(f["detector"], f["pod"]) for f in quoting] == [("upstream-refused", "b")], [
        (f["detector"], f["pod"], f.get("access_log")) for f in quoting]
    assert quoting[0]["access_log"] == chain
