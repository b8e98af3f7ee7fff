"""The lab renders a printed lint fix's annotations as Istio's injector would (lab/apiserver/injection.py), and
lint reads the result as it reads an injected pod."""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from kubectl_meshdoctor.lab.apiserver.injection import inject
from kubectl_meshdoctor.lint import lint_pod

CLASSIC = yaml.safe_load((Path(__file__).parent / "lint" / "data" / "classic.yaml").read_text())


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
