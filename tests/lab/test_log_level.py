"""`log-level` against the lab's real Envoy through the test API server's port-forward."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from meshdoctor_lab import lab
from .lab_names import lab_name

pytestmark = pytest.mark.lab


@pytest.fixture(scope="module")
def lab_state(tmp_path_factory):
    name = lab_name("l")
    state = lab.up(name, tmp_path_factory.mktemp("lab") / name, ("healthy", "healthy-http"), drivers=False)
    try:
        yield state
    finally:
        lab.down(state.state_dir)


def log_level(state, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "kubectl_meshdoctor", "log-level", *args, "--kubeconfig",
                           str(state.kubeconfig)], capture_output=True, text=True, timeout=120)


def levels_of(state, pod: str) -> dict[str, str]:
    proc = log_level(state, f"pod/{pod}", "-o", "json")
    assert proc.returncode == 0, proc.stderr
    (proxy,) = json.loads(proc.stdout)["proxies"]
    return proxy["loggers"]


def test_set_a_logger_then_read_it_back_from_the_proxy(lab_state):
    assert levels_of(lab_state, "healthy")["connection"] == "warning"
    proc = log_level(lab_state, "pod/healthy", "--level", "connection:debug,http=trace")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[0].split() == ["POD", "LEVELS"]
    assert "connection: debug" in proc.stdout and "http: trace" in proc.stdout
    after = levels_of(lab_state, "healthy")
    assert after["connection"] == "debug" and after["http"] == "trace" and after["router"] == "warning"
    assert levels_of(lab_state, "healthy-http")["connection"] == "warning"  # only the named pod changed
    reset = log_level(lab_state, "pod/healthy", "-r")
    others = len(after) - 1  # every logger this Envoy build has, but misc
    assert others > 50
    assert reset.returncode == 0 and f"warning ({others} loggers); misc: error" in reset.stdout, reset.stdout
    assert levels_of(lab_state, "healthy")["connection"] == "warning"


def test_every_pod_of_a_selector(lab_state):
    proc = log_level(lab_state, "-l", "version=v1", "--level", "debug")
    assert proc.returncode == 0, proc.stderr
    assert "healthy " in proc.stdout and "healthy-http " in proc.stdout
    assert set(levels_of(lab_state, "healthy-http").values()) == {"debug"}
    assert log_level(lab_state, "-l", "version=v1", "-r").returncode == 0


@pytest.mark.parametrize("spec, needle", [
    ("loud", "unknown log level 'loud'"),
    ("conection:debug", "unknown logger 'conection'"),
])
def test_bad_level_or_logger_exits_2_naming_the_valid_ones_and_changes_nothing(lab_state, spec, needle):
    before = levels_of(lab_state, "healthy")
    proc = log_level(lab_state, "pod/healthy", "--level", spec)
    assert proc.returncode == 2
    (line,) = proc.stderr.strip().splitlines()
    assert needle in line
    assert "trace, debug, info, warning, error, critical, off" in line or "connection" in line
    assert levels_of(lab_state, "healthy") == before


def test_the_live_lab_proxy_parses_in_every_format(lab_state):
    """/clusters (text and JSON), /stats and /server_info of the lab's proxy, read through the port-forward."""
    from kubectl_meshdoctor.envoy.clusters import parse_clusters
    from kubectl_meshdoctor.envoy.server_info import envoy_version
    from kubectl_meshdoctor.envoy.stats import by_cluster, parse_stats
    from kubectl_meshdoctor.kube.admin import EnvoyAdmin
    from kubectl_meshdoctor.kube.client import KubeOptions, connect

    pod = lab_state.pod("healthy-http")
    lab.trigger_round(lab_state, "healthy-http")  # 200s through the sidecar: counters to read
    admin = EnvoyAdmin(connect(KubeOptions(kubeconfig=str(lab_state.kubeconfig))), lab_state.namespace, pod.name)
    try:
        text = parse_clusters(admin.get("/clusters").body)
        as_json = parse_clusters(admin.get("/clusters", {"format": "json"}).body)
        host = text["inbound|5000||"].host(f"{pod.pod_ip}:5000")
        assert host is not None and host.rq_success >= 20 and host.cx_connect_fail == 0 and host.healthy
        assert as_json["inbound|5000||"].host(f"{pod.pod_ip}:5000").rq_success == host.rq_success
        stats = by_cluster(parse_stats(admin.get("/stats").body))
        assert stats["inbound|5000||"]["upstream_rq_total"] >= 20
        assert envoy_version(json.loads(admin.get("/server_info").body)).count(".") == 2
        assert admin.get("/logging").status == 405  # Envoy refuses GET on a mutating endpoint
    finally:
        admin.close()


def test_lint_reads_the_lab_pods_through_the_api(lab_state):
    """`lint` on live Pod objects: both lab app ports share 15006 (a warning, exit 0), with the spec paths read."""
    proc = subprocess.run([sys.executable, "-m", "kubectl_meshdoctor", "lint", "-l", "version=v1", "--kubeconfig",
                           str(lab_state.kubeconfig), "-o", "json"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert sorted(report["source"]["pods"]) == sorted(f"{lab_state.namespace}/{p.name}" for p in lab_state.pods)
    exposure = {f["pod"]: f for f in report["findings"] if f["detector"] == "redirect-exposure"}
    assert set(exposure) == {p.name for p in lab_state.pods}
    f = exposure["healthy"]
    assert f["severity"] == "warning" and 'excludeInboundPorts: "5002"' in f["remediation"]
    assert any(e["what"].startswith("spec.initContainers[0].args = istio-iptables") for e in f["evidence"])
    assert [x for x in report["findings"] if x["severity"] == "error"] == []
    one = subprocess.run([sys.executable, "-m", "kubectl_meshdoctor", "lint", "pod/nope", "--kubeconfig",
                          str(lab_state.kubeconfig)], capture_output=True, text=True, timeout=60)
    assert one.returncode == 2 and 'pod "nope" not found' in one.stderr
