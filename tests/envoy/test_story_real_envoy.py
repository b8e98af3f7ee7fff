"""Stories (envoy/story.py) of what real Envoy logs when streams share connections, and when the router retries:
HTTP/2 upstream connections carrying several streams, an HTTP/2 downstream connection whose streams each take
an HTTP/1 upstream connection of their own, a retried reset, a log whose streams never end (the http logger left
at info). Envoy (the pinned wheel) runs on loopback at debug; the apps are ours, on loopback too; every process a
test starts it ends, by its handle."""

from __future__ import annotations

import http.client
import re
import socket
import struct
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from kubectl_meshdoctor.envoy import story
from kubectl_meshdoctor.envoy.component_facts import fact_of
from kubectl_meshdoctor.envoy.component_log import read_component_log
from kubectl_meshdoctor.envoy.story import StoryBuilder, StreamStory, log_ref
from meshdoctor_lab.bootstrap import file_access_log

from ..helpers import analyze_json
from ..local_envoy import envoy_process, free_port
from ..waiting import wait_until

_T = "type.googleapis.com/"
DATA = Path(__file__).resolve().parent.parent / "data" / "envoy-1.40"
ROUND_S = 30.0  # deadline for a round's access-log lines


def stories_of(path: Path) -> list[StreamStory]:
    builder, told = StoryBuilder(str(path)), []
    with path.open(errors="replace") as fh:
        for n, line in read_component_log(fh):
            fact = fact_of(line)
            if fact is not None:
                told += builder.add(fact, log_ref(str(path), n, line, fact.kind))
    return told + builder.finish()


def hcm(stat: str, routes: list, *, filters: list = (), access_log: bool = True) -> dict:
    config = {"@type": _T + "envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
              "stat_prefix": stat, "route_config": {"name": stat, "virtual_hosts": [
                  {"name": stat, "domains": ["*"], "routes": routes}]},
              "http_filters": [*filters, {"name": "envoy.filters.http.router", "typed_config": {
                  "@type": _T + "envoy.extensions.filters.http.router.v3.Router"}}]}
    if access_log:
        config["access_log"] = [file_access_log("TEXT", "/dev/stdout")]
    return {"name": "envoy.filters.network.http_connection_manager", "typed_config": config}


def listener(name: str, port: int, network_filter: dict) -> dict:
    return {"name": name, "address": {"socket_address": {"address": "127.0.0.1", "port_value": port}},
            "filter_chains": [{"filters": [network_filter]}]}


def cluster(name: str, port: int, *, h2: bool = False) -> dict:
    c = {"name": name, "type": "STATIC", "connect_timeout": "5s",
         "load_assignment": {"cluster_name": name, "endpoints": [{"lb_endpoints": [{"endpoint": {
             "address": {"socket_address": {"address": "127.0.0.1", "port_value": port}}}}]}]}}
    if h2:
        c["typed_extension_protocol_options"] = {"envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
            "@type": _T + "envoy.extensions.upstreams.http.v3.HttpProtocolOptions",
            "explicit_http_config": {"http2_protocol_options": {}}}}
    return c


def get(port: int, path: str, headers: dict[str, str] | None = None) -> int:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=ROUND_S)
    try:
        conn.request("GET", path, headers=headers or {})
        resp = conn.getresponse()
        resp.read()
        return resp.status
    finally:
        conn.close()


def access_lines(log: Path) -> list[str]:
    return [ln for ln in log.read_text(errors="replace").splitlines() if ln.startswith("[20")]


@contextmanager
def app(answer) -> Iterator[int]:
    """An HTTP/1.1 app on loopback: ``answer(path, headers, sock)`` returns True to answer 200, False when it has
    aborted the connection itself. Ends its threads' sockets on exit."""
    srv = socket.create_server(("127.0.0.1", 0))
    done = threading.Event()

    def serve(sock: socket.socket) -> None:
        buf = b""
        with sock:
            while not done.is_set():
                data = sock.recv(65536)
                if not data:
                    return
                buf += data
                while b"\r\n\r\n" in buf:
                    head, buf = buf.split(b"\r\n\r\n", 1)
                    lines = head.decode("latin-1").split("\r\n")
                    headers = {k.strip().lower(): v.strip() for k, _, v in (ln.partition(":") for ln in lines[1:])}
                    if not answer(lines[0].split()[1], headers, sock):
                        return
                    sock.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\nok\n")

    def accept() -> None:
        while not done.is_set():
            try:
                sock, _ = srv.accept()
            except OSError:
                return
            threading.Thread(target=serve, args=(sock,), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    try:
        yield srv.getsockname()[1]
    finally:
        done.set()
        srv.close()


def abort(sock: socket.socket) -> bool:
    """Close with SO_LINGER 0: an RST, as a crashing app's kernel sends for it."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.close()
    return False


def test_a_crash_under_multiplexed_streams_is_each_streams_and_no_keepalive_race(tmp_path):
    """Eight requests in flight on one HTTP/2 upstream connection; the upstream Envoy dies (SIGKILL, ours): each
    stream's story holds the close, with the seven others in flight beside it. A busy connection closed is no
    idle one reused: no stale-keepalive; each 503 UC is still a finding."""
    fault = {"name": "envoy.filters.http.fault", "typed_config": {
        "@type": _T + "envoy.extensions.filters.http.fault.v3.HTTPFault",
        "delay": {"fixed_delay": "60s", "percentage": {"numerator": 100}},
        "headers": [{"name": "x-hold", "present_match": True}]}}
    up_port, caller_port = free_port(), free_port()
    answer = [{"match": {"prefix": "/"}, "direct_response": {"status": 200, "body": {"inline_string": "ok\n"}}}]
    upstream_boot = {"static_resources": {"listeners": [
        listener("up", up_port, hcm("up", answer, filters=[fault], access_log=False))]}}
    name = "outbound|8080||grpc.default.svc.cluster.local"
    caller_boot = {"static_resources": {
        "listeners": [listener("0.0.0.0_8080", caller_port,
                               hcm("outbound_0.0.0.0_8080", [{"match": {"prefix": "/"}, "route": {"cluster": name}}]))],
        "clusters": [cluster(name, up_port, h2=True)]}}
    with envoy_process(tmp_path, "upstream", upstream_boot, "warning") as upstream, \
            envoy_process(tmp_path, "caller", caller_boot) as caller:
        assert get(caller_port, "/warm") == 200
        codes: list[int] = []
        clients = [threading.Thread(target=lambda i=i: codes.append(get(caller_port, f"/held/{i}", {"x-hold": "1"})))
                   for i in range(8)]
        for c in clients:
            c.start()
        wait_until("8 requests held upstream", ROUND_S, lambda: upstream.stat("http.up.downstream_rq_active") == 8)
        upstream.proc.kill()
        for c in clients:
            c.join(ROUND_S)
        assert codes == [503] * 8
        wait_until("9 access-log lines", ROUND_S, lambda: len(access_lines(caller.log)) == 9)
    failed = [s for s in stories_of(caller.log) if s.failed]
    assert len(failed) == 8 and len({s.upstream_connection for s in failed}) == 1
    assert all(s.upstream_closed and s.upstream_shared == 7 and s.flags == ("UC",) for s in failed), failed
    code, report = analyze_json(caller.log)
    assert code == 1
    assert len(report["findings"]) == 8, report["findings"]
    assert all(f["detector"] == "access-log" and f["envoy_flags"] == ["UC"] for f in report["findings"])


def test_streams_of_one_http2_downstream_connection_keep_their_own_upstream(tmp_path):
    """An edge Envoy multiplexes three requests onto one HTTP/2 connection to the sidecar under test, whose app
    speaks HTTP/1: each stream takes an upstream connection of its own. The app aborts the one for /die after
    all three are in: only that stream's story holds the close."""
    arrived, all_in = [], threading.Event()

    def answer(path: str, headers: dict, sock: socket.socket) -> bool:
        if path == "/warm":
            return True
        arrived.append(path)
        if len(arrived) == 3:
            all_in.set()
        all_in.wait(ROUND_S)
        return abort(sock) if path == "/die" else True

    sidecar_port, edge_port = free_port(), free_port()
    with app(answer) as app_port:
        sidecar_boot = {"static_resources": {
            "listeners": [listener("virtualInbound", sidecar_port, hcm(
                "inbound_0.0.0.0_5000", [{"match": {"prefix": "/"}, "route": {"cluster": "inbound|5000||"}}]))],
            "clusters": [cluster("inbound|5000||", app_port)]}}
        edge_boot = {"static_resources": {
            "listeners": [listener("edge", edge_port, hcm(
                "edge", [{"match": {"prefix": "/"}, "route": {"cluster": "sidecar"}}], access_log=False))],
            "clusters": [cluster("sidecar", sidecar_port, h2=True)]}}
        with envoy_process(tmp_path, "sidecar", sidecar_boot) as sidecar, \
                envoy_process(tmp_path, "edge", edge_boot, "warning"):
            assert get(edge_port, "/warm") == 200  # the edge's one HTTP/2 connection, open before the three
            codes: dict[str, int] = {}
            clients = [threading.Thread(target=lambda p=p: codes.__setitem__(p, get(edge_port, p)))
                       for p in ("/die", "/slow/a", "/slow/b")]
            for c in clients:
                c.start()
            for c in clients:
                c.join(ROUND_S)
            assert codes == {"/die": 503, "/slow/a": 200, "/slow/b": 200}
            wait_until("4 access-log lines", ROUND_S, lambda: len(access_lines(sidecar.log)) == 4)
    told = {s.path: s for s in stories_of(sidecar.log)}
    three = [told["/die"], told["/slow/a"], told["/slow/b"]]
    assert len({s.connection for s in three}) == 1, "one HTTP/2 downstream connection"
    assert len({s.upstream_connection for s in three}) == 3, three
    assert told["/die"].failed and told["/die"].upstream_closed and told["/die"].upstream_shared == 0
    assert not told["/slow/a"].upstream_closed and not told["/slow/b"].upstream_closed
    assert not told["/slow/a"].failed and not told["/slow/b"].failed


def test_a_retried_reset_is_told_as_envoy_logs_it(tmp_path):
    """The app resets each request the first time it sees its x-request-id; the route retries on reset. Envoy
    answers 200 and logs it without a flag: the story says 200, not failed, with the reset it retried."""
    seen: set[str] = set()

    def answer(path: str, headers: dict, sock: socket.socket) -> bool:
        rid = headers.get("x-request-id", "")
        if rid in seen:
            return True
        seen.add(rid)
        return abort(sock)

    port = free_port()
    name = "outbound|5000||app.default.svc.cluster.local"
    route = {"cluster": name, "retry_policy": {"retry_on": "reset", "num_retries": 2}}
    with app(answer) as app_port:
        boot = {"static_resources": {
            "listeners": [listener("0.0.0.0_5000", port, hcm(
                "outbound_0.0.0.0_5000", [{"match": {"prefix": "/"}, "route": route}]))],
            "clusters": [cluster(name, app_port)]}}
        with envoy_process(tmp_path, "caller", boot) as caller:
            assert [get(port, f"/r/{i}") for i in range(3)] == [200] * 3
            wait_until("3 access-log lines", ROUND_S, lambda: len(access_lines(caller.log)) == 3)
    lines = access_lines(caller.log)
    assert all('" 200 - via_upstream ' in ln for ln in lines), lines
    told = [s for s in stories_of(caller.log) if s.path and s.path.startswith("/r/")]
    assert len(told) == 3
    assert all(s.status == 200 and not s.failed and s.retried == ("connection termination",) for s in told), told
    code, report = analyze_json(caller.log)
    assert (code, report["findings"]) == (0, [])


def test_retries_spent_are_told_as_envoy_logs_them(tmp_path):
    """The app resets every request; the route retries twice on reset: Envoy answers 503 URX,UC. The story of
    the debug log alone says the same flags (URX was lost before), with the two resets it retried."""
    port = free_port()
    name = "outbound|5000||app.default.svc.cluster.local"
    route = {"cluster": name, "retry_policy": {"retry_on": "reset", "num_retries": 2}}
    with app(lambda path, headers, sock: abort(sock)) as app_port:
        boot = {"static_resources": {
            "listeners": [listener("0.0.0.0_5000", port, hcm(
                "outbound_0.0.0.0_5000", [{"match": {"prefix": "/"}, "route": route}]))],
            "clusters": [cluster(name, app_port)]}}
        with envoy_process(tmp_path, "caller", boot) as caller:
            assert get(port, "/spent") == 503
            wait_until("1 access-log line", ROUND_S, lambda: len(access_lines(caller.log)) == 1)
    (line,) = access_lines(caller.log)
    assert '" 503 URX,UC upstream_reset_before_response_started{connection_termination}' in line, line
    (told,) = [s for s in stories_of(caller.log) if s.path == "/spent"]
    assert told.flags == ("URX", "UC") and told.failed and len(told.retried) == 2, told


def test_streams_that_never_end_in_the_log_are_told_not_dropped(tmp_path, monkeypatch):
    """With the http logger at info, no stream's end is logged: the stories wait for the window (MAX_OPEN) to
    let them go, and must then be told, failures included. The pool's 'destroying stream' still tells when the
    pooled connection went idle. Real lines: the lab's stale keep-alive round, its http lines taken out."""
    lines = [ln for ln in (DATA / "stale-keepalive" / "istio-proxy.log").read_text().splitlines()
             if not ln.startswith("[20") and "\tenvoy http " not in ln]
    # The round twice, the second as Envoy would number its connections 1000 later: the first race is let go
    # by the window when the second round's streams come.
    later = [re.sub(r'(\[C|"ConnectionId":")(\d+)', lambda m: f"{m.group(1)}{int(m.group(2)) + 1000}", ln)
             for ln in lines]
    log = tmp_path / "istio-proxy.log"
    log.write_text("\n".join(lines + later) + "\n")
    monkeypatch.setattr(story, "MAX_OPEN", 2)  # a round's two streams; the next round's let them go
    builder, told = StoryBuilder(str(log)), []
    with log.open() as fh:
        for n, line in read_component_log(fh):
            fact = fact_of(line)
            if fact is not None:
                told += builder.add(fact, log_ref(str(log), n, line, fact.kind))
    rest = builder.finish()
    assert len(rest) == 2  # the window let the first round go as the second came
    failed = [s for s in told + rest if s.failed]
    assert len(failed) == 2 and failed[0] in told, told
    for race in failed:
        assert race.upstream_reused and race.upstream_closed and race.upstream_idle_s and race.upstream_idle_s > 0
    code, report = analyze_json(log)
    assert code == 1 and [f["detector"] for f in report["findings"]] == ["stale-keepalive"] * 2


@pytest.mark.parametrize("count", [0, 3])
def test_destroying_stream_spellings(count):
    """Envoy >= 1.19 says 'N active remaining, ...'; older releases 'N remaining' (conn_pool_base.cc)."""
    from kubectl_meshdoctor.envoy.component_log import parse_component_line
    for text in (f"[C7] destroying stream: {count} active remaining, readyForStream true, currentUnusedCapacity 1",
                 f"[C7] destroying stream: {count} remaining"):
        line = parse_component_line(f"[2026-01-01 00:00:00.000][12][debug][pool] [source/x.cc:1] {text}")
        fact = fact_of(line)
        assert fact is not None and fact.kind == "pool-stream-done" and fact.count == count and fact.connection == 7


def test_a_tcp_proxy_session_refused_upstream_is_a_story(tmp_path):
    """tcp_proxy logs no router line: its session (the downstream connection) is the request, the connection
    the pool opens next on the worker its upstream. A refused connect is UF, as Envoy's access log says."""
    port = free_port()
    name = "outbound|9003||db.default.svc.cluster.local"
    tcp = {"name": "envoy.filters.network.tcp_proxy", "typed_config": {
        "@type": _T + "envoy.extensions.filters.network.tcp_proxy.v3.TcpProxy", "stat_prefix": name,
        "cluster": name, "access_log": [file_access_log("TEXT", "/dev/stdout")]}}
    boot = {"static_resources": {"listeners": [listener("0.0.0.0_9003", port, tcp)],
                                 "clusters": [cluster(name, free_port())]}}
    with envoy_process(tmp_path, "caller", boot) as caller:
        for _ in range(3):
            with socket.create_connection(("127.0.0.1", port), timeout=ROUND_S) as sock:
                sock.settimeout(ROUND_S)
                assert sock.recv(1) == b""  # Envoy closes the session: its upstream refused
        wait_until("3 access-log lines", ROUND_S, lambda: len(access_lines(caller.log)) == 3)
    assert all(" 0 UF,URX " in ln for ln in access_lines(caller.log)), access_lines(caller.log)
    told = [s for s in stories_of(caller.log) if s.tcp]
    assert len(told) == 3 and all(s.failed and s.errno == 111 and s.cluster == name and s.flags == ("UF",)
                                  for s in told), told
    debug_only = tmp_path / "debug-only.log"
    debug_only.write_text("".join(ln + "\n" for ln in caller.log.read_text().splitlines()
                                  if not ln.startswith("[20")))
    code, report = analyze_json(debug_only)
    assert code == 1 and [f["detector"] for f in report["findings"]] == ["upstream-refused"] * 3
