"""The lab's test API server through the `kubernetes` client: the pod objects it serves, who it lets in (token,
SelfSubjectAccessReview, its CA) and that it ends every process it started (apiserver_lab.py starts it)."""

from __future__ import annotations

import json
from pathlib import Path

import psutil
import pytest
import urllib3
import yaml
from kubernetes import client, config
from kubernetes.stream import stream

from ..waiting import wait_until as _wait_until
from .apiserver_lab import (  # noqa: F401 (the fixtures are used by name)
    NAMESPACE,
    POD,
    Server,
    _add_ephemeral,
    _exec,
    _no_faults,
    _procs_in_netns,
    _start_server,
    _stop_server,
    _wait_running,
    netns_name,
    server,
)

pytestmark = pytest.mark.lab


# ------------------------------------------------------------------------------------------------ objects


def test_read_pod_has_the_istio_sidecar_shape(server: Server) -> None:
    pod = server.api.read_namespaced_pod(POD, NAMESPACE)
    assert pod.kind == "Pod" and pod.metadata.name == POD and pod.metadata.namespace == NAMESPACE
    assert pod.metadata.labels["app"] == POD and pod.metadata.labels["version"] == "v1"
    assert pod.metadata.annotations["kubectl.kubernetes.io/default-container"] == "app"
    assert json.loads(pod.metadata.annotations["sidecar.istio.io/status"])["containers"] == ["istio-proxy"]
    assert [c.name for c in pod.spec.containers] == ["app", "istio-proxy"]
    app, proxy = pod.spec.containers
    assert [(p.name, p.container_port) for p in app.ports] == [("http", 5000), ("tcp-echo", 5002)]
    assert proxy.image == "docker.io/istio/proxyv2:1.26.2"
    assert proxy.ports[0].container_port == 15090 and proxy.ports[0].name == "http-envoy-prom"
    assert proxy.readiness_probe.http_get.port == 15021
    init = pod.spec.init_containers[0]
    assert init.name == "istio-init" and init.args[init.args.index("-d") + 1] == "15090,15021,15020"
    assert pod.spec.node_name == "lab-node"
    assert pod.status.phase == "Running" and pod.status.pod_ip == "198.18.1.2" and pod.status.host_ip
    assert all(s.ready and s.state.running for s in pod.status.container_statuses)


def test_list_by_label_and_deployment(server: Server) -> None:
    assert [p.metadata.name for p in server.api.list_namespaced_pod(NAMESPACE, label_selector=f"app={POD}").items] \
        == [POD]
    assert server.api.list_namespaced_pod(NAMESPACE, label_selector="app=other").items == []
    assert server.api.list_namespaced_pod("elsewhere").items == []
    deploy = server.apps.read_namespaced_deployment(POD, NAMESPACE)
    assert deploy.spec.selector.match_labels == {"app": POD}
    selector = ",".join(f"{k}={v}" for k, v in deploy.spec.selector.match_labels.items())
    assert len(server.api.list_namespaced_pod(NAMESPACE, label_selector=selector).items) == 1


def test_missing_pod_is_404_with_real_status(server: Server) -> None:
    with pytest.raises(client.ApiException) as err:
        server.api.read_namespaced_pod("nope", NAMESPACE)
    assert err.value.status == 404
    body = json.loads(err.value.body)
    assert body["message"] == 'pods "nope" not found'
    assert body["reason"] == "NotFound" and body["details"] == {"name": "nope", "kind": "pods"}


def test_bad_token_is_401(server: Server, tmp_path: Path) -> None:
    kc = yaml.safe_load(server.kubeconfig.read_text())
    kc["users"][0]["user"]["token"] = "wrong"
    (tmp_path / "kc").write_text(yaml.safe_dump(kc))
    cfg = client.Configuration()
    config.load_kube_config(config_file=str(tmp_path / "kc"), client_configuration=cfg)
    with pytest.raises(client.ApiException) as err:
        client.CoreV1Api(client.ApiClient(cfg)).read_namespaced_pod(POD, NAMESPACE)
    assert err.value.status == 401
    assert json.loads(err.value.body)["reason"] == "Unauthorized"


def test_kubeconfig_shape(server: Server) -> None:
    kc = yaml.safe_load(server.kubeconfig.read_text())
    assert kc["current-context"] == "meshdoctor-lab"
    ctx = kc["contexts"][0]
    assert ctx["name"] == "meshdoctor-lab" and ctx["context"]["namespace"] == NAMESPACE
    # HTTPS by default, trusting the CA the server made for this run: kubectl sends no token over plain HTTP.
    assert kc["clusters"][0]["cluster"]["server"].startswith("https://127.0.0.1:")
    assert kc["clusters"][0]["cluster"]["certificate-authority-data"]
    assert kc["users"][0]["user"]["token"]
    assert server.kubeconfig.stat().st_mode & 0o077 == 0


def test_ssar_allows_and_denies(server: Server) -> None:
    def review(verb: str, sub: str) -> bool:
        body = client.V1SelfSubjectAccessReview(spec=client.V1SelfSubjectAccessReviewSpec(
            resource_attributes=client.V1ResourceAttributes(namespace=NAMESPACE, verb=verb, resource="pods",
                                                           subresource=sub)))
        return server.authz.create_self_subject_access_review(body).status.allowed

    assert review("create", "exec") and review("patch", "ephemeralcontainers")
    server.set_faults({"deny": [{"verb": "create", "resource": "pods", "subresource": "exec"}]})
    assert not review("create", "exec")
    assert review("patch", "ephemeralcontainers")
    with pytest.raises(client.ApiException) as err:  # the denial also applies to the request itself
        _exec(server, ["true"])
    assert err.value.status == 0 and "403" in err.value.reason


# ------------------------------------------------------------------------------------------------ tls


def test_the_ca_is_checked_and_no_tls_serves_plain_http(server: Server, netns_name: str, tmp_path: Path) -> None:
    # Another CA (the one a second server makes) must not verify this server: the client really checks.
    other = _start_server(tmp_path / "other", netns_name)
    try:
        kc = yaml.safe_load(server.kubeconfig.read_text())
        kc["clusters"][0]["cluster"]["certificate-authority-data"] = yaml.safe_load(
            other.kubeconfig.read_text())["clusters"][0]["cluster"]["certificate-authority-data"]
        (tmp_path / "kc").write_text(yaml.safe_dump(kc))
        cfg = client.Configuration()
        config.load_kube_config(config_file=str(tmp_path / "kc"), client_configuration=cfg)
        cfg.retries = 0
        with pytest.raises(urllib3.exceptions.MaxRetryError, match="CERTIFICATE_VERIFY_FAILED"):
            client.CoreV1Api(client.ApiClient(cfg)).read_namespaced_pod(POD, NAMESPACE)
    finally:
        assert _stop_server(other) == []
    plain = _start_server(tmp_path / "plain", netns_name, "--no-tls")
    try:
        kc = yaml.safe_load(plain.kubeconfig.read_text())
        assert kc["clusters"][0]["cluster"]["server"].startswith("http://127.0.0.1:")
        assert "certificate-authority-data" not in kc["clusters"][0]["cluster"]
        assert plain.api.read_namespaced_pod(POD, NAMESPACE).metadata.name == POD
        out = stream(plain.api.connect_get_namespaced_pod_exec, POD, NAMESPACE, command=["echo", "over-ws"],
                     container="app", stdin=False, stdout=True, stderr=True, tty=False)
        assert out == "over-ws\n"
    finally:
        assert _stop_server(plain) == []


# ------------------------------------------------------------------------------------------------ shutdown


def test_shutdown_ends_every_process_it_started(netns_name: str, tmp_path: Path) -> None:
    srv = _start_server(tmp_path, netns_name)
    try:
        _add_ephemeral(srv, "dbg-bye", ["sleep", "308"])
        _wait_running(srv, "dbg-bye")
        # An exec whose client stays connected and one whose client left: both must end with the server.
        live = _exec(srv, ["sleep", "309"])
        gone = _exec(srv, ["sh", "-c", "sleep 310 & sleep 311"])
        _wait_until("exec processes up", 5, lambda: _procs_in_netns(netns_name, ["sleep", "309"])
                    and _procs_in_netns(netns_name, ["sleep", "311"]))
        gone.close()
        started = [*_procs_in_netns(netns_name, ["sleep", "308"]), *_procs_in_netns(netns_name, ["sleep", "309"]),
                   *_procs_in_netns(netns_name, ["sleep", "310"]), *_procs_in_netns(netns_name, ["sleep", "311"])]
        assert len(started) == 4
    finally:
        left = _stop_server(srv)
    assert left == []
    assert not [p for p in started if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
    live.run_forever(timeout=5)
    assert not live.is_open()
