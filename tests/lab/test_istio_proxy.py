"""The lab pod's istio-proxy is real Envoy: the process, its admin API on 127.0.0.1:15000 (read inside the pod and
through the test API server's port-forward), the counters each scenario really moves, and its log levels.

A quiet lab with the stale-keepalive, refused and healthy-http pods; rounds are triggered by hand.
"""

from __future__ import annotations

import http.client
import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Iterator

import psutil
import pytest
import yaml

from kubectl_meshdoctor.envoy.server_info import envoy_version
from meshdoctor_lab import lab
from meshdoctor_lab.bootstrap import (
    ADMIN_PORT,
    ISTIO_DEFAULT_STATS_PREFIXES,
    OUTBOUND_PORT,
    PROXY_STATS_PREFIXES,
)
from meshdoctor_lab.istio_proxy import ENVOY_VERSION, ISTIO_PROXY_UID, envoy_binary
from meshdoctor_lab.netns import INBOUND_CAPTURE_PORT
from meshdoctor_lab.state import LabState

from ..waiting import wait_until
from .lab_names import lab_name

pytestmark = pytest.mark.lab

PODS = ("stale-keepalive", "refused", "healthy-http")
GET_405 = "Method GET not allowed, POST required."
# A line of Envoy's own log (Istio's --log-format) from the `connection` logger at debug.
CONNECTION_DEBUG = re.compile(r"^\S+Z\tdebug\tenvoy connection \S+\.cc:\d+\t.*\tthread=\d+$", re.M)
HOST_STATS = ("cx_active", "cx_connect_fail", "cx_total", "rq_active", "rq_error", "rq_success", "rq_timeout",
              "rq_total")


@pytest.fixture(scope="module")
def proxy_lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LabState, object]]:
    from kubernetes import client, config

    from tests.lab.test_lab_network import _require_lab_host

    _require_lab_host()
    name = lab_name("p", 6)
    state_dir = tmp_path_factory.mktemp("lab") / name
    state = lab.up(name=name, state_dir=state_dir, pods=PODS, drivers=False)
    try:
        cfg = client.Configuration()
        config.load_kube_config(config_file=str(state.kubeconfig), client_configuration=cfg)
        yield state, client.CoreV1Api(client.ApiClient(cfg))
    finally:
        lab.down(state_dir)


def _in_pod(state: LabState, pod: str, path: str, method: str = "GET") -> tuple[int, str]:
    """An HTTP request to 127.0.0.1:15000 from inside the pod's network namespace (as a debug container)."""
    code = (
        "import sys, urllib.request, urllib.error\n"
        f"req = urllib.request.Request('http://127.0.0.1:{ADMIN_PORT}' + sys.argv[1], method=sys.argv[2])\n"
        "try:\n"
        "    r = urllib.request.urlopen(req, timeout=10); status, body = r.status, r.read()\n"
        "except urllib.error.HTTPError as e:\n"
        "    status, body = e.code, e.read()\n"
        "sys.stdout.write(str(status) + '\\n' + body.decode())\n"
    )
    out = subprocess.run(["ip", "netns", "exec", state.pod(pod).netns, sys.executable, "-c", code, path, method],
                         capture_output=True, text=True, timeout=30, check=True).stdout
    status, _, body = out.partition("\n")
    return int(status), body


def _port_forward(api: object, state: LabState, pod: str, path: str, method: str = "GET") -> tuple[int, str]:
    """An HTTP/1.1 request to the admin port through the test API server's pods/portforward (Envoy's admin
    answers chunked or with a length; http.client reads both)."""
    from kubernetes.stream import portforward

    pf = portforward(api.connect_get_namespaced_pod_portforward, pod, state.namespace,  # type: ignore[attr-defined]
                     ports=str(ADMIN_PORT))
    try:
        sock = pf.socket(ADMIN_PORT)
        sock.settimeout(10)
        sock.sendall(f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{ADMIN_PORT}\r\nContent-Length: 0\r\n"
                     f"Connection: close\r\n\r\n".encode())
        response = http.client.HTTPResponse(sock)
        response.begin()
        body = response.read().decode()
        sock.close()
        return response.status, body
    finally:
        pf.close()


def _host_stats(clusters_text: str, host: str) -> dict[str, int]:
    out = {}
    for line in clusters_text.splitlines():
        parts = line.split("::")
        if len(parts) == 4 and parts[0] == "inbound|5000||" and parts[1] == host and parts[2] in HOST_STATS:
            out[parts[2]] = int(parts[3])
    return out


def _stats(body: str) -> dict[str, str]:
    return dict(line.split(": ", 1) for line in body.splitlines() if ": " in line)


def _istio_proxy_log(api: object, state: LabState, pod: str) -> str:
    return api.read_namespaced_pod_log(pod, state.namespace, container="istio-proxy")  # type: ignore[attr-defined]


def test_the_sidecar_is_the_envoy_binary_as_uid_1337(proxy_lab) -> None:
    state, _ = proxy_lab
    for pod in PODS:
        proc = psutil.Process(state.pids[f"{pod}/sidecar"])
        assert Path(proc.exe()) == Path(envoy_binary()).resolve()
        assert proc.uids().effective == ISTIO_PROXY_UID and proc.gids().effective == ISTIO_PROXY_UID
        out = subprocess.run(["ip", "netns", "exec", state.pod(pod).netns, "ss", "-Hltnp"],
                             capture_output=True, text=True, check=True).stdout
        envoy_ports = {int(line.split()[3].rsplit(":", 1)[1])
                       for line in out.splitlines() if f"pid={proc.pid}," in line}
        assert envoy_ports == {ADMIN_PORT, INBOUND_CAPTURE_PORT, OUTBOUND_PORT}, out
        admin = [line.split()[3] for line in out.splitlines() if line.split()[3].endswith(f":{ADMIN_PORT}")]
        assert admin == [f"127.0.0.1:{ADMIN_PORT}"]  # loopback only, as in a real sidecar


def test_server_info_is_envoys(proxy_lab) -> None:
    state, api = proxy_lab
    status, body = _port_forward(api, state, "healthy-http", "/server_info")
    info = json.loads(body)
    assert status == 200 and envoy_version(info) == ENVOY_VERSION and info["state"] == "LIVE"
    options = info["command_line_options"]
    # pilot-agent's flags (istio/istio pkg/envoy/proxy.go), one worker, and a 100 ms access-log flush.
    assert (options["concurrency"], options["file_flush_interval"], options["drain_strategy"]) == (1, "0.100s",
                                                                                                   "Immediate")
    assert options["allow_unknown_static_fields"] and options["skip_deprecated_logs"]
    assert (options["log_level"], options["component_log_level"]) == ("warning", "misc:error")
    assert info["node"]["id"].startswith(f"sidecar~{state.pod('healthy-http').pod_ip}~healthy-http.")
    assert _in_pod(state, "healthy-http", "/ready") == (200, "LIVE\n")


def test_the_pod_object_says_which_stats_its_envoy_keeps(proxy_lab) -> None:
    """Istio keeps cluster stats only for pods that opt in (proxyStatsMatcher); the lab's Pods carry that
    annotation and their Envoy keeps exactly those prefixes besides Istio's own."""
    state, api = proxy_lab
    pod = api.read_namespaced_pod("refused", state.namespace)  # type: ignore[attr-defined]
    config = yaml.safe_load(pod.metadata.annotations["proxy.istio.io/config"])
    assert config["proxyStatsMatcher"]["inclusionPrefixes"] == list(PROXY_STATS_PREFIXES)
    names = [line.split(": ", 1)[0] for line in _in_pod(state, "refused", "/stats")[1].splitlines()]
    assert any(n.startswith("cluster.inbound|5000||;.") for n in names)
    assert all(n.startswith(PROXY_STATS_PREFIXES + ISTIO_DEFAULT_STATS_PREFIXES) for n in names), \
        [n for n in names if not n.startswith(PROXY_STATS_PREFIXES + ISTIO_DEFAULT_STATS_PREFIXES)][:5]


def test_refused_moves_the_connect_failure_counters(proxy_lab) -> None:
    state, api = proxy_lab
    pod_ip = state.pod("refused").pod_ip
    result = lab.trigger_round(state, "refused")
    assert result.statuses == (503,)
    status, text = _port_forward(api, state, "refused", "/clusters")
    host = _host_stats(text, f"{pod_ip}:5000")
    print(f"refused /clusters host {pod_ip}:5000: {host}")
    assert status == 200 and host["cx_connect_fail"] >= 1 and host["rq_success"] == 0
    stats = _stats(_in_pod(state, "refused", "/stats?filter=inbound.5000")[1])
    print(f"refused /stats: { {k: v for k, v in stats.items() if v not in ('0',)} }")
    assert int(stats["cluster.inbound|5000||;.upstream_cx_connect_fail"]) >= 1
    assert int(stats["cluster.inbound|5000||;.upstream_rq_pending_failure_eject"]) >= 1
    assert int(stats["cluster.inbound|5000||;.upstream_rq_503"]) >= 1
    doc = json.loads(_port_forward(api, state, "refused", "/clusters?format=json")[1])
    (inbound,) = [c for c in doc["cluster_statuses"] if c["name"] == "inbound|5000||"]
    (metric,) = [m for m in inbound["host_statuses"][0]["stats"] if m["name"] == "cx_connect_fail"]
    assert int(metric["value"]) >= 1


def test_healthy_http_moves_no_failure_counter(proxy_lab) -> None:
    state, api = proxy_lab
    host = f"{state.pod('healthy-http').pod_ip}:5000"
    lab.trigger_round(state, "healthy-http")  # the first round creates the ORIGINAL_DST host
    before = _host_stats(_port_forward(api, state, "healthy-http", "/clusters")[1], host)
    result = lab.trigger_round(state, "healthy-http")
    assert set(result.statuses) == {200}
    after = _host_stats(_port_forward(api, state, "healthy-http", "/clusters")[1], host)
    print(f"healthy-http /clusters host {host}: before {before} after {after}")
    assert after["rq_success"] - before["rq_success"] == len(result.statuses)
    assert after["rq_error"] == after["cx_connect_fail"] == 0
    stats = _stats(_in_pod(state, "healthy-http", "/stats?filter=inbound")[1])
    failures = {k: v for k, v in stats.items() if re.search(
        r"connect_fail|destroy_\w*with_active_rq|protocol_error|failure_eject|rq_5|rx_reset", k) and v != "0"}
    assert failures == {} and int(stats["cluster.inbound|5000||;.upstream_rq_2xx"]) >= len(result.statuses)


def test_log_levels_over_port_forward_and_debug_lines_in_the_container_log(proxy_lab) -> None:
    state, api = proxy_lab
    pod = "stale-keepalive"
    assert _port_forward(api, state, pod, "/logging") == (405, GET_405)
    status, body = _port_forward(api, state, pod, "/logging?level=bogus", "POST")
    assert status == 400 and "unknown logger level" in body and "active loggers:" in body

    # At Istio's default levels a stale-keepalive round writes access-log lines only.
    result = lab.trigger_round(state, pod)
    assert result.statuses == (200, 503)
    quiet = wait_until("the UC access-log line", 10,
                       lambda: (t := _istio_proxy_log(api, state, pod)) and " 503 UC " in t and t)
    assert not CONNECTION_DEBUG.search(quiet)

    status, body = _port_forward(api, state, pod, "/logging?connection=debug", "POST")
    assert status == 200 and "\n  connection: debug\n" in body
    status, body = _port_forward(api, state, pod, "/logging", "POST")
    assert status == 200 and "\n  connection: debug\n" in body and "\n  misc: error\n" in body
    try:
        result = lab.trigger_round(state, pod)
        assert result.statuses == (200, 503)
        text = wait_until("a second UC line", 10,
                          lambda: (t := _istio_proxy_log(api, state, pod)).count(" 503 UC ") >= 2 and t)
        new = text[len(quiet):]
        debug = [line for line in new.splitlines() if CONNECTION_DEBUG.match(line)]
        print("stale-keepalive istio-proxy log after connection=debug:\n" + new[:4000])
        assert debug, new
        assert not re.search(r"\tenvoy (router|http|pool) ", new)  # only the logger that was turned on
    finally:
        _port_forward(api, state, pod, "/logging?level=warning", "POST")
        _port_forward(api, state, pod, "/logging?misc=error", "POST")
    stats = _stats(_port_forward(api, state, pod, "/stats?filter=destroy_remote_with_active_rq")[1])
    assert int(stats["cluster.inbound|5000||;.upstream_cx_destroy_remote_with_active_rq"]) >= 2
