"""The lab renders a printed lint fix's annotations as Istio's injector would (lab/apiserver/injection.py), and
lint reads the result as it reads an injected pod."""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from meshdoctor_lab.apiserver.injection import inject
from kubectl_meshdoctor.lint import lint_pod

CLASSIC = yaml.safe_load((Path(__file__).parent.parent / "lint" / "data" / "classic.yaml").read_text())


def lab_like(annotations: dict) -> dict:
    """A classic pod with no hold and an unrewritten tcpSocket probe on a captured port."""
    pod = json.loads(json.dumps(CLASSIC))
    pod["metadata"]["annotations"] = annotations
    containers = pod["spec"]["containers"]
    proxy = next(c for c in containers if c["name"] == "istio-proxy")
    proxy.pop("lifecycle", None)
    proxy["env"] = [e for e in proxy["env"] if e["name"] != "ISTIO_KUBE_APP_PROBERS"]
    app = next(c for c in containers if c["name"] != "istio-proxy")
    app.pop("livenessProbe", None)
    app["readinessProbe"] = {"tcpSocket": {"port": 5000}, "periodSeconds": 5}
    pod["spec"]["containers"] = [app, proxy]
    return pod


def rules(pod: dict) -> set[str]:
    return {f.detector for f in lint_pod(pod)}


def test_without_the_annotations_the_pod_is_left_as_written():
    pod = lab_like({})
    assert inject(pod) is pod
    assert {"hold-application", "probe-not-rewritten"} <= rules(pod)


def test_hold_puts_the_proxy_first_with_pilot_agent_wait():
    pod = inject(lab_like({"proxy.istio.io/config": "holdApplicationUntilProxyStarts: true"}))
    first = pod["spec"]["containers"][0]
    assert first["name"] == "istio-proxy"
    assert first["lifecycle"]["postStart"]["exec"]["command"] == ["pilot-agent", "wait"]
    assert "hold-application" not in rules(pod)
    assert inject(lab_like({"proxy.istio.io/config": "holdApplicationUntilProxyStarts: false"}))["spec"][
        "containers"][0]["name"] != "istio-proxy"


def test_the_probe_rewrite_keeps_the_original_where_lint_reads_it():
    pod = inject(lab_like({"sidecar.istio.io/rewriteAppHTTPProbers": "true"}))
    app = pod["spec"]["containers"][0]
    assert app["readinessProbe"]["httpGet"] == {"path": f"/app-health/{app['name']}/readyz", "port": 15020,
                                                "scheme": "HTTP"}
    assert app["readinessProbe"]["periodSeconds"] == 5 and "tcpSocket" not in app["readinessProbe"]
    proxy = pod["spec"]["containers"][1]
    (probers,) = [json.loads(e["value"]) for e in proxy["env"] if e["name"] == "ISTIO_KUBE_APP_PROBERS"]
    assert probers == {f"/app-health/{app['name']}/readyz": {"tcpSocket": {"port": 5000}, "timeoutSeconds": 1}}
    assert "probe-not-rewritten" not in rules(pod) and "probe-port" not in rules(pod)


def test_the_rewrite_follows_istio_s_app_probe_go():
    """httpGet keeps its host and headers (HTTPS becomes HTTP), a named port is stored as its number, a name no
    port has is not stored, ParseBool's spellings count, the status port annotation moves the target."""
    pod = lab_like({"sidecar.istio.io/rewriteAppHTTPProbers": "True", "status.sidecar.istio.io/port": "15099"})
    app = pod["spec"]["containers"][0]
    named = app["ports"][0]
    app["readinessProbe"] = {"httpGet": {"path": "/ready", "port": named["name"], "scheme": "HTTPS",
                                         "host": "localhost", "httpHeaders": [{"name": "x", "value": "y"}]}}
    app["livenessProbe"] = {"tcpSocket": {"port": "no-such-port"}}
    app["lifecycle"] = {"preStop": {"httpGet": {"path": "/drain", "port": named["containerPort"]}}}
    out = inject(pod)["spec"]["containers"][0]
    assert out["readinessProbe"]["httpGet"] == {"path": f"/app-health/{app['name']}/readyz", "port": 15099,
                                                "scheme": "HTTP", "host": "localhost",
                                                "httpHeaders": [{"name": "x", "value": "y"}]}
    assert out["lifecycle"]["preStop"]["httpGet"]["path"] == f"/app-lifecycle/{app['name']}/prestopz"
    proxy = inject(pod)["spec"]["containers"][1]
    (probers,) = [json.loads(e["value"]) for e in proxy["env"] if e["name"] == "ISTIO_KUBE_APP_PROBERS"]
    assert probers[f"/app-health/{app['name']}/readyz"]["httpGet"]["port"] == named["containerPort"]
    assert f"/app-health/{app['name']}/livez" not in probers  # rewritten, but nothing to forward it to
    assert f"/app-lifecycle/{app['name']}/prestopz" in probers
    assert inject(lab_like({"sidecar.istio.io/rewriteAppHTTPProbers": "false"}))["spec"]["containers"][0][
        "readinessProbe"] == {"tcpSocket": {"port": 5000}, "periodSeconds": 5}
