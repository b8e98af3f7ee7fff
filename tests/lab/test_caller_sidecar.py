"""Two hops of real Envoy: each pod called through a caller sidecar (`lab up --caller sidecar`) that speaks Istio
mTLS to the pod's sidecar, and what each hop logs for the same request (they share its x-request-id).

One quiet lab holds a pod per scenario with Istio >= 1.24's default retry policy (503 not retried); a second
holds refused and stale-keepalive with Istio < 1.24's (503 retried twice). Each test triggers one round and reads
the new access-log lines at both hops. What is asserted is what Envoy 1.40 did (docs/lab-envoy.md, "The caller
sidecar"). Needs root, iproute2, iptables, openssl, tcpdump and tshark.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from kubectl_meshdoctor.envoy.access_log import AccessLogEntry, parse_lines
from meshdoctor_lab import evidence, lab
from meshdoctor_lab.captures import Interface, capturing
from meshdoctor_lab.scenarios import RoundResult
from meshdoctor_lab.scenarios.pod_admin import host_flags, stat_sum
from meshdoctor_lab.scenarios.table import (
    CALLER_IDLE_REUSE_AFTER,
    ENVOY_DELAYED_CLOSE_TIMEOUT,
    OUTLIER_AFTER,
    OUTLIER_CONSECUTIVE_5XX,
    SLOW_ROUTE_TIMEOUT,
)
from meshdoctor_lab.state import LabState

from ..waiting import wait_until
from .lab_names import lab_name

pytestmark = pytest.mark.lab

PODS = ("stale-keepalive", "refused", "framing", "slow-app", "healthy-http", "goaway", "http10", "healthy",
        "no-sidecar", "downstream-idle", "overflow", "outlier", "no-route", "mtls-strict", "tls-to-plaintext",
        "port-exhaustion")
RETRIED_PODS = ("refused", "stale-keepalive")


def _up(tmp_path_factory, tag: str, pods: tuple[str, ...], retry_503: bool):
    name = lab_name(tag)
    state = lab.up(name, tmp_path_factory.mktemp("lab") / name, pods, drivers=False, apiserver=False,
                   mesh=lab.MeshOptions(caller="sidecar", caller_retry_503=retry_503))
    return state


@pytest.fixture(scope="module")
def mesh_lab(tmp_path_factory):
    state = _up(tmp_path_factory, "c", PODS, retry_503=False)
    try:
        yield state
    finally:
        lab.down(state.state_dir)


@pytest.fixture(scope="module")
def retry_lab(tmp_path_factory):
    state = _up(tmp_path_factory, "r", RETRIED_PODS, retry_503=True)
    try:
        yield state
    finally:
        lab.down(state.state_dir)


class Hops:
    """The access-log lines a round left at the caller's sidecar and at the pod's."""

    def __init__(self, state: LabState, pod: str) -> None:
        self.state, self.pod = state, pod
        self.paths = (lab.caller_log_path(state, pod), lab.access_log_path(state, pod))
        self.offsets = tuple(p.stat().st_size for p in self.paths)

    def _read(self, which: int) -> list[AccessLogEntry]:
        data = self.paths[which].read_bytes()[self.offsets[which]:]
        return parse_lines(data.decode("utf-8", "replace"))

    def wait(self, caller: int, server: int) -> tuple[list[AccessLogEntry], list[AccessLogEntry]]:
        """The new lines once the caller has ``caller`` and the server ``server`` of them (Envoy flushes its
        access log every 100 ms)."""
        wait_until(f"{caller} caller and {server} server access-log lines for {self.pod}", 15,
                   lambda: len(self._read(0)) >= caller and len(self._read(1)) >= server)
        return self._read(0), self._read(1)


def _round(state: LabState, pod: str) -> tuple[RoundResult, Hops]:
    hops = Hops(state, pod)
    return lab.trigger_round(state, pod), hops


def _short(entry: AccessLogEntry) -> str:
    return f"{entry.code} {','.join(entry.flags) or '-'} {entry.details}"


def _by_path(entries: list[AccessLogEntry], path: str) -> list[AccessLogEntry]:
    return [e for e in entries if e.path == path]


def _sni(state: LabState, pod: str) -> str:
    return f"outbound_.5000_._.{pod}.{state.namespace}.svc.cluster.local"


def _joined(caller: AccessLogEntry, server: list[AccessLogEntry]) -> list[AccessLogEntry]:
    """The server's lines for the caller's request: the same x-request-id."""
    return [s for s in server if s.request_id == caller.request_id]


def test_refused_is_uf_at_the_server_and_relayed_unretried_by_istio_1_24(mesh_lab):
    result, hops = _round(mesh_lab, "refused")
    assert result.statuses == (503,), result
    (caller,), server = hops.wait(1, 1)
    assert _short(caller) == "503 - via_upstream", caller.raw
    assert caller.upstream_cluster == f"outbound|5000||refused.{mesh_lab.namespace}.svc.cluster.local"
    (hop,) = _joined(caller, server)
    assert _short(hop) == ("503 UF upstream_reset_before_response_started{remote_connection_failure|"
                           "delayed_connect_error:_Connection_refused}"), hop.raw
    # one connection seen from both ends: the caller's upstream four-tuple is the server's downstream one
    assert caller.upstream_local == hop.downstream_remote and hop.requested_server_name == _sni(mesh_lab, "refused")
    print("caller:", caller.raw, "\nserver:", hop.raw)


def test_refused_is_retried_twice_under_istio_before_1_24_then_urx(retry_lab):
    result, hops = _round(retry_lab, "refused")
    assert result.statuses == (503,), result
    (caller,), server = hops.wait(1, 3)
    assert _short(caller) == "503 URX via_upstream", caller.raw
    attempts = _joined(caller, server)
    assert len(attempts) == 3, [a.raw for a in attempts]  # the first try and num_retries 2
    assert {_short(a).split(" ", 2)[1] for a in attempts} == {"UF"}
    print("caller:", caller.raw, *[f"\nserver: {a.raw}" for a in attempts])


def test_framing_is_upe_at_the_server_and_a_plain_502_at_the_caller(mesh_lab):
    result, hops = _round(mesh_lab, "framing")
    assert set(result.statuses) == {502} and len(result.statuses) >= 5, result
    callers, server = hops.wait(len(result.statuses), len(result.statuses))
    for caller in callers:
        assert _short(caller) == "502 - via_upstream", caller.raw
        (hop,) = _joined(caller, server)  # 502 is not retried
        assert _short(hop) == "502 UPE upstream_reset_before_response_started{protocol_error}", hop.raw
    print("caller:", callers[0].raw, "\nserver:", _joined(callers[0], server)[0].raw)


def test_stale_keepalive_is_uc_at_the_server_and_a_plain_503_at_the_caller(mesh_lab):
    result, hops = _round(mesh_lab, "stale-keepalive")
    assert result.statuses == (200, 503), result
    callers, server = hops.wait(2, 2)
    (caller,) = _by_path(callers, "/stale/2")
    assert _short(caller) == "503 - via_upstream", caller.raw
    (hop,) = _joined(caller, server)
    assert _short(hop) == "503 UC upstream_reset_before_response_started{connection_termination}", hop.raw
    print("caller:", caller.raw, "\nserver:", hop.raw)


def test_stale_keepalive_is_hidden_by_istio_before_1_24s_retry(retry_lab):
    """The user sees 200; only the server's log holds the UC, beside the retry's 200 with the same request id."""
    result, hops = _round(retry_lab, "stale-keepalive")
    assert result.statuses == (200, 200), result
    callers, server = hops.wait(2, 3)
    (caller,) = _by_path(callers, "/stale/2")
    assert _short(caller) == "200 - via_upstream", caller.raw
    attempts = _joined(caller, server)
    assert [_short(a) for a in attempts] == [
        "503 UC upstream_reset_before_response_started{connection_termination}", "200 - via_upstream"], attempts
    # the retry went out on another connection of the caller's pool
    assert attempts[0].downstream_remote != attempts[1].downstream_remote == caller.upstream_local
    print("caller:", caller.raw, *[f"\nserver: {a.raw}" for a in attempts])


def test_a_route_timeout_is_ut_at_the_caller_and_dc_at_the_server(mesh_lab):
    """The VirtualService timeout is on the caller's route now: the caller times out, resets its upstream
    stream, and the server sees its downstream go away. A caller that gives up is DC at both hops; one that
    half-closes is dropped by the caller's sidecar before it dials the pod."""
    result, hops = _round(mesh_lab, "slow-app")
    assert result.statuses[:2] == (200, 504), result
    callers, server = hops.wait(4, 3)
    (timed_out,) = _by_path(callers, "/slow/1.5")
    assert _short(timed_out) == "504 UT response_timeout", timed_out.raw
    (hop,) = _joined(timed_out, server)
    assert _short(hop) == "0 DC downstream_remote_disconnect", hop.raw
    # The caller's timer fires at the route's timeout as its event loop's clock tells it: Envoy logged 998 to
    # 1003 ms for 1000 at either hop (the log's DURATION is read from another clock), never much less.
    assert abs(timed_out.duration_ms - SLOW_ROUTE_TIMEOUT * 1000) < 50
    assert abs(hop.duration_ms - timed_out.duration_ms) < 100
    (in_time,) = _by_path(callers, "/slow/0.3")
    assert [_short(e) for e in [in_time, *_joined(in_time, server)]] == ["200 - via_upstream"] * 2
    # the caller that gave up: DC at both hops, on the service's route and its mTLS connection
    (abandoned,) = _by_path(callers, "/slow/0.7")
    assert _short(abandoned) == "0 DC downstream_remote_disconnect" and abandoned.route_name == "default"
    assert abandoned.upstream_cluster == f"outbound|5000||slow-app.{mesh_lab.namespace}.svc.cluster.local"
    (gone,) = _joined(abandoned, server)
    assert _short(gone) == "0 DC downstream_remote_disconnect" and gone.requested_server_name == _sni(mesh_lab,
                                                                                                       "slow-app")
    (half_closed,) = _by_path(callers, "/half-closed")
    assert _short(half_closed) == "0 DC downstream_remote_disconnect" and half_closed.upstream_local is None
    assert _joined(half_closed, server) == []  # Envoy dropped it before dialling
    print("caller:", timed_out.raw, "\nserver:", hop.raw)


def test_refused_h2_streams_are_ur_at_the_server_and_a_plain_503_at_the_caller(mesh_lab):
    """goaway's port speaks HTTP/2: the caller multiplexes every request on one h2 mTLS connection, the pod's
    sidecar relays them to the app, which refuses every third stream. The caller gets the pod's 503 response,
    not a refused stream, so its refused-stream retry does not apply."""
    result, hops = _round(mesh_lab, "goaway")
    refused = [i for i, status in enumerate(result.statuses) if status == 503]
    assert refused and set(result.statuses) == {200, 503}, result
    callers, server = hops.wait(len(result.statuses), len(result.statuses))
    assert {c.upstream_local for c in callers} == {callers[0].upstream_local}  # one connection to the pod
    for i in refused:
        (caller,) = _by_path(callers, f"/h2/{i}")
        assert _short(caller) == "503 - via_upstream", caller.raw
        (hop,) = _joined(caller, server)
        assert _short(hop) == "503 UR upstream_reset_before_response_started{remote_refused_stream_reset}", hop.raw
        assert hop.protocol == "HTTP/2" and caller.protocol == "HTTP/1.1"
    print("caller:", _by_path(callers, f"/h2/{refused[0]}")[0].raw, "\nserver:",
          _joined(_by_path(callers, f"/h2/{refused[0]}")[0], server)[0].raw)


def test_requests_the_caller_refuses_never_reach_the_pod(mesh_lab):
    """http10's HTTP/1.0 request and its header name with a space are refused by the caller's own codec (no
    method, path or request id logged), the Upgrade (a protocol no upgrade_configs names) by its HCM: only /ok
    reaches the pod."""
    result, hops = _round(mesh_lab, "http10")
    assert result.statuses == (426, 403, 400, 200), result
    callers, server = hops.wait(4, 1)
    assert [_short(c) for c in callers] == ["426 DPE low_version", "403 - upgrade_failed", "400 DPE http1.codec_error",
                                            "200 - via_upstream"], [c.raw for c in callers]
    assert callers[0].method is None and callers[0].request_id is None
    (ok,) = server
    assert ok.path == "/ok" and ok.request_id == callers[3].request_id
    print(*[f"caller: {c.raw}\n" for c in callers], "server:", ok.raw)


def _tls_hellos(pcap: Path, port: int = 5000) -> list[list[str]]:
    out = subprocess.run(["tshark", "-r", str(pcap), "-n", "-d", f"tcp.port=={port},tls", "-Y",
                          "tls.handshake.type == 1 || tls.handshake.type == 2", "-T", "fields",
                          "-e", "tls.handshake.type", "-e", "tls.handshake.extensions_server_name",
                          "-e", "tls.handshake.extensions_alpn_str", "-e", "tls.handshake.extensions.supported_version"],
                         capture_output=True, text=True, timeout=60, check=True).stdout
    return [line.split("\t") for line in out.splitlines()]


def _plaintext_http(pcap: Path) -> int:
    out = subprocess.run(["tshark", "-r", str(pcap), "-n", "-Y", 'tcp.port == 5000 && tcp.payload contains "HTTP/1.1"',
                          "-T", "fields", "-e", "frame.number"], capture_output=True, text=True, timeout=60,
                         check=True).stdout
    return len(out.split())


def test_healthy_is_200_at_both_hops_over_istio_mtls_on_eth0(mesh_lab, tmp_path):
    """The first round on this pod: the caller dials the pod's sidecar anew, and the pod's eth0 shows the
    ClientHello with Istio's SNI and ALPN, TLS 1.3 chosen, and no plaintext HTTP."""
    pod = mesh_lab.pod("healthy-http")
    eth0 = tmp_path / "eth0.pcap"
    with capturing({eth0: Interface(pod.netns, "eth0")}):
        result, hops = _round(mesh_lab, "healthy-http")
        callers, server = hops.wait(len(result.statuses), len(result.statuses))
    assert set(result.statuses) == {200} and result.errors == (), result
    assert len(callers) == len(server) == len(result.statuses)
    for caller in callers:
        (hop,) = _joined(caller, server)
        assert _short(caller) == _short(hop) == "200 - via_upstream", (caller.raw, hop.raw)
        assert hop.requested_server_name == _sni(mesh_lab, "healthy-http")
    hellos = _tls_hellos(eth0)
    client_hellos = [h for h in hellos if h[0] == "1"]
    assert client_hellos, hellos
    for _, sni, alpn, versions in client_hellos:
        assert sni == _sni(mesh_lab, "healthy-http")
        assert alpn == "istio-http/1.1,istio,http/1.1"
        assert "0x0304" in versions.split(",")
    assert {h[3] for h in hellos if h[0] == "2"} == {"0x0304"}  # the server chose TLS 1.3
    assert _plaintext_http(eth0) == 0
    print(f"{len(client_hellos)} ClientHello(s) on eth0:", client_hellos[0], "\ncaller:", callers[0].raw)


def test_the_recorder_keeps_both_hops_with_their_captures(mesh_lab, tmp_path):
    """meshdoctor_lab.evidence in caller mode: each hop's debug log, stats, clusters and tcpdump of lo and eth0."""
    sizes = evidence.record_scenario(mesh_lab, "refused", tmp_path)
    for side in ("caller", "server"):
        for name in ("istio-proxy.log", "stats-before.txt", "stats-after.txt", "clusters.txt", "lo.pcap", "eth0.pcap"):
            assert sizes[f"{side}/{name}"] == (tmp_path / side / name).stat().st_size > 0, (side, name)
    caller_log = (tmp_path / "caller" / "istio-proxy.log").read_text()
    server_log = (tmp_path / "server" / "istio-proxy.log").read_text()
    assert "\tdebug\tenvoy router " in caller_log and "\tdebug\tenvoy router " in server_log
    (caller,) = parse_lines(caller_log)
    (server,) = parse_lines(server_log)
    assert caller.request_id == server.request_id and server.flags == ("UF",)
    assert "outbound|5000||refused." in (tmp_path / "caller" / "clusters.txt").read_text()
    # the pod's sidecar dials the app from 127.0.0.6 on lo and is refused: SYN, then RST
    flags = subprocess.run(["tshark", "-r", str(tmp_path / "server" / "lo.pcap"), "-n", "-T", "fields", "-e",
                            "ip.src", "-e", "tcp.dstport", "-e", "tcp.flags.str"], capture_output=True, text=True,
                           timeout=60, check=True).stdout.split("\n")
    assert any(line.startswith("127.0.0.6\t5000\t") and line.endswith("S·") for line in flags), flags
    assert any("R" in line.rsplit("\t", 1)[-1] for line in flags if line), flags
    # eth0 carries only TLS on port 5000; the admin port is not in any capture
    assert _plaintext_http(tmp_path / "server" / "eth0.pcap") == 0
    ports = subprocess.run(["tshark", "-r", str(tmp_path / "caller" / "lo.pcap"), "-n", "-T", "fields", "-e",
                            "tcp.port"], capture_output=True, text=True, timeout=60, check=True).stdout
    seen = set(ports.replace(",", " ").split())
    assert "15001" in seen and "15000" not in seen, seen


def test_a_tcp_port_is_a_tcp_proxy_over_istio_mtls_joined_by_its_four_tuple(mesh_lab, tmp_path):
    """healthy's TCP echo on 5002 goes through the caller's POD_IP_5002 listener (tcp_proxy) and cluster
    outbound|5002||HOST: one mTLS connection per client connection, ALPN istio-peer-exchange,istio. A TCP line
    has no request id: the caller's upstream four-tuple is the server's downstream one."""
    pod = mesh_lab.pod("healthy")
    eth0 = tmp_path / "eth0.pcap"
    with capturing({eth0: Interface(pod.netns, "eth0")}):
        result, hops = _round(mesh_lab, "healthy")
        total = result.http_ok + result.echo_ok
        callers, server = hops.wait(total, total)
    assert result.echo_ok >= 1 and result.http_ok >= 1 and result.errors == (), result
    tcp = [c for c in callers if c.upstream_cluster == f"outbound|5002||healthy.{mesh_lab.namespace}.svc.cluster.local"]
    assert len(tcp) == result.echo_ok, [c.raw for c in callers]
    for caller in tcp:
        assert caller.method is None and caller.request_id is None and caller.code == 0 and caller.flags == ()
        (hop,) = [s for s in server if s.downstream_remote == caller.upstream_local]
        assert hop.upstream_cluster == "inbound|5002||"
        assert hop.requested_server_name == f"outbound_.5002_._.healthy.{mesh_lab.namespace}.svc.cluster.local"
        assert (hop.bytes_received, hop.bytes_sent) == (caller.bytes_received, caller.bytes_sent)
    client_hellos = [h for h in _tls_hellos(eth0, 5002) if h[0] == "1"]
    assert len(client_hellos) == result.echo_ok, client_hellos
    assert {h[2] for h in client_hellos} == {"istio-peer-exchange,istio"}
    print("caller:", tcp[0].raw, "\nserver:", [s for s in server if s.downstream_remote == tcp[0].upstream_local][0].raw)


def test_a_pod_without_a_sidecar_is_called_in_plaintext(mesh_lab, tmp_path):
    """Auto mTLS: the endpoint of a pod without a sidecar carries no tlsMode label, so the caller's cluster takes
    its tlsMode-disabled match: plaintext HTTP on eth0, no ClientHello, and only the caller logs."""
    pod = mesh_lab.pod("no-sidecar")
    eth0 = tmp_path / "eth0.pcap"
    hops = Hops(mesh_lab, "no-sidecar")
    with capturing({eth0: Interface(pod.netns, "eth0")}):
        result = lab.trigger_round(mesh_lab, "no-sidecar")
        callers, _ = hops.wait(result.http_ok + result.echo_ok, 0)
    assert result.http_ok >= 1 and result.errors == (), result
    http = [c for c in callers if c.method == "GET"]
    assert len(http) == result.http_ok and {_short(c) for c in http} == {"200 - via_upstream"}
    assert {c.upstream_cluster for c in http} == {f"outbound|5000||no-sidecar.{mesh_lab.namespace}.svc.cluster.local"}
    assert [h for h in _tls_hellos(eth0) if h[0] == "1"] == []
    assert _plaintext_http(eth0) >= 2 * result.http_ok  # each request and its response


def test_the_pods_idle_close_is_uc_at_the_caller_and_nothing_at_the_pod(mesh_lab):
    """downstream-idle through a caller: the pod's sidecar (idle_timeout 0.5 s) drains the caller's pooled
    connection, then closes it reading nothing for delayed_close_timeout. The caller's second request, written on
    that connection in that second, is never read: the caller logs 503 UC when the close comes, the pod nothing."""
    result, hops = _round(mesh_lab, "downstream-idle")
    assert result.statuses == (200, 503) and result.reused_after_s >= CALLER_IDLE_REUSE_AFTER, result
    callers, server = hops.wait(2, 1)
    (first,) = _by_path(callers, "/idle")
    (late,) = _by_path(callers, "/idle/after-the-pod-closed")
    assert _short(late) == "503 UC upstream_reset_before_response_started{connection_termination}", late.raw
    assert late.upstream_local == first.upstream_local  # written on the pooled connection the pod was closing
    assert late.duration_ms <= ENVOY_DELAYED_CLOSE_TIMEOUT * 1000  # answered when the pod's delayed close ended
    assert _joined(late, server) == [] and [s.path for s in server] == ["/idle"], [s.raw for s in server]
    print("caller:", late.raw, "\nserver: nothing for", late.request_id)


def _caller_stat(state: LabState, pod: str, suffix: str) -> int:
    """A stat of the caller's outbound cluster of the pod's port 5000 (or, ``http.`` first, of its HCM)."""
    cluster = f"outbound|5000||{pod}.{state.namespace}.svc.cluster.local"
    name = suffix if suffix.startswith("http.") else f"cluster.{cluster};.{suffix}"
    return stat_sum(state.pod(pod).client_netns, "^" + name.replace(".", "\\.").replace("|", "\\|") + "$")


def test_overflow_is_uo_at_the_caller_and_never_reaches_the_pod(mesh_lab):
    """The DestinationRule's connectionPool (1 connection, 1 pending) is the caller's cluster's: the slow request
    holds the caller's one connection, the second queues at the caller, the third overflows there: 503 UO, no
    upstream host, nothing at the pod. The queued one reaches the pod only once the first has been answered."""
    overflowed = _caller_stat(mesh_lab, "overflow", "upstream_rq_pending_overflow")
    result, hops = _round(mesh_lab, "overflow")
    assert sorted(result.statuses) == [200, 200, 503] and result.errors == (), result
    callers, server = hops.wait(3, 2)
    (uo,) = _by_path(callers, "/overflow")
    assert _short(uo) == "503 UO upstream_reset_before_response_started{overflow}", uo.raw
    assert uo.upstream_host is None and uo.upstream_local is None and uo.route_name == "default"
    assert _joined(uo, server) == []
    held, queued = sorted(_by_path(callers, "/slow/1.0"), key=lambda e: e.duration_ms)
    hops_of = [_joined(c, server) for c in (held, queued)]
    assert [[_short(h) for h in hop] for hop in hops_of] == [["200 - via_upstream"]] * 2, server
    assert held.upstream_local == queued.upstream_local  # maxConnections 1: one mTLS connection
    (held_hop,), (queued_hop,) = hops_of
    assert queued_hop.ts * 1000 >= held_hop.ts * 1000 + held_hop.duration_ms - 5  # served after the first
    assert _caller_stat(mesh_lab, "overflow", "upstream_rq_pending_overflow") == overflowed + 1
    print("caller:", uo.raw, "\nserver: nothing for", uo.request_id)


def test_outlier_ejection_is_uh_at_the_caller_and_nothing_at_the_pod(mesh_lab):
    """outlierDetection is the caller's cluster's: the app's five 500s pass both hops as `500 - via_upstream`,
    the caller ejects its only endpoint (/clusters: failed_outlier_check) and answers the next requests itself,
    503 UH; the pod's sidecar has no outlier detection and sees none of them."""
    result, hops = _round(mesh_lab, "outlier")
    flags = host_flags(mesh_lab.pod("outlier").client_netns, "outbound|5000||")
    assert result.statuses == (500,) * OUTLIER_CONSECUTIVE_5XX + (503,) * OUTLIER_AFTER, result
    assert flags == ["/failed_outlier_check"], flags
    assert host_flags(mesh_lab.pod("outlier").netns, "inbound|5000||") == ["healthy"]
    callers, server = hops.wait(OUTLIER_CONSECUTIVE_5XX + OUTLIER_AFTER, OUTLIER_CONSECUTIVE_5XX)
    for caller in _by_path(callers, "/status/500"):
        (hop,) = _joined(caller, server)
        assert _short(caller) == _short(hop) == "500 - via_upstream", (caller.raw, hop.raw)
    ejected = [c for c in callers if (c.path or "").startswith("/after-burst/")]
    assert len(ejected) == OUTLIER_AFTER
    for caller in ejected:
        assert _short(caller) == "503 UH no_healthy_upstream" and caller.upstream_host is None, caller.raw
        assert _joined(caller, server) == []
    assert _caller_stat(mesh_lab, "outlier", "outlier_detection.ejections_enforced_consecutive_5xx") >= 1
    print("caller:", ejected[0].raw, "\nserver: nothing for", ejected[0].request_id)


def test_a_path_outside_the_virtualservice_is_nr_at_the_caller(mesh_lab):
    """The VirtualService's /v1 match is the caller's route: /other matches the service's virtual host but no
    route, so the caller answers 404 NR itself (no route name, no cluster); the pod sees only /v1/ok."""
    no_route = _caller_stat(mesh_lab, "no-route", "http.outbound_0.0.0.0_5000;.no_route")
    result, hops = _round(mesh_lab, "no-route")
    assert result.statuses == (200, 404), result
    callers, server = hops.wait(2, 1)
    (nr,) = _by_path(callers, "/other")
    assert _short(nr) == "404 NR route_not_found", nr.raw
    assert nr.route_name is None and nr.upstream_cluster is None and _joined(nr, server) == []
    (ok,) = _by_path(callers, "/v1/ok")
    (hop,) = _joined(ok, server)
    assert _short(ok) == _short(hop) == "200 - via_upstream" and hop.route_name == "default"
    assert ok.route_name is None  # the VirtualService's http route has no name
    assert [s.path for s in server] == ["/v1/ok"]
    assert _caller_stat(mesh_lab, "no-route", "http.outbound_0.0.0.0_5000;.no_route") == no_route + 1
    print("caller:", nr.raw, "\nserver: nothing for", nr.request_id)


def test_a_plaintext_caller_sidecar_at_a_strict_pod_is_uc_at_the_caller_and_nr_at_the_pod(mesh_lab):
    """mtls-strict through a caller whose DestinationRule says tls DISABLE: its plaintext connection finds no
    filter chain at the STRICT pod, which closes it: the pod's listener logs `0 NR filter_chain_not_found` (no
    request id: joined by the four-tuple), the caller `503 UC` for the request it had written, not retried."""
    result, hops = _round(mesh_lab, "mtls-strict")
    assert result.statuses == (503,), result
    (caller,), server = hops.wait(1, 1)
    assert _short(caller) == "503 UC upstream_reset_before_response_started{connection_termination}", caller.raw
    (hop,) = [s for s in server if s.downstream_remote == caller.upstream_local]
    assert _short(hop) == "0 NR filter_chain_not_found" and hop.method is None and hop.request_id is None, hop.raw
    assert hop.requested_server_name is None and len(server) == 1
    print("caller:", caller.raw, "\nserver:", hop.raw)


def test_the_callers_mtls_to_a_pod_without_a_sidecar_is_a_tls_error_at_the_caller(mesh_lab, tmp_path):
    """tls-to-plaintext through a caller: the pod opts out of injection and the caller's DestinationRule says
    ISTIO_MUTUAL, so its ClientHello reaches the app, whose plaintext 400 BoringSSL reads as a bad record:
    WRONG_VERSION_NUMBER. That is a connect failure, which Istio's default policy retries twice (three ClientHellos
    on eth0, each answered in plaintext): `503 URX,UF`, and no sidecar at the pod to log anything."""
    pod = mesh_lab.pod("tls-to-plaintext")
    eth0 = tmp_path / "eth0.pcap"
    with capturing({eth0: Interface(pod.netns, "eth0")}):
        result, hops = _round(mesh_lab, "tls-to-plaintext")
        (caller,), server = hops.wait(1, 0)
    assert result.statuses == (503,), result
    assert caller.flags == ("URX", "UF") and caller.details is not None, caller.raw
    assert caller.details.startswith("upstream_reset_before_response_started{remote_connection_failure|TLS_error:")
    assert "WRONG_VERSION_NUMBER" in (caller.upstream_failure or ""), caller.raw
    assert caller.upstream_local is None and server == []
    hellos = [h for h in _tls_hellos(eth0) if h[0] == "1"]
    assert len(hellos) == 3 and {h[1] for h in hellos} == {_sni(mesh_lab, "tls-to-plaintext")}, hellos
    assert _plaintext_http(eth0) >= 3  # the app's 400 to each
    print("caller:", caller.raw, "\nserver: no sidecar;", len(hellos), "ClientHellos answered in plaintext")


def test_source_ports_run_out_at_the_pod_and_the_caller_relays_its_503s(mesh_lab):
    """port-exhaustion through a caller: the pod's sidecar dials the app from 127.0.0.6 out of a 4-port range, one
    connection a request (maxRequestsPerConnection 1), until connect() fails with EADDRNOTAVAIL: `503 UF` there,
    which the caller relays as `503 - via_upstream` (Istio >= 1.24 does not retry it)."""
    result, hops = _round(mesh_lab, "port-exhaustion")
    failed = [i for i, status in enumerate(result.statuses) if status == 503]
    assert failed and set(result.statuses) == {200, 503}, result
    callers, server = hops.wait(len(result.statuses), len(result.statuses))
    ip = mesh_lab.pod("port-exhaustion").pod_ip
    for i in failed:
        (caller,) = _by_path(callers, f"/exhaust/{i}")
        assert _short(caller) == "503 - via_upstream", caller.raw
        (hop,) = _joined(caller, server)
        assert _short(hop) == ("503 UF upstream_reset_before_response_started{remote_connection_failure|"
                               f"immediate_connect_error:_Cannot_assign_requested_address|remote_address:{ip}:5000}}"
                               ), hop.raw
    print("caller:", _by_path(callers, f"/exhaust/{failed[0]}")[0].raw, "\nserver:",
          _joined(_by_path(callers, f"/exhaust/{failed[0]}")[0], server)[0].raw)

