"""``server-first-protocol``: a server-first protocol (MySQL, SMTP, FTP, ...) on a port the callers' sidecars sniff
or take for HTTP: the sidecar waits for the client's first bytes, the client waits for the server's greeting, and
nothing happens until the client gives up.

Istio renders a Service port whose protocol is not declared (a name without a protocol prefix, no appProtocol) as
a sniffed outbound listener (pilot/pkg/networking/core listener.go, ListenerProtocolAuto: the ``http_inspector``
listener filter, an HCM chain matched on the application protocols ``http/1.1``/``h2c`` and a tcp_proxy default
chain), and a declared HTTP port on the wildcard listener with the same inspector (its HCM chain matched on those
protocols, a passthrough default). ``listener_filters_timeout`` is meshConfig.protocolDetectionTimeout, 0s (none)
since Istio 1.8 (commit 47a5927bdc7 "Disable protocol detection timeout by default"). Envoy's http_inspector
(source/extensions/filters/listener/http_inspector) peeks at the first bytes the client sends; until then no
filter chain is chosen, so no network filter runs and no upstream connection is made.

What real Envoy 1.40 does, measured in the lab (lab scenario ``server-first``: a server that writes a greeting on
accept, a client that waits 3 s for it, through a caller sidecar with istiod's sniffed listener):

- the caller's ``lo``: the client's SYN REDIRECTed to ``127.0.0.1:15001``, the sidecar's SYN-ACK (from the
  original destination, conntrack's reverse NAT), then no byte either way until the client's FIN after 3 s; the
  sidecar answers FIN within 2 ms. Nothing on the caller's ``eth0`` and nothing at the server's pod: the
  server's sidecar never sees a SYN, the server never accepts, its greeting is never written.
- counters: only the sniffed listener's ``listener.VIP_PORT.downstream_listener_filter_remote_close``, one per
  connection (Envoy's docs/root/configuration/listeners/stats.rst: "Total connections closed by remote when peek
  data for listener filters"). The listener's ``downstream_cx_total``, the HCM's ``downstream_cx_total`` and the
  cluster's ``upstream_cx_total`` do not move: a socket still in the listener filters is no connection of the
  listener yet (``downstream_pre_cx_active``: "Sockets currently undergoing listener filter processing"). No
  access-log line in either sidecar, so no response flag. With a protocolDetectionTimeout set, Envoy would count
  ``downstream_pre_cx_timeout`` and go on with the default (tcp_proxy) chain: not measured, not claimed here.

Istio's default stats inclusion list keeps no ``listener.*`` stat but ``downstream_cx_active``
(pkg/bootstrap/config.go): the counter needs ``proxyStatsMatcher.inclusionPrefixes: [listener]`` on the caller.

On packets the finding is a connection on ``lo`` to the outbound capture port that the client closed (FIN) at
least MIN_WAIT_S after the handshake with no byte sent by either side: the client waited for the server to speak
first. The FIN's sequence and acknowledgment numbers tell that no byte passed (the SYN's and SYN-ACK's plus one),
so the data segments a live watch leaves out on ``lo`` (its lean BPF) are not needed. A client that opens a
connection and never uses it (a pool's spare) looks the same; the explanation says so, and the counter at the
caller tells the sniffing listener.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace

from kubectl_meshdoctor.core.counters import CounterSignal, counter_findings
from kubectl_meshdoctor.core.detector import Detector, PendingSyns
from kubectl_meshdoctor.core.events import EnvoyCountersEvent, PacketEvent, endpoint
from kubectl_meshdoctor.core.findings import Evidence, Finding, FlowRef, Severity
from kubectl_meshdoctor.core.fixes import Fix
from kubectl_meshdoctor.core.flows import Flow
from kubectl_meshdoctor.core.remedies import tcp_service_port
from kubectl_meshdoctor.envoy.stats import split_listener_address_stat

# seconds the client must have waited, silent, before its FIN: a TCP health check or a port scan closes at once
MIN_WAIT_S = 1.0
REDIRECT_TARGETS = ("127.0.0.1", "::1")  # nf_nat_redirect's destination for locally generated packets
REMOTE_CLOSE = "downstream_listener_filter_remote_close"

COUNTERS = (
    CounterSignal("listener", REMOTE_CLOSE,
                  "connections the client closed while the listener filters (protocol sniffing) waited for its "
                  "first bytes"),
)


@dataclass(slots=True)
class _Waiting:
    """A REDIRECTed connection to the sidecar in which no byte has passed yet."""

    syn: PacketEvent
    syn_ack: PacketEvent | None = None


def fixes(port: int) -> tuple[Fix, ...]:
    """The fixes of a server-first protocol on ``port``: declare the Service's port TCP (core/remedies.py)."""
    return tcp_service_port(port)


class ServerFirstProtocol(Detector):
    id = "server-first-protocol"
    packet_ifaces = frozenset({"lo"})
    unseen_without = {"lo": "server-first apps"}
    unseen_rank = 40
    envoy_counters = (f"listener.{REMOTE_CLOSE}",)

    def __init__(self, ctx) -> None:
        super().__init__(ctx)
        # keyed by the client's end: the sidecar's packets carry the original destination, not 127.0.0.1:15001.
        # A server-first client may wait long (MySQL's connect_timeout is 10 s): an hour bounds it.
        self._waiting = PendingSyns(ttl_s=3600.0)

    def on_packet(self, ev: PacketEvent, flow: Flow) -> Iterable[Finding]:
        if ev.iface != "lo":
            return ()  # the app's connection to its sidecar exists only on the pod's loopback
        if ev.is_syn:
            if ev.dport == self.ctx.redirect_map.outbound_port and ev.dst in REDIRECT_TARGETS:
                self._waiting.add((ev.iface, ev.src, ev.sport), _Waiting(ev))
            return ()
        from_client = self._waiting.get((ev.iface, ev.src, ev.sport))
        if from_client is not None and (ev.dst, ev.dport) == (from_client.syn.dst, from_client.syn.dport):
            return self._from_client(from_client, ev)
        to_client = self._waiting.get((ev.iface, ev.dst, ev.dport))
        if to_client is not None:
            self._from_sidecar(to_client, ev)
        return ()

    def _from_client(self, conn: _Waiting, ev: PacketEvent) -> Iterable[Finding]:
        key = (ev.iface, ev.src, ev.sport)
        if ev.payload_len or ev.is_rst:
            self._waiting.pop(key)  # the client spoke first (or reset): not a client waiting for a greeting
            return ()
        if not ev.is_fin:
            return ()  # the handshake's ACK, keep-alive probes
        self._waiting.pop(key)
        syn_ack = conn.syn_ack
        if syn_ack is None or ev.ts - syn_ack.ts < MIN_WAIT_S:
            return ()
        # The FIN's sequence number is the client's first byte's, its ACK the sidecar's: no byte either way
        # (RFC 9293 section 3.4), even when the capture left the data segments out (watch's lean BPF on lo).
        if ev.seq != (conn.syn.seq + 1) % 2**32 or ev.ack != (syn_ack.seq + 1) % 2**32:
            return ()
        return (self._finding(conn, syn_ack, ev),)

    def _from_sidecar(self, conn: _Waiting, ev: PacketEvent) -> None:
        key = (ev.iface, ev.dst, ev.dport)
        if ev.is_syn_ack and conn.syn_ack is None:
            if (ev.src, ev.sport) == (conn.syn.dst, conn.syn.dport):
                self._waiting.pop(key)  # 127.0.0.1:15001 dialled directly: no original destination
            else:
                conn.syn_ack = ev
        elif ev.payload_len or ev.is_fin or ev.is_rst:
            self._waiting.pop(key)  # the server's first bytes were relayed, or the sidecar closed first

    def _finding(self, conn: _Waiting, syn_ack: PacketEvent, fin: PacketEvent) -> Finding:
        syn = conn.syn
        dest = endpoint(syn_ack.src, syn_ack.sport)
        waited = fin.ts - syn_ack.ts
        return Finding(
            detector=self.id, severity=Severity.ERROR, flow=FlowRef(syn.src_endpoint, dest, syn.iface),
            title=f"The app's connection to {dest} carried no byte for {waited:.1f} s and the app closed it: its "
                  f"sidecar waited for the client to speak first (protocol sniffing) and never dialled {dest}",
            variant="the client waited for the server's greeting",
            evidence=(Evidence.of(syn, f"SYN from the app to {dest}, REDIRECTed to its sidecar at "
                                       f"{syn.dst_endpoint}"),
                      Evidence.of(syn_ack, f"SYN-ACK from the sidecar (shown as {dest}): it accepted the "
                                           f"connection"),
                      Evidence.of(fin, f"FIN from the app after {waited:.1f} s without a byte either way")),
            explanation=(
                f"The app ({syn.src_endpoint}) connected to {dest}; istio-init's nat rules REDIRECTed it to its "
                f"sidecar, which accepted it at once. Then nothing: no byte from the app, none towards it, until "
                f"the app closed the connection {waited:.1f} s later. That is a server-first protocol (MySQL, "
                f"SMTP, FTP, ...: the server writes first, its client waits for the greeting) on a port the "
                f"sidecar sniffs or takes for HTTP: Istio gives a Service port without a declared protocol (a "
                f"name without a protocol prefix, no appProtocol), and a declared HTTP port, Envoy's "
                f"http_inspector, which waits for the client's first bytes before it picks a filter chain, with "
                f"no timeout (meshConfig.protocolDetectionTimeout 0s, Istio's default since 1.8). So the sidecar "
                f"never connected to {dest}: the server never accepted a connection and its greeting was never "
                f"written. Envoy logs no access-log line for it; the caller's sidecar counts it as "
                f"listener.<address>_{syn_ack.sport}.{REMOTE_CLOSE} (a listener stat: Istio's default stats "
                f"inclusion list drops it). A client that opens a connection and never uses it, or a server that "
                f"never greets on a port declared TCP, looks the same on the wire; that counter at the caller "
                f"(it moves only where the sidecar sniffed), or the port's protocol in its Service, tells them "
                f"apart."),
            fixes=fixes(syn_ack.sport),  # no envoy_flags: Envoy logs no line for it
            pod=self.ctx.pod,
            ts=fin.ts,
            details={"original_destination": dest, "redirected_to": syn.dst_endpoint,
                     "waited_s": round(waited, 3)},
        )

    def from_counters(self, counters: EnvoyCountersEvent) -> Iterable[Finding]:
        # Outbound listeners only: virtualInbound's TLS inspector counts every TCP probe (the kubelet's
        # tcpSocket) that connects and closes without a byte; that is no caller's failure.
        inbound = f"_{self.ctx.redirect_map.listener_port}"
        kept = {name: n for name, n in counters.stats.items()
                if not ((split := split_listener_address_stat(name)) and split[0].endswith(inbound))}
        found = counter_findings(
            self.id, replace(counters, stats=kept), COUNTERS,
            what="Server-first protocol on a sniffed port: clients closed while the sidecar waited for their "
                 "first bytes",
            explanation=("Clients connected through this sidecar to a port it sniffs (http_inspector: a port "
                         "without a declared protocol, or a declared HTTP one) and closed the connection before "
                         "they sent a byte: the sidecar waited for them to speak first and never dialled the "
                         "server. A server-first protocol (MySQL, SMTP, ...) does exactly this: its client waits "
                         "for the server's greeting. Nothing is logged for it, and no response flag; a client that "
                         "connects and closes unused counts here too."),
            pod=self.ctx.pod)
        return [replace(f, fixes=fixes(port)) if (port := _port(f.flow.server)) else f for f in found]


def _port(listener: str) -> int | None:
    """The port of a listener address as its stats name it (``198.18.1.2_5002`` -> 5002), or None."""
    tail = listener.rpartition("_")[2]
    return int(tail) if tail.isdigit() else None
