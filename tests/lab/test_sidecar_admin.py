"""The sidecar stand-in's Envoy admin API (lab/admin.py) and its Envoy-style application log.

Two halves:
- in-process, root-free: the admin server on an ephemeral loopback port over real HTTP, the /logging grammar
  against Envoy's verbatim bodies (tests/envoy/data/logging.txt, copied from the shared reference), the /clusters and /stats
  shapes, and the debug lines of the proxy path gated by logger levels;
- `lab`: a quiet lab with the stale-keepalive, refused and healthy-http pods. Rounds are triggered by hand, the
  admin API is read from inside the pod namespace (`ip netns exec`) and through the test API server's
  port-forward with the official client, and the counters must have moved as each scenario implies.
"""

from __future__ import annotations

import asyncio
import io
import json
import re
import subprocess
import sys
import urllib.error
import urllib.request
import uuid
from pathlib import Path
from typing import Iterator

import pytest

from kubectl_meshdoctor.lab import lab
from kubectl_meshdoctor.lab.admin import (
    ADMIN_PORT,
    AdminServer,
    PodInfo,
    change_log_levels,
    logging_response,
)
from kubectl_meshdoctor.lab.apps import HttpAppConfig
from kubectl_meshdoctor.lab.sidecar import (
    LOGGERS,
    EnvoyLog,
    InboundSidecar,
    SidecarStats,
    UpstreamConnector,
    istio_default_levels,
    parse_request_head,
)
from kubectl_meshdoctor.lab.state import LabState

from ..waiting import wait_until as _wait_until

# The reference sample, copied into the repository with its sources (tests/envoy/data/README.md).
REFERENCE = Path(__file__).resolve().parents[1] / "envoy" / "data" / "logging.txt"
GET_405 = "Method GET not allowed, POST required."
USAGE = (
    "usage: /logging?<name>=<level> (change single level)\n"
    "usage: /logging?paths=name1:level1,name2:level2,... (change multiple levels)\n"
    "usage: /logging?level=<level> (change all levels)\n"
    "levels: trace debug info warning error critical off \n"
)

from .local_servers import free_port, serve_app

# An application log line of the `connection` logger at debug, in Istio's and in Envoy's own log format.
CONNECTION_DEBUG = re.compile(r"^\S+Z\tdebug\tenvoy connection \S+\.cc:\d+\t.*\tthread=\d+$|"
                              r"^\[[^]]+\]\[\d+\]\[debug\]\[connection\] \[\S+\.cc:\d+\] ", re.M)
HOST_STATS = ("cx_active", "cx_connect_fail", "cx_total", "rq_active", "rq_error", "rq_success", "rq_timeout", "rq_total")




# ------------------------------------------------------------------------------------------ in process


def _reference_blocks() -> list[tuple[str, str, int, str]]:
    """(method, target, status, body) of every `=== ... ===` block of logging.txt."""
    text = REFERENCE.read_text()
    blocks = []
    for m in re.finditer(r"^=== (\S+) (/logging\S*) [^\n]*-> HTTP (\d+) ===\n(?:#[^\n]*\n)*--- body start ---\n(.*?)--- body end ---",
                         text, re.M | re.S):
        method, target, status, body = m.groups()
        blocks.append((method, target, int(status), body))
    return blocks


def test_logging_bodies_match_envoy_verbatim() -> None:
    blocks = _reference_blocks()
    assert len(blocks) == 9
    for method, target, status, body in blocks:
        if method == "GET":
            assert body == GET_405
            continue
        levels = istio_default_levels()
        query = target.partition("?")[2]
        params = [tuple(p.split("=", 1)) for p in query.split("&") if p]
        assert logging_response(levels, params) == (status, body), target  # type: ignore[arg-type]


def test_logging_grammar() -> None:
    levels = istio_default_levels()
    assert len(levels) == len(LOGGERS) == 61 and levels["misc"] == "error" and levels["http"] == "warning"
    change_log_levels(levels, [("connection", "debug")])
    change_log_levels(levels, [("paths", "http:trace, pool:info")])
    assert (levels["connection"], levels["http"], levels["pool"]) == ("debug", "trace", "info")
    change_log_levels(levels, [("level", ""), ("paths", "")])  # what the HTML page sends: a plain listing
    assert levels["connection"] == "debug"
    for params, error in (([("paths", "http")], "empty logger name or empty logger level"),
                          ([("paths", "http:debug,conn:debug")], "unknown logger name"),
                          ([("connection", "warn")], "unknown logger level"),
                          ([("http", "debug"), ("pool", "debug")], "invalid number of parameters")):
        before = dict(levels)
        status, body = logging_response(levels, params)
        assert status == 400 and body.startswith(f"error: {error}\n\n{USAGE}active loggers:\n"), params
        assert levels == before, "a rejected request changes nothing"
    change_log_levels(levels, [("level", "off")])
    assert set(levels.values()) == {"off"}


def _http(port: int, path: str, method: str = "GET") -> tuple[int, str, dict[str, str]]:
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", method=method)
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, resp.read().decode(), dict(resp.headers)
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode(), dict(exc.headers)


async def _get(sidecar: InboundSidecar, orig: tuple[str, int], path: str) -> bytes:
    request = parse_request_head(f"GET {path} HTTP/1.1\r\nHost: lab\r\n\r\n".encode())
    response, _ = await sidecar._proxy(request, b"", orig, "rid", close=False, cid=7, sid=42)
    return response


async def test_admin_endpoints_serve_live_counters_in_envoy_shapes() -> None:
    dead, live = free_port(), free_port()
    stats = SidecarStats()
    stats.declare("127.0.0.1", (dead, live), (dead, live))
    out = io.StringIO()
    log = EnvoyLog(out)
    sidecar = InboundSidecar(UpstreamConnector("127.0.0.1"), stats=stats, log=log)
    admin = AdminServer(stats, log, PodInfo("p", "ns", "127.0.0.1", (dead, live), (dead, live)), port=0)
    await admin.start()
    app = await serve_app(HttpAppConfig(bind="127.0.0.1", port=live))
    try:
        assert (await _get(sidecar, ("127.0.0.1", dead), "/")).startswith(b"HTTP/1.1 503 ")
        assert (await _get(sidecar, ("127.0.0.1", live), "/")).startswith(b"HTTP/1.1 200 ")

        def call(path: str, method: str = "GET") -> tuple[int, str, dict[str, str]]:
            return _http(admin.port, path, method)

        status, text, headers = await asyncio.to_thread(call, "/clusters")
        assert status == 200 and headers["Content-Type"].startswith("text/plain") and headers["Server"] == "envoy"
        lines = text.splitlines()
        assert f"inbound|{dead}||::127.0.0.1:{dead}::cx_connect_fail::1" in lines
        assert f"inbound|{live}||::127.0.0.1:{live}::rq_success::1" in lines
        assert f"inbound|{live}||::observability_name::inbound|{live}||;" in lines
        assert f"inbound|{live}||::default_priority::max_connections::4294967295" in lines
        assert "xds-grpc::./etc/istio/proxy/XDS::cx_active::1" in lines and "BlackHoleCluster::added_via_api::true" in lines
        assert all(len(line.split("::")) in (3, 4) for line in lines)

        status, text, headers = await asyncio.to_thread(call, "/clusters?format=json")
        assert status == 200 and headers["Content-Type"] == "application/json"
        doc = json.loads(text)
        by_name = {c["name"]: c for c in doc["cluster_statuses"]}
        (host,) = by_name[f"inbound|{dead}||"]["host_statuses"]
        assert host["address"] == {"socket_address": {"address": "127.0.0.1", "port_value": dead}}
        assert {"value": "1", "name": "cx_connect_fail"} in host["stats"]  # uint64 as a string
        assert {"name": "rq_success"} in host["stats"]  # zero values are left out
        assert {"type": "GAUGE", "name": "rq_active"} in host["stats"]
        assert "added_via_api" not in by_name["xds-grpc"]  # false is a default: omitted
        assert by_name["xds-grpc"]["host_statuses"][0]["address"] == {"pipe": {"path": "./etc/istio/proxy/XDS"}}

        status, text, _ = await asyncio.to_thread(call, f"/stats?filter=inbound%5C%7C{dead}&usedonly")
        values = dict(line.split(": ", 1) for line in text.splitlines())
        assert values[f"cluster.inbound|{dead}||;.upstream_cx_connect_fail"] == "1"
        assert values[f"cluster.inbound|{dead}||;.upstream_rq_503"] == "1"
        assert all(f"|{dead}" in k or f"_{dead}" in k for k in values)
        assert all(v != "0" for v in values.values())
        status, text, _ = await asyncio.to_thread(call, "/stats")
        names = [line.split(": ", 1)[0] for line in text.splitlines()]
        assert "server.live: 1" in text.splitlines()
        readouts = [n for n in names if n.endswith("version_text")]
        histograms = [line.split(": ")[0] for line in text.splitlines() if re.search(r": (No recorded values|P0\()", line)]
        plain = [n for n in names if n not in readouts and n not in histograms]
        assert names == readouts + plain + histograms and plain == sorted(plain) and readouts == sorted(readouts)
        assert (await asyncio.to_thread(call, "/stats?filter=(bad"))[:2] == (400, "Invalid re2 regex")
        status, text, _ = await asyncio.to_thread(call, "/stats?format=json&filter=server.live")
        assert json.loads(text) == {"stats": [{"name": "server.live", "value": 1}]}

        status, body, _ = await asyncio.to_thread(call, "/logging")
        assert (status, body) == (405, GET_405)
        status, body, _ = await asyncio.to_thread(call, "/reset_counters")
        assert (status, body) == (405, GET_405)
        status, body, _ = await asyncio.to_thread(call, "/logging?connection=debug", "POST")
        assert status == 200 and "\n  connection: debug\n" in body and log.levels["connection"] == "debug"
        assert (await asyncio.to_thread(call, "/ready"))[:2] == (200, "LIVE\n")
        status, body, _ = await asyncio.to_thread(call, "/server_info")
        info = json.loads(body)
        assert re.fullmatch(r"[0-9a-f]{40}/1\.33\.2/Clean/RELEASE/BoringSSL", info["version"])
        assert info["state"] == "LIVE" and info["command_line_options"]["log_level"] == "warning"
        status, body, _ = await asyncio.to_thread(call, "/certs")
        assert status == 404 and body.startswith("invalid path. admin commands are:\n  /: Admin home page\n")
        status, body, _ = await asyncio.to_thread(call, "/reset_counters", "POST")
        assert (status, body) == (200, "OK\n") and stats.cluster(f"inbound|{dead}||").upstream_cx_connect_fail == 0
    finally:
        app.cancel()
        await admin.stop()


async def test_debug_lines_follow_logger_levels() -> None:
    port = free_port()
    orig = ("127.0.0.1", port)
    out = io.StringIO()
    log = EnvoyLog(out)
    sidecar = InboundSidecar(UpstreamConnector("127.0.0.1"), log=log)
    await _get(sidecar, orig, "/")  # refused, at Istio's default levels: nothing
    assert out.getvalue() == ""
    change_log_levels(log.levels, [("connection", "debug")])
    await _get(sidecar, orig, "/")
    lines = out.getvalue().splitlines()
    assert lines and all(CONNECTION_DEBUG.match(line) for line in lines), lines
    assert any(line.endswith('[Tags: "ConnectionId":"2"] delayed connect error: 111\tthread=21') for line in lines)
    assert not any("\tenvoy router " in line for line in lines)
    change_log_levels(log.levels, [("paths", "router:debug,http:debug,pool:debug")])
    await _get(sidecar, orig, "/")
    text = out.getvalue()
    assert '[Tags: "ConnectionId":"7","StreamId":"42"] upstream reset: reset reason: remote connection failure, ' \
           "transport failure reason: delayed connect error: Connection refused\tthread=21" in text
    assert "Sending local reply with details upstream_reset_before_response_started{remote_connection_failure|" in text

    # Envoy's own default format and the pre-tags message prefix of older Envoy builds.
    old = io.StringIO()
    sidecar = InboundSidecar(UpstreamConnector("127.0.0.1"), envoy_style="2022",
                             log=EnvoyLog(old, log_format="envoy", style="2022", levels={"connection": "debug"}))
    await _get(sidecar, orig, "/")
    assert re.search(r"^\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3}\]\[21\]\[debug\]\[connection\] "
                     r"\[source/common/network/connection_impl\.cc:250\] \[C1\] closing socket: 0$", old.getvalue(), re.M)


# ------------------------------------------------------------------------------------------------ lab

PODS = ("stale-keepalive", "refused", "healthy-http")


@pytest.fixture(scope="module")
def admin_lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LabState, object]]:
    from kubernetes import client, config

    from tests.lab.test_lab_network import _require_lab_host

    _require_lab_host()
    name = f"mdtest-{uuid.uuid4().hex[:8]}"
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
    """A raw HTTP/1.1 request to the admin port through the test API server's pods/portforward."""
    from kubernetes.stream import portforward

    pf = portforward(api.connect_get_namespaced_pod_portforward, pod, state.namespace,  # type: ignore[attr-defined]
                     ports=str(ADMIN_PORT))
    try:
        sock = pf.socket(ADMIN_PORT)
        sock.settimeout(10)
        sock.sendall(f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{ADMIN_PORT}\r\nContent-Length: 0\r\n\r\n".encode())
        raw = b""
        while b"\r\n\r\n" not in raw:
            chunk = sock.recv(65536)
            assert chunk, f"port-forward closed before a response head: {raw!r}"
            raw += chunk
        head, _, body = raw.partition(b"\r\n\r\n")
        length = int(re.search(rb"(?im)^content-length:\s*(\d+)", head).group(1))  # type: ignore[union-attr]
        while len(body) < length:
            chunk = sock.recv(65536)
            assert chunk, "port-forward closed mid-body"
            body += chunk
        sock.close()
        return int(head.split(b" ", 2)[1]), body[:length].decode()
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
    return dict(line.split(": ", 1) for line in body.splitlines())


def _istio_proxy_log(api: object, state: LabState, pod: str) -> str:
    return api.read_namespaced_pod_log(pod, state.namespace, container="istio-proxy")  # type: ignore[attr-defined]


@pytest.mark.lab
def test_admin_listens_on_loopback_only(admin_lab: tuple[LabState, object]) -> None:
    state, _ = admin_lab
    for pod in PODS:
        out = subprocess.run(["ip", "netns", "exec", state.pod(pod).netns, "ss", "-Hltn", f"sport = :{ADMIN_PORT}"],
                             capture_output=True, text=True, check=True).stdout
        assert [line.split()[3] for line in out.splitlines()] == [f"127.0.0.1:{ADMIN_PORT}"]
        assert _in_pod(state, pod, "/ready") == (200, "LIVE\n")


@pytest.mark.lab
def test_refused_counts_a_connect_failure(admin_lab: tuple[LabState, object]) -> None:
    state, api = admin_lab
    pod_ip = state.pod("refused").pod_ip
    result = lab.trigger_round(state, "refused")
    assert result.statuses == (503,)
    status, text = _port_forward(api, state, "refused", "/clusters")
    host = _host_stats(text, f"{pod_ip}:5000")
    print(f"refused /clusters host {pod_ip}:5000: {host}")
    assert status == 200 and host["cx_connect_fail"] >= 1 and host["rq_success"] == 0
    status, text = _in_pod(state, "refused", "/stats?filter=upstream_cx_connect_fail|upstream_rq_5")
    stats = _stats(text)
    print(f"refused /stats: {stats}")
    assert int(stats["cluster.inbound|5000||;.upstream_cx_connect_fail"]) >= 1
    assert int(stats["cluster.inbound|5000||;.upstream_rq_503"]) >= 1
    doc = json.loads(_port_forward(api, state, "refused", "/clusters?format=json")[1])
    (inbound,) = [c for c in doc["cluster_statuses"] if c["name"] == "inbound|5000||"]
    (metric,) = [m for m in inbound["host_statuses"][0]["stats"] if m["name"] == "cx_connect_fail"]
    assert int(metric["value"]) >= 1


@pytest.mark.lab
def test_healthy_http_succeeds_without_failures(admin_lab: tuple[LabState, object]) -> None:
    state, api = admin_lab
    host = f"{state.pod('healthy-http').pod_ip}:5000"
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


@pytest.mark.lab
def test_logging_levels_over_port_forward_and_debug_lines_in_the_log(admin_lab: tuple[LabState, object]) -> None:
    state, api = admin_lab
    pod = "stale-keepalive"
    assert _port_forward(api, state, pod, "/logging") == (405, GET_405)
    status, body = _port_forward(api, state, pod, "/logging?level=bogus", "POST")
    assert status == 400 and body.startswith(f"error: unknown logger level\n\n{USAGE}active loggers:\n")

    # At Istio's default levels a stale-keepalive round writes access-log lines only.
    result = lab.trigger_round(state, pod)
    assert result.statuses == (200, 503)
    quiet = _wait_until("the UC access-log line", 10, lambda: (t := _istio_proxy_log(api, state, pod)) and " 503 UC " in t and t)
    assert not CONNECTION_DEBUG.search(quiet)

    status, body = _port_forward(api, state, pod, "/logging?connection=debug", "POST")
    assert status == 200 and "\n  connection: debug\n" in body
    status, body = _port_forward(api, state, pod, "/logging", "POST")
    assert status == 200 and "\n  connection: debug\n  conn_handler: warning\n" in body and "\n  misc: error\n" in body

    result = lab.trigger_round(state, pod)
    assert result.statuses == (200, 503)
    text = _wait_until("a second UC line", 10,
                       lambda: (t := _istio_proxy_log(api, state, pod)).count(" 503 UC ") >= 2 and t)
    new = text[len(quiet):]
    debug = [line for line in new.splitlines() if CONNECTION_DEBUG.match(line)]
    print("stale-keepalive istio-proxy log after connection=debug:\n" + new)
    assert any(line.endswith("closing socket: 0\tthread=21") for line in debug)
    assert not re.search(r"\tenvoy (router|http|pool) ", new)  # only the logger that was turned on
    # Debug and access-log lines interleave: the UC request's connection lines come before its access-log line.
    lines = new.splitlines()
    uc = next(i for i, line in enumerate(lines) if " 503 UC " in line)
    assert any(CONNECTION_DEBUG.match(line) for line in lines[:uc]) and any(CONNECTION_DEBUG.match(line) for line in lines[uc:])

    stats = _stats(_port_forward(api, state, pod, "/stats?filter=destroy_remote_with_active_rq")[1])
    assert int(stats["cluster.inbound|5000||;.upstream_cx_destroy_remote_with_active_rq"]) >= 2
    _port_forward(api, state, pod, "/logging?level=warning", "POST")
