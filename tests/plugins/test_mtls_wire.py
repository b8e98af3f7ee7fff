"""mTLS on eth0 read, not skipped (issue 31), on real Envoy 1.40 recordings (tests/data/envoy-1.40-mesh): the
ClientHello's SNI and ALPN name the service and port in the evidence; the server sidecar's idle close of an mTLS
connection (close_notify, then RST with the caller's request unread) is the downstream stale keep-alive; a
ClientHello answered in plaintext is the TLS-to-plaintext mismatch; the ladder labels those frames."""

from __future__ import annotations

import asyncio
import subprocess
from dataclasses import replace
from pathlib import Path

from kubectl_meshdoctor.core.mtls import istio_sni
from kubectl_meshdoctor.frontends.ladder import render_ladder
from kubectl_meshdoctor.sources import tshark

from ..helpers import A, F, P, R, S, Wire, analyze_json, run

MESH = Path(__file__).resolve().parent.parent / "data" / "envoy-1.40-mesh"
IDLE = MESH / "downstream-idle"
SNI = "outbound_.5000_._.downstream-idle.mesh31ev.svc.cluster.local"
CALLER, POD = "198.18.1.1:36474", "198.18.1.2:5000"


def _events(path: Path) -> list:
    events: list = []
    asyncio.run(tshark.read_file(str(path), path.name, "eth0", events.append))
    return events


def _hello_bytes() -> bytes:
    out = subprocess.run(["tshark", "-r", str(IDLE / "server" / "eth0.pcap"), "-n", "-Y", "frame.number == 4",
                          "-T", "fields", "-e", "tcp.payload"], capture_output=True, text=True, check=True).stdout
    return bytes.fromhex(out.strip().replace(":", ""))


def test_istio_s_sni_names_the_service_port_and_subset():
    sni = istio_sni(SNI)
    assert sni is not None and (sni.port, sni.subset, sni.host) == (5000, "", "downstream-idle.mesh31ev.svc.cluster.local")
    assert istio_sni("outbound_.9080_.v1_.reviews.shop.svc.cluster.local").subset == "v1"
    assert istio_sni("reviews.shop.svc.cluster.local") is None and istio_sni(None) is None


def test_the_server_sidecar_s_idle_close_of_an_mtls_connection_is_found_on_its_eth0():
    for side in ("server", "caller"):  # the two ends of one veth: the same frames
        (f,) = run(_events(IDLE / side / "eth0.pcap"), only=["stale-keepalive"])
        assert (f.flow.client, f.flow.server, f.flow.iface) == (CALLER, POD, "eth0")
        assert f.envoy_flags == ("UC",) and f.variant == "caller reused a connection the sidecar closed"
        assert [e.frame for e in f.evidence] == [4, 6, 15, 16]
        hello, last, alert, rst = f.evidence
        assert hello.what.startswith(f"ClientHello SNI {SNI} ALPN istio-http/1.1,istio,http/1.1")
        assert "port 5000" in hello.what and hello.record == "ClientHello"
        assert last.record == "ServerHello" and "6.504 s" in last.what
        assert alert.record == "close_notify" and alert.payload_len == 24 and rst.flags == "R."
        assert "close_notify" in f.title and f.details["tls"] is True
        assert [x.name for x in f.fixes] == ["caller-idle-timeout"]


def test_the_ladder_labels_the_client_hello_and_the_close_notify():
    (f,) = run(_events(IDLE / "server" / "eth0.pcap"), only=["stale-keepalive"])
    text = "\n".join(render_ladder(f))
    assert "#4 ClientHello SNI outbound_.5000_." in text and "#15 close_notify" in text
    assert "#6 ServerHello" in text


def test_a_close_notify_without_a_reset_is_a_clean_close():
    events = [e for e in _events(IDLE / "server" / "eth0.pcap") if not e.is_rst]
    assert run(events, only=["stale-keepalive"]) == []


def test_a_caller_that_closed_first_did_not_reuse_the_connection():
    events = _events(IDLE / "server" / "eth0.pcap")
    alert = next(e for e in events if e.tls is not None and e.tls.is_encrypted_alert)
    # the caller's own close_notify, just before the server's: the caller was closing
    mine = replace(alert, ts=alert.ts - 0.0001, frame=14, src="198.18.1.1", sport=36474, dst="198.18.1.2", dport=5000)
    events.insert(events.index(alert), mine)
    assert run(events, only=["stale-keepalive"]) == []


def test_a_busy_connection_s_close_is_not_an_idle_close():
    events = _events(IDLE / "server" / "eth0.pcap")
    idle = next(e for e in events if e.tls is not None and e.tls.is_encrypted_alert).ts - 0.0015
    events = [replace(e, ts=e.ts - 6.5) if e.ts > idle else e for e in events]  # the close right after the hello
    assert run(events, only=["stale-keepalive"]) == []


def test_healthy_mtls_rounds_are_not_findings():
    for case in ("healthy-http", "healthy"):
        for side in ("caller", "server"):
            assert run(_events(MESH / case / side / "eth0.pcap"), only=["stale-keepalive", "tls-mismatch"]) == []


def test_the_caller_s_503_uc_on_that_four_tuple_joins_the_packets():
    _, report = analyze_json(IDLE / "caller")
    (f,) = [f for f in report["findings"] if f["detector"] == "stale-keepalive"]
    assert {e["kind"] for e in f["evidence"]} == {"packet"}
    assert [e.get("record") for e in f["evidence"]] == ["ClientHello", "ServerHello", "close_notify", None]
    assert len(f["access_log"]) == 1 and " 503 UC " in f["access_log"][0] and CALLER in f["access_log"][0]


def test_a_client_hello_answered_in_plaintext_is_mtls_to_a_plaintext_port():
    w = Wire(iface="eth0")
    w.handshake(CALLER, POD)
    hello = _hello_bytes()
    w.pkt(CALLER, POD, P | A, 1001, 5001, tls=hello)  # frame 4
    w.pkt(POD, CALLER, P | A, 5001, 1001 + len(hello), http=b"HTTP/1.1 400 Bad Request\r\nConnection: close\r\n\r\n")
    w.pkt(POD, CALLER, F | A, 5050, 1001 + len(hello))
    (f,) = run(w.events, only=["tls-mismatch"])
    assert f.details["kind"] == "tls-to-plaintext" and f.details["sni"] == SNI and f.envoy_flags == ("UF",)
    assert [e.frame for e in f.evidence] == [4, 5]
    assert f.evidence[0].what.startswith(f"ClientHello SNI {SNI} ALPN istio-http/1.1")
    assert "downstream-idle.mesh31ev.svc.cluster.local port 5000" in f.title
    assert [x.name for x in f.fixes] == ["tls-disable"]


def test_a_client_hello_answered_by_a_server_hello_or_a_reset_is_no_mismatch():
    hello = _hello_bytes()
    w = Wire(iface="eth0")
    w.handshake(CALLER, POD)
    w.pkt(CALLER, POD, P | A, 1001, 5001, tls=hello)
    w.pkt(POD, CALLER, R | A, 5001, 1001 + len(hello))
    assert run(w.events, only=["tls-mismatch"]) == []
    assert run(_events(IDLE / "server" / "eth0.pcap"), only=["tls-mismatch"]) == []


def test_a_plaintext_request_on_an_mtls_port_is_still_read_as_before():
    w = Wire(iface="eth0")
    w.handshake(CALLER, POD)
    w.pkt(CALLER, POD, P | A, 1001, 5001, http=b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
    w.pkt(POD, CALLER, R | A, 5001, 1030)
    (f,) = run(w.events, only=["tls-mismatch"])
    assert f.details["kind"] == "plaintext-to-mtls" and f.envoy_flags == ("NR",)


def test_a_reset_of_the_listener_s_queue_at_a_sidecar_s_exit_is_not_a_filter_chain_s():
    """The same packets as a STRICT port's, a plaintext request reset unread, come from a sidecar's exit resetting
    a connection still in its accept queue (real Envoy, tests/data/lab-shutdown-plain: frames 579 and 582). The
    port refusing the next SYN (frame 586, 0.1 s on) tells the listener went away: no tls-mismatch then."""
    assert run(_events(MESH.parent / "lab-shutdown-plain" / "healthy" / "eth0.pcap"), only=["tls-mismatch"]) == []
    w = Wire(iface="eth0")
    w.handshake(CALLER, POD)
    w.pkt(CALLER, POD, P | A, 1001, 5001, http=b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
    w.pkt(POD, CALLER, R | A, 5001, 1030)
    later = "198.18.1.1:36480"
    w.pkt(later, POD, S, 7000, dt=4.0)  # refused within HOLD_S: the listener is gone
    w.pkt(POD, later, R | A, 0, 7001)
    assert run(w.events, only=["tls-mismatch"]) == []
    held = Wire(iface="eth0")
    held.handshake(CALLER, POD)
    held.pkt(CALLER, POD, P | A, 1001, 5001, http=b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
    held.pkt(POD, CALLER, R | A, 5001, 1030)
    held.pkt(later, POD, S, 7000, dt=6.0)  # refused after the hold: the finding stands
    held.pkt(POD, later, R | A, 0, 7001)
    (f,) = run(held.events, only=["tls-mismatch"])
    assert f.details["kind"] == "plaintext-to-mtls"


LOADED = MESH.parent / "envoy-1.40-mesh-loaded" / "downstream-idle" / "server" / "eth0.pcap"


def test_a_close_the_caller_answered_before_the_reset_is_not_told_from_a_clean_one_by_the_server_alone():
    """The loaded round (tests/data/envoy-1.40-mesh-loaded): what the prefilter keeps of it is a close_notify, the
    caller's answer and a reset, as a clean idle close shows; only the ACK it drops showed the request. The
    server's capture alone names nothing, where the unloaded round's names the race."""
    kept = _events(LOADED)
    assert {e.frame for e in kept} >= {4, 6, 11, 12, 14, 15} and 10 not in {e.frame for e in kept}
    assert run(kept, only=["stale-keepalive"]) == []
