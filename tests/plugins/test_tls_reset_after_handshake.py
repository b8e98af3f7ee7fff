"""A reset on an mTLS connection whose handshake was done is no TLS handshake failure: real Envoy 1.40's debug log
of a caller sidecar whose upstream connection was reset by a conntrack-INVALID RST reads it through BoringSSL
as ``TLS_error:|33554536:system library:OPENSSL_internal:Connection reset by peer``, after ``pool ready`` and
``Attached upstream connection``, and logs the request 503 UC {connection_termination}: a termination, not the
503 UF {remote_connection_failure|TLS_error...} of a handshake that failed (plugins/tls_mismatch.py kind_of)."""

from __future__ import annotations

from pathlib import Path

from ..helpers import analyze_json

CALLER = Path(__file__).resolve().parent.parent / "data" / "envoy-1.40-mesh" / "conntrack-invalid" / "caller"


def test_the_callers_log_of_a_reset_after_the_handshake_is_no_tls_mismatch():
    _, report = analyze_json(CALLER / "istio-proxy.log")
    assert "Connection reset by peer" in (CALLER / "istio-proxy.log").read_text()  # the real log's TLS error
    detectors = {f["detector"] for f in report["findings"]}
    assert "tls-mismatch" not in detectors, detectors
    (f,) = [f for f in report["findings"] if f["severity"] == "error"]
    assert "UC" in f["envoy_flags"] and "UF" not in f["envoy_flags"]  # as Envoy logged it
