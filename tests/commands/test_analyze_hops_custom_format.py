"""Both hops of a request joined when the sidecars write the mesh's own access-log format (--log-format): the join
uses the lines as the pipeline parsed them, not a re-reading in the default formats (core/hops.py)."""

from __future__ import annotations

from ..envoy.render import render_text
from .test_analyze_log_formats import analyze

# A user's own format: none of Istio's or Envoy's defaults, every field the hop join needs.
CUSTOM = ("%START_TIME(%s.%3f)% rid=%REQ(X-REQUEST-ID)% %RESPONSE_CODE% %RESPONSE_FLAGS% %RESPONSE_CODE_DETAILS% "
          "%DURATION% %UPSTREAM_CLUSTER% %UPSTREAM_HOST% %UPSTREAM_LOCAL_ADDRESS% %DOWNSTREAM_REMOTE_ADDRESS% "
          "%REQ(:METHOD)% %REQ(X-ENVOY-ORIGINAL-PATH?:PATH)%")
T0 = 1796305208.25
RID = "0f6d1e52-8c7a-9a3e-b7c4-2d5e8f1a6b90"


def _line(**entry) -> str:
    return render_text(CUSTOM, {"method": "GET", "path": "/orders", "protocol": "HTTP/1.1", "bytes_sent": 98,
                                "request_id": RID, **entry})


def test_a_custom_format_joins_both_hops_by_x_request_id(tmp_path):
    caller = _line(ts=T0, code=503, flags=(), details="via_upstream", duration_ms=3,
                   upstream_cluster="outbound|5000||orders.shop.svc.cluster.local", upstream_host="198.18.7.2:5000",
                   upstream_local="198.18.7.1:51234", downstream_remote="198.18.7.1:40100")
    server = _line(ts=T0 + 0.002, code=503, flags=("UF",),
                   details="upstream_reset_before_response_started{remote_connection_failure|delayed_connect_error:"
                           "_Connection_refused}", duration_ms=0, upstream_cluster="inbound|5000||",
                   upstream_host="198.18.7.2:5000", upstream_local="127.0.0.6:40001",
                   downstream_remote="198.18.7.1:51234")
    for pod, line in (("caller", caller), ("server", server)):
        (tmp_path / pod).mkdir()
        (tmp_path / pod / "istio-proxy.log").write_text(line + "\n")
    code, report, err = analyze(str(tmp_path / "caller"), str(tmp_path / "server"), "--log-format", CUSTOM)
    assert code == 1, err
    errors = [f for f in report["findings"] if f["severity"] == "error"]
    assert len(errors) == 1, [f["title"] for f in errors]
    (f,) = errors
    assert f["pod"] == "server" and set(f["access_log"]) == {caller, server}
    (hop,) = f["details"]["hops"]
    assert (hop["pod"], hop["role"], hop["request_id"]) == ("caller", "caller", RID)
