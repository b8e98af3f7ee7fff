"""An app's own 5xx, passed on by its pod's sidecar (``500 - via_upstream`` on the inbound cluster): from the server
pod alone an info finding that says the app answered, not the mesh; with the caller's pod read too, the caller's
relayed 5xx and the server's line of the same request are one finding on the leg ``server sidecar -> app``. The
lines are Istio's TEXT format (envoy/istio_formats.py) as the two sidecars write them."""

from __future__ import annotations

import pytest

from ..core.hop_lines import Pod, inbound, outbound
from ..helpers import analyze_json

CALLER = Pod("frontend", "10.244.2.5", 8080, "frontend")
SERVER = Pod("orders", "10.244.1.23", 5000, "orders")
RID = "0f6d1e52-8c7a-9a3e-b7c4-2d5e8f1a6b90"


def pods(tmp_path, caller: list[str], server: list[str]):
    for pod, lines in (("frontend", caller), ("orders", server)):
        if lines:
            (tmp_path / pod).mkdir()
            (tmp_path / pod / "istio-proxy.log").write_text("\n".join(lines) + "\n")
    return [tmp_path / p for p, lines in (("frontend", caller), ("orders", server)) if lines]


@pytest.mark.parametrize("code", [500, 503])
def test_the_server_pod_alone_tells_the_apps_answer_and_no_mesh_failure(tmp_path, code):
    line = inbound(CALLER, SERVER, code, "-", RID, 0.001, 51234)
    ok = inbound(CALLER, SERVER, 200, "-", RID, 1.0, 51234)
    rc, report = analyze_json(*pods(tmp_path, [], [line, ok]))
    (f,) = report["findings"]
    assert (f["detector"], f["severity"], f["pod"]) == ("app-5xx", "info", "orders")
    assert rc == 0 and f["access_log"] == [line]
    assert "not a mesh failure" in f["title"] and "not a failure of the mesh" in f["explanation"]
    assert f["hop"]["leg"] == "server sidecar -> app" and f["hop"]["role"] == "server"
    assert RID in f["remediation"]


def test_the_callers_relayed_503_and_the_apps_answer_are_one_finding_at_the_app(tmp_path):
    caller = outbound(CALLER, SERVER, 503, "-", RID, 0.0, 51234)
    server = inbound(CALLER, SERVER, 503, "-", RID, 0.001, 51234)
    rc, report = analyze_json(*pods(tmp_path, [caller], [server]))
    (f,) = report["findings"]
    # the user's 503 stays the caller's error; the server's line says who answered it
    assert (f["detector"], f["severity"], f["pod"]) == ("next-hop", "error", "frontend") and rc == 1
    assert f["access_log"] == [caller, server]
    assert f["hop"]["leg"] == "server sidecar -> app" and f["hop"]["also"] == ["orders"]
    assert "its app answered 503" in f["explanation"]
    # the server pod's side was read: what is left is the app's log for the request, not "read that pod"
    assert "kubectl logs orders -c" in f["remediation"] and RID in f["remediation"]
    assert "read that pod's sidecar" not in f["remediation"] and "read the server pod" not in f["explanation"]


def test_a_relayed_500_and_the_apps_answer_are_the_apps_finding(tmp_path):
    """A relayed 500 is no next-hop failure: the server's app-5xx finding gains the caller's line."""
    caller = outbound(CALLER, SERVER, 500, "-", RID, 0.0, 51234)
    server = inbound(CALLER, SERVER, 500, "-", RID, 0.001, 51234)
    rc, report = analyze_json(*pods(tmp_path, [caller], [server]))
    (f,) = report["findings"]
    assert (f["detector"], f["severity"], f["pod"]) == ("app-5xx", "info", "orders") and rc == 0
    assert f["access_log"] == [caller, server]
    assert f["hop"]["leg"] == "server sidecar -> app" and f["hop"]["also"] == ["frontend"]


def test_the_sidecars_own_failure_is_not_the_apps(tmp_path):
    refused = inbound(CALLER, SERVER, 503, "UF", RID, 0.001, 51234)
    _, report = analyze_json(*pods(tmp_path, [], [refused]))
    assert "app-5xx" not in {f["detector"] for f in report["findings"]}
